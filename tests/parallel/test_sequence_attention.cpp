// Ring, Ulysses and hybrid attention against whole-sequence attention: on
// sp = 2, 3, 4 and 8 rank threads, in the zigzag and contiguous layouts,
// causal and not, each rank's output and its q, k, v gradients at its positions
// equal the single rank's (kernels/host/attention.hpp for causal, the block
// kernel over the whole sequence for non-causal), also with bf16 products
// (their bf16 forms); and the one-line errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/attention.hpp>
#include <loom/kernels/host/attention_bf16.hpp>
#include <loom/kernels/host/attention_blocks.hpp>
#include <loom/kernels/host/attention_blocks_bf16.hpp>
#include <loom/kernels/matmul_precision.hpp>
#include <loom/nn/ring_attention.hpp>
#include <loom/nn/ulysses_attention.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace nn = loom::nn;
using loom::Tensor;
using loom::comm::ThreadComm;
using loom::kernels::MatmulPrecision;

namespace {

struct Whole {
    std::vector<float> qkv, dout, out, dqkv;
};

// The single-rank reference for B sequences of T tokens, H heads of D.
Whole whole_attention(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D, bool causal,
                      MatmulPrecision precision = MatmulPrecision::f32) {
    namespace host = loom::kernels::host;
    const bool bf16 = precision == MatmulPrecision::bf16;
    const std::int64_t C = H * D;
    Whole w;
    w.qkv.resize(static_cast<std::size_t>(B * T * 3 * C));
    w.dout.resize(static_cast<std::size_t>(B * T * C));
    loom::RngStream{21, 1}.fill_normal(w.qkv, 0);
    loom::RngStream{21, 2}.fill_normal(w.dout, 0);
    w.out.assign(w.dout.size(), 0.0f);
    w.dqkv.assign(w.qkv.size(), 0.0f);
    std::vector<float> lse(static_cast<std::size_t>(B * H * T));
    if (causal) {
        (bf16 ? host::attention_forward_bf16_inputs : host::attention_forward)(w.qkv.data(), w.out.data(), lse.data(),
                                                                                B, T, H, D);
        (bf16 ? host::attention_backward_bf16_inputs : host::attention_backward)(
            w.qkv.data(), w.out.data(), w.dout.data(), lse.data(), w.dqkv.data(), B, T, H, D);
    } else {
        using host::BlockMask;
        const float* q = w.qkv.data();
        (bf16 ? host::attention_block_forward_bf16_inputs : host::attention_block_forward)(
            q, 3 * C, q + C, q + 2 * C, 3 * C, w.out.data(), lse.data(), B, T, T, H, D, BlockMask::full);
        float* d = w.dqkv.data();
        (bf16 ? host::attention_block_backward_bf16_inputs : host::attention_block_backward)(
            q, 3 * C, q + C, q + 2 * C, 3 * C, w.out.data(), w.dout.data(), lse.data(), d, d + C, d + 2 * C, B, T, T, H,
            D, BlockMask::full);
    }
    return w;
}

// Rows of every sequence of `whole` ([B, T, width]) at the layout's positions.
std::vector<float> local_rows(const std::vector<float>& whole, std::int64_t B, std::int64_t T, std::int64_t width,
                              const nn::SequenceLayout& layout) {
    std::vector<float> out;
    const std::int64_t local = layout.local_tokens(T);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < local; ++t) {
            const auto* row = whole.data() + (b * T + layout.position(t, T)) * width;
            out.insert(out.end(), row, row + width);
        }
    return out;
}

// The largest |got - want| over max |want|.
double relative_error(const float* got, const std::vector<float>& want) {
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
        worst = std::max(worst, static_cast<double>(std::abs(got[k] - want[k])));
        scale = std::max(scale, static_cast<double>(std::abs(want[k])));
    }
    return worst / scale;
}

// The mean |got - want| over max |want|.
double mean_relative_error(const float* got, const std::vector<float>& want) {
    double total = 0, scale = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
        total += std::abs(static_cast<double>(got[k]) - want[k]);
        scale = std::max(scale, static_cast<double>(std::abs(want[k])));
    }
    return total / static_cast<double>(want.size()) / scale;
}

struct RankResult {
    double out_error = 0, grad_error = 0;
    // At bf16: the mean errors against the bf16 reference and the f32 one.
    double out_mean = 0, grad_mean = 0, out_mean_f32 = 0, grad_mean_f32 = 0;
    std::string failure;
};

// ulysses: 0 ring attention; sp plain Ulysses; between, the hybrid with
// Ulysses groups of that many consecutive ranks and rings across them.
//
// At bf16 (`precision`), against the whole sequence's bf16 attention: the
// bf16_softmax_shift makes every P round alike, so the errors are f32
// reassociation's, except that reassociation can move a P or dS across a
// bf16 midpoint now and then (one bf16 step of one term): 1e-3 of scale for
// the worst element, and on average 100 times closer to the bf16 reference
// than to the f32 one, so attention that stayed f32 fails.
void check_sp_attention(int sp, bool zigzag, bool causal, int ulysses, std::int64_t B, std::int64_t T,
                        std::int64_t H, std::int64_t D, MatmulPrecision precision = MatmulPrecision::f32) {
    const bool bf16 = precision == MatmulPrecision::bf16;
    const Whole w = whole_attention(B, T, H, D, causal, precision);
    const Whole w_f32 = bf16 ? whole_attention(B, T, H, D, causal) : Whole{};
    const std::int64_t C = H * D;
    std::vector<RankResult> results(static_cast<std::size_t>(sp));
    loom::comm::ThreadWorld(sp).run([&](ThreadComm& comm) {
        auto& result = results[static_cast<std::size_t>(comm.rank())];
        result.failure = loom_test::message_of([&] {
            const nn::TensorGroupOf<ThreadComm> group(comm);
            const int u = std::max(ulysses, 1), r = comm.rank();
            ThreadComm within = comm.split(r / u, r % u), across = comm.split(r % u, r / u);
            const nn::TensorGroupOf<ThreadComm> within_group(within), across_group(across);
            const nn::SequenceLayout layout{sp, r, zigzag, u};
            const std::int64_t local = layout.local_tokens(T);
            auto qkv = local_rows(w.qkv, B, T, 3 * C, layout), dout = local_rows(w.dout, B, T, C, layout);
            std::vector<float> out(static_cast<std::size_t>(B * local * C)), dqkv(qkv.size());
            nn::Context ctx;
            ctx.set_matmul_precision(precision);
            const Tensor qkv_t = Tensor::of(qkv.data(), {B, local, 3 * C}), out_t = Tensor::of(out.data(), {B, local, C});
            const Tensor dout_t = Tensor::of(dout.data(), {B, local, C}), dqkv_t = Tensor::of(dqkv.data(), {B, local, 3 * C});
            if (ulysses > 0) {
                const nn::UlyssesGroups groups{&within_group, u < sp ? &across_group : nullptr};
                nn::UlyssesSaved saved;
                nn::ulysses_attention_forward(ctx, groups, layout, causal, qkv_t, B, local, H, D, out_t, saved);
                nn::ulysses_attention_backward(groups, layout, causal, saved, dout_t, B, local, H, D, dqkv_t);
            } else {
                nn::RingSaved saved;
                const nn::RingShape shape{B, local, H, D};
                nn::ring_attention_forward(ctx, group, layout, causal, qkv_t, shape, out_t, saved);
                nn::ring_attention_backward(group, layout, causal, qkv_t, out_t, saved, dout_t, shape, dqkv_t);
            }
            result.out_error = relative_error(out.data(), local_rows(w.out, B, T, C, layout));
            result.grad_error = relative_error(dqkv.data(), local_rows(w.dqkv, B, T, 3 * C, layout));
            if (bf16) {
                result.out_mean = mean_relative_error(out.data(), local_rows(w.out, B, T, C, layout));
                result.grad_mean = mean_relative_error(dqkv.data(), local_rows(w.dqkv, B, T, 3 * C, layout));
                result.out_mean_f32 = mean_relative_error(out.data(), local_rows(w_f32.out, B, T, C, layout));
                result.grad_mean_f32 = mean_relative_error(dqkv.data(), local_rows(w_f32.dqkv, B, T, 3 * C, layout));
            }
        });
    });
    for (int r = 0; r < sp; ++r) {
        const auto& result = results[static_cast<std::size_t>(r)];
        INFO((ulysses == 0 ? "ring" : ulysses == sp ? "Ulysses" : "hybrid") << " u " << ulysses << " sp " << sp << (zigzag ? " zigzag" : " contiguous") << (causal ? " causal" : " non-causal") << ", T "
                   << T << ", rank " << r << ": out " << result.out_error << ", dqkv " << result.grad_error);
        CHECK(result.failure == "(no error)");
        if (!bf16) {
            CHECK(result.out_error <= 1e-5);
            CHECK(result.grad_error <= 1e-5);
            continue;
        }
        INFO("bf16 mean errors: out " << result.out_mean << " (against f32 " << result.out_mean_f32 << "), dqkv "
                                      << result.grad_mean << " (against f32 " << result.grad_mean_f32 << ")");
        CHECK(result.out_error <= 1e-3);
        CHECK(result.grad_error <= 1e-3);
        CHECK(result.out_mean * 100 < result.out_mean_f32);
        CHECK(result.grad_mean * 100 < result.grad_mean_f32);
    }
}

}  // namespace

TEST_CASE("ring attention equals whole-sequence attention, forward and backward", "[parallel][sp]") {
    for (int sp : {2, 3, 4, 8})
        for (bool zigzag : {true, false})
            for (bool causal : {true, false}) {
                // T: two tokens per chunk at sp 8, and chunks across the 32-row tiles at sp 2.
                const std::int64_t T = sp == 2 ? 136 : 2 * sp * (sp == 8 ? 2 : 6);
                DYNAMIC_SECTION("sp " << sp << (zigzag ? " zigzag" : " contiguous")
                                      << (causal ? " causal" : " non-causal")) {
                    check_sp_attention(sp, zigzag, causal, /*ulysses=*/0, 2, T, 2, 8);
                }
            }
}

TEST_CASE("Ulysses attention equals whole-sequence attention, forward and backward", "[parallel][sp]") {
    for (int sp : {2, 3, 4, 8})
        for (bool zigzag : {true, false})
            for (bool causal : {true, false}) {
                const std::int64_t T = 2 * sp * 5;  // chunks of 5, across no tile boundary
                DYNAMIC_SECTION("sp " << sp << (zigzag ? " zigzag" : " contiguous")
                                      << (causal ? " causal" : " non-causal")) {
                    check_sp_attention(sp, zigzag, causal, /*ulysses=*/sp, 2, T, 24, 4);  // 24 heads: any sp
                }
            }
}

TEST_CASE("the hybrid (Ulysses groups on a ring) equals whole-sequence attention", "[parallel][sp]") {
    // sp = u x R: 2 x 2, 2 x 3, 2 x 4, 4 x 2; pieces of 3 tokens.
    for (auto [sp, u] : {std::pair{4, 2}, std::pair{6, 2}, std::pair{8, 2}, std::pair{8, 4}})
        for (bool zigzag : {true, false}) {
            const int ring = sp / u;
            const std::int64_t T = (zigzag ? 2 * ring : ring) * u * 3;
            DYNAMIC_SECTION("sp " << sp << " = Ulysses " << u << " x ring " << ring << (zigzag ? " zigzag" : " contiguous")) {
                check_sp_attention(sp, zigzag, /*causal=*/true, u, 2, T, 8, 4);
                check_sp_attention(sp, zigzag, /*causal=*/false, u, 2, T, 8, 4);
            }
        }
}

TEST_CASE("ring Ulysses and hybrid attention at bf16 products equal whole-sequence bf16 attention",
          "[parallel][sp][bf16]") {
    for (bool causal : {true, false}) {
        DYNAMIC_SECTION((causal ? "causal" : "non-causal")) {
            check_sp_attention(2, true, causal, /*ulysses=*/0, 2, 32, 2, 8, MatmulPrecision::bf16);
            check_sp_attention(3, false, causal, /*ulysses=*/0, 2, 36, 2, 8, MatmulPrecision::bf16);
            check_sp_attention(2, true, causal, /*ulysses=*/2, 2, 32, 4, 8, MatmulPrecision::bf16);
            check_sp_attention(4, true, causal, /*ulysses=*/2, 2, 32, 4, 8, MatmulPrecision::bf16);
        }
    }
}

TEST_CASE("Ulysses refuses heads that do not split over the sp ranks, in one line", "[parallel][sp]") {
    CHECK(loom_test::message_of([] { loom::nn::check_ulysses_heads(6, 4); }) ==
          "Ulysses: the 6 attention heads (on this rank) do not split over the 4 sp ranks of a Ulysses group; use a "
          "group size that divides 6 or RingAttention");
}

TEST_CASE("the sequence layouts place chunks as documented, and refuse what does not split", "[parallel][sp]") {
    const nn::SequenceLayout zigzag{4, 1, true};
    const auto runs = zigzag.runs(16);
    CHECK(runs[0].position == 2);
    CHECK(runs[0].chunk == 1);
    CHECK(runs[1].position == 12);
    CHECK(runs[1].chunk == 6);
    CHECK(zigzag.local_tokens(16) == 4);
    CHECK(zigzag.position(3, 16) == 13);
    const nn::SequenceLayout contiguous{4, 3, false};
    CHECK(contiguous.runs(16)[0].position == 12);
    CHECK(contiguous.local_tokens(16) == 4);
    CHECK(loom_test::message_of([&] { (void)zigzag.local_tokens(20); }) ==
          "sequence parallelism: a sequence of 20 tokens does not split into the 8 chunks of the zigzag layout over "
          "4 sp ranks (2 x sp); use a sequence length that is a multiple of 8");
    CHECK(loom_test::message_of([&] { (void)contiguous.local_tokens(18); }) ==
          "sequence parallelism: a sequence of 18 tokens does not split into the 4 chunks of 4 sp ranks; use a "
          "sequence length that is a multiple of 4");
}

TEST_CASE("ring attention refuses a group that is not the layout's ring, in one line", "[parallel][sp]") {
    std::vector<std::string> messages(2);
    loom::comm::ThreadWorld(2).run([&](ThreadComm& comm) {
        const nn::TensorGroupOf<ThreadComm> group(comm);
        const nn::SequenceLayout layout{4, comm.rank(), true};  // 4 ranks, but the group has 2
        std::vector<float> qkv(2 * 3 * 4, 0.0f), out(2 * 4, 0.0f);
        nn::Context ctx;
        nn::RingSaved saved;
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of([&] {
            nn::ring_attention_forward(ctx, group, layout, true, Tensor::of(qkv.data(), {1, 2, 12}), {1, 2, 1, 4},
                                       Tensor::of(out.data(), {1, 2, 4}), saved);
        });
    });
    CHECK(messages[0] == "ring attention: a group of 2 ranks (this one 0) for a layout of 4 (this one 0); pass the "
                         "ring the layout describes");
    CHECK(messages[1] == "ring attention: a group of 2 ranks (this one 1) for a layout of 4 (this one 1); pass the "
                         "ring the layout describes");
}

}  // namespace LOOM_TEST_FILE
