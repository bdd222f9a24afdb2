// Ring-attention block kernels (kernels/host/attention_blocks.hpp): blocks
// without a mask, of unequal sizes with padded strides, against a
// double-precision softmax; the merge's symmetry, its start from -infinity
// and its stability far apart; and every refusal's one line, for both masks
// and the bf16 forms. The causal ring: test_attention_blocks.cpp.
#include <catch2/catch.hpp>

#include "support/attention_block_tensors.hpp"
#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/kernels/host/attention_blocks.hpp>
#include <loom/kernels/host/attention_blocks_bf16.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;
using host::BlockMask;
using namespace loom_test::attention_blocks;

// ----- non-causal: padded strides, unequal chunks, a double reference ----------------------

struct Full {
    I B, H, D;
    std::vector<I> query_chunks, key_chunks;
    [[nodiscard]] I C() const { return H * D; }
    [[nodiscard]] I Tq() const { return std::accumulate(query_chunks.begin(), query_chunks.end(), I{0}); }
    [[nodiscard]] I Tk() const { return std::accumulate(key_chunks.begin(), key_chunks.end(), I{0}); }
};

// Where each chunk starts in the whole sequence.
std::vector<I> starts_of(const std::vector<I>& chunks) {
    std::vector<I> starts(chunks.size(), 0);
    std::exclusive_scan(chunks.begin(), chunks.end(), starts.begin(), I{0});
    return starts;
}

// softmax(scale Q K^T) V per head and its textbook backward (dS = P * (dP -
// rowsum(P * dP)), not FlashAttention's rowsum(dO * O)). q, dout: [B, Tq, C];
// k, v: [B, Tk, C]. Returns out, lse and the gradients in the same layouts.
struct Reference {
    std::vector<double> out, lse, dq, dk, dv;
};
Reference reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& dout, const Full& s) {
    const I Tq = s.Tq(), Tk = s.Tk(), C = s.C(), D = s.D;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Reference ref{std::vector<double>(q.size()), std::vector<double>(static_cast<std::size_t>(s.B * s.H * Tq)),
                  std::vector<double>(q.size(), 0.0), std::vector<double>(k.size(), 0.0),
                  std::vector<double>(v.size(), 0.0)};
    std::vector<double> p(static_cast<std::size_t>(Tk)), dp(p.size());
    for (I b = 0; b < s.B; ++b)
        for (I h = 0; h < s.H; ++h) {
            auto at_q = [&](I t, I d) { return static_cast<std::size_t>((b * Tq + t) * C + h * D + d); };
            auto at_k = [&](I t, I d) { return static_cast<std::size_t>((b * Tk + t) * C + h * D + d); };
            for (I i = 0; i < Tq; ++i) {
                double best = -std::numeric_limits<double>::infinity(), sum = 0.0, p_dot_dp = 0.0;
                for (I j = 0; j < Tk; ++j) {
                    double dot = 0.0, dot_v = 0.0;
                    for (I d = 0; d < D; ++d) {
                        dot += static_cast<double>(q[at_q(i, d)]) * k[at_k(j, d)];
                        dot_v += static_cast<double>(dout[at_q(i, d)]) * v[at_k(j, d)];
                    }
                    p[static_cast<std::size_t>(j)] = dot * scale;
                    dp[static_cast<std::size_t>(j)] = dot_v;
                    best = std::max(best, dot * scale);
                }
                for (double& x : p) sum += (x = std::exp(x - best));
                for (double& x : p) x /= sum;
                ref.lse[static_cast<std::size_t>((b * s.H + h) * Tq + i)] = best + std::log(sum);
                for (I j = 0; j < Tk; ++j) p_dot_dp += p[static_cast<std::size_t>(j)] * dp[static_cast<std::size_t>(j)];
                for (I j = 0; j < Tk; ++j) {
                    const double pj = p[static_cast<std::size_t>(j)];
                    const double ds = pj * (dp[static_cast<std::size_t>(j)] - p_dot_dp);
                    for (I d = 0; d < D; ++d) {
                        ref.out[at_q(i, d)] += pj * v[at_k(j, d)];
                        ref.dv[at_k(j, d)] += pj * dout[at_q(i, d)];
                        ref.dq[at_q(i, d)] += scale * ds * k[at_k(j, d)];
                        ref.dk[at_k(j, d)] += scale * ds * q[at_q(i, d)];
                    }
                }
            }
        }
    return ref;
}

}  // namespace

TEST_CASE("attention blocks without a mask match a double-precision softmax, with padded strides", "[kernels]") {
    // Unequal chunks (one key chunk of a single key, one across the 128-key
    // tile); q chunks [B, tq, C + 5] and k|v chunks [B, tk, 2C + 1] with padding
    // that must stay untouched; gradients start at 1 so that adding is checked.
    const std::vector<Full> shapes{
        {2, 2, 16, {32, 38}, {40, 1, 129, 20}},
        {1, 3, 3, {5}, {7, 33}},
        {2, 1, 64, {70}, {64, 64}},
        {1, 2, 16, {1, 9, 33}, {3}},
    };
    constexpr float pad = 7.25f, start = 1.0f;
    for (const Full& s : shapes) {
        const I B = s.B, H = s.H, D = s.D, C = s.C(), Tq = s.Tq(), Tk = s.Tk();
        INFO("B=" << B << " Tq=" << Tq << " Tk=" << Tk << " H=" << H << " D=" << D);
        const auto q = random_normal(B * Tq * C, 5), k = random_normal(B * Tk * C, 6);
        const auto v = random_normal(B * Tk * C, 7), dout = random_normal(B * Tq * C, 8);
        const I ld_q = C + 5, ld_kv = 2 * C + 1;
        const std::vector<I> query_rows = starts_of(s.query_chunks), key_rows = starts_of(s.key_chunks);
        std::vector<std::vector<float>> kv_chunks, dkv_chunks;
        for (std::size_t j = 0; j < s.key_chunks.size(); ++j) {
            const I tk = s.key_chunks[j], row = key_rows[j];
            std::vector<float> kv = cut(k, Tk, C, row, 0, B, tk, C, ld_kv, pad);
            copy_rows(v.data(), {Tk, C, row, 0}, kv.data(), {tk, ld_kv, 0, C}, B, tk, C);
            kv_chunks.push_back(std::move(kv));
            std::vector<float> dkv(static_cast<std::size_t>(B * tk * ld_kv), start);
            for (I t = 0; t < B * tk; ++t) dkv[static_cast<std::size_t>(t * ld_kv + 2 * C)] = pad;
            dkv_chunks.push_back(std::move(dkv));
        }
        std::vector<float> out(q.size(), nan_value), lse(static_cast<std::size_t>(B * H * Tq), nan_value);
        std::vector<float> dq_whole(q.size(), nan_value);
        bool padding_kept = true;
        for (std::size_t i = 0; i < s.query_chunks.size(); ++i) {
            const I tq = s.query_chunks[i], row = query_rows[i];
            const std::vector<float> q_chunk = cut(q, Tq, C, row, 0, B, tq, C, ld_q, pad);
            const std::vector<float> dout_chunk = cut(dout, Tq, C, row, 0, B, tq, C, C);
            std::vector<float> out_chunk(static_cast<std::size_t>(B * tq * C), nan_value);
            std::vector<float> lse_chunk(static_cast<std::size_t>(B * H * tq), minus_infinity);
            for (std::size_t j = 0; j < kv_chunks.size(); ++j) {
                const I tk = s.key_chunks[j];
                std::vector<float> block_out(out_chunk.size(), nan_value), block_lse(lse_chunk.size(), nan_value);
                host::attention_block_forward(q_chunk.data(), ld_q, kv_chunks[j].data(), kv_chunks[j].data() + C,
                                              ld_kv, block_out.data(), block_lse.data(), B, tq, tk, H, D,
                                              BlockMask::full);
                host::attention_merge(out_chunk.data(), lse_chunk.data(), block_out.data(), block_lse.data(), B, tq,
                                      H, D);
            }
            std::vector<float> dq_chunk = q_chunk;
            for (I t = 0; t < B * tq; ++t) std::fill_n(dq_chunk.begin() + t * ld_q, C, start);
            for (std::size_t j = 0; j < kv_chunks.size(); ++j)
                host::attention_block_backward(q_chunk.data(), ld_q, kv_chunks[j].data(), kv_chunks[j].data() + C,
                                               ld_kv, out_chunk.data(), dout_chunk.data(), lse_chunk.data(),
                                               dq_chunk.data(), dkv_chunks[j].data(), dkv_chunks[j].data() + C, B, tq,
                                               s.key_chunks[j], H, D, BlockMask::full);
            for (I t = 0; t < B * tq; ++t)
                for (I col = C; col < ld_q; ++col)
                    padding_kept &= dq_chunk[static_cast<std::size_t>(t * ld_q + col)] == pad;
            copy_rows(out_chunk.data(), {tq, C, 0, 0}, out.data(), {Tq, C, row, 0}, B, tq, C);
            copy_rows(lse_chunk.data(), {tq, 1, 0, 0}, lse.data(), {Tq, 1, row, 0}, B * H, tq, 1);
            copy_rows(dq_chunk.data(), {tq, ld_q, 0, 0}, dq_whole.data(), {Tq, C, row, 0}, B, tq, C);
        }
        std::vector<float> dk_whole(k.size(), nan_value), dv_whole(v.size(), nan_value);
        for (std::size_t j = 0; j < s.key_chunks.size(); ++j) {
            const I tk = s.key_chunks[j], row = key_rows[j];
            const std::vector<float>& dkv = dkv_chunks[j];
            for (I t = 0; t < B * tk; ++t) padding_kept &= dkv[static_cast<std::size_t>(t * ld_kv + 2 * C)] == pad;
            copy_rows(dkv.data(), {tk, ld_kv, 0, 0}, dk_whole.data(), {Tk, C, row, 0}, B, tk, C);
            copy_rows(dkv.data(), {tk, ld_kv, 0, C}, dv_whole.data(), {Tk, C, row, 0}, B, tk, C);
        }
        CHECK(padding_kept);  // columns past H*D of dq's and dk|dv's rows
        // The gradients started at `start`: what the kernels added is got - start.
        for (auto* grad : {&dq_whole, &dk_whole, &dv_whole})
            for (float& x : *grad) x -= start;
        const Reference want = reference(q, k, v, dout, s);
        CHECK(scaled_error<double>(out, want.out) <= 1e-5);
        CHECK(scaled_error<double>(lse, want.lse) <= 1e-6);
        CHECK(scaled_error<double>(dq_whole, want.dq) <= 1e-5);
        CHECK(scaled_error<double>(dk_whole, want.dk) <= 1e-5);
        CHECK(scaled_error<double>(dv_whole, want.dv) <= 1e-5);
    }
}

TEST_CASE("attention_merge is symmetric, starts from -infinity and is stable far apart", "[kernels]") {
    const I B = 2, Tq = 3, H = 2, D = 5, C = H * D;
    const auto out_a = random_normal(B * Tq * C, 9), out_b = random_normal(B * Tq * C, 10);
    std::vector<float> lse_a = random_normal(B * H * Tq, 11), lse_b = random_normal(B * H * Tq, 12);
    lse_a[0] = 3.0f;  // equal lse: the average
    lse_b[0] = 3.0f;
    lse_a[1] = 0.0f;  // 200 apart: the larger side exactly, no overflow or NaN
    lse_b[1] = 200.0f;
    lse_a[2] = -500.0f;
    lse_b[2] = 100.0f;
    auto merged = [&](const std::vector<float>& out1, const std::vector<float>& lse1, const std::vector<float>& out2,
                      const std::vector<float>& lse2) {
        std::pair<std::vector<float>, std::vector<float>> running{out1, lse1};
        host::attention_merge(running.first.data(), running.second.data(), out2.data(), lse2.data(), B, Tq, H, D);
        return running;
    };
    const auto ab = merged(out_a, lse_a, out_b, lse_b);
    const auto ba = merged(out_b, lse_b, out_a, lse_a);
    CHECK(std::memcmp(ab.first.data(), ba.first.data(), ab.first.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(ab.second.data(), ba.second.data(), ab.second.size() * sizeof(float)) == 0);
    // Row (b = 0, t = 0, h = 0) has lse index 0, rows t = 1, 2 of head 0 lse indexes 1 and 2.
    CHECK(ab.second[0] == Approx(3.0 + std::log(2.0)).epsilon(1e-7));
    for (I d = 0; d < D; ++d) {
        const auto i = static_cast<std::size_t>(d);
        CHECK(ab.first[i] == Approx(0.5 * (out_a[i] + out_b[i])).epsilon(1e-6).margin(1e-7));
        CHECK(ab.first[static_cast<std::size_t>(C) + i] == out_b[static_cast<std::size_t>(C) + i]);
        CHECK(ab.first[static_cast<std::size_t>(2 * C) + i] == out_b[static_cast<std::size_t>(2 * C) + i]);
    }
    CHECK(ab.second[1] == 200.0f);
    CHECK(ab.second[2] == 100.0f);
    // Against the definition in double for every row.
    for (I b = 0; b < B; ++b)
        for (I t = 0; t < Tq; ++t)
            for (I h = 0; h < H; ++h) {
                const auto l = static_cast<std::size_t>((b * H + h) * Tq + t);
                const double m = std::max(lse_a[l], lse_b[l]);
                const double lse = m + std::log(std::exp(lse_a[l] - m) + std::exp(lse_b[l] - m));
                CHECK(ab.second[l] == Approx(lse).epsilon(1e-6).margin(1e-6));
                for (I d = 0; d < D; ++d) {
                    const auto o = static_cast<std::size_t>((b * Tq + t) * C + h * D + d);
                    const double want = out_a[o] * std::exp(lse_a[l] - lse) + out_b[o] * std::exp(lse_b[l] - lse);
                    CHECK(ab.first[o] == Approx(want).epsilon(1e-6).margin(1e-6));
                }
            }
    // A running lse of -infinity takes the block bit for bit, whatever out held.
    const auto first = merged(std::vector<float>(out_b.size(), nan_value),
                              std::vector<float>(lse_b.size(), minus_infinity), out_b, lse_b);
    CHECK(first.first == out_b);
    CHECK(first.second == lse_b);
    // A NaN lse poisons its row.
    std::vector<float> poisoned = lse_b;
    poisoned[0] = nan_value;
    const auto with_nan = merged(out_a, lse_a, out_b, poisoned);
    CHECK(std::isnan(with_nan.second[0]));
    CHECK(std::isnan(with_nan.first[0]));
    CHECK(std::isfinite(with_nan.second[3]));
}

TEST_CASE("attention blocks refuse bad input with one line", "[kernels]") {
    std::vector<float> buffer(64, 0.0f);
    float* p = buffer.data();
    const auto full = BlockMask::full, causal = BlockMask::causal;
    using loom_test::message_of;
    // Shapes: H = 2, D = 4, so H*D = 8.
    CHECK(message_of([&] { host::attention_block_forward(p, 8, p, p, 8, p, p, 1, 4, 8, 2, 4, causal); }) ==
          "attention_block_forward: BlockMask::causal needs Tq == Tk (the same positions), got Tq = 4, Tk = 8; use "
          "BlockMask::full for a key block before the queries");
    CHECK(message_of([&] { host::attention_block_backward(p, 8, p, p, 8, p, p, p, p, p, p, 1, 3, 2, 2, 4, causal); }) ==
          "attention_block_backward: BlockMask::causal needs Tq == Tk (the same positions), got Tq = 3, Tk = 2; use "
          "BlockMask::full for a key block before the queries");
    CHECK(message_of([&] { host::attention_block_forward(p, 8, p, p, 8, p, p, 1, 4, 4, 2, 4, BlockMask{7}); }) ==
          "attention_block_forward: mask = 7 is neither BlockMask::full (0) nor BlockMask::causal (1)");
    CHECK(message_of([&] { host::attention_block_forward(p, 8, p, p, 8, p, p, 0, 4, 4, 2, 4, full); }) ==
          "attention_block_forward: batch size B = 0 must be >= 1");
    CHECK(message_of([&] { host::attention_block_forward(p, 8, p, p, 8, p, p, 1, -1, 4, 2, 4, full); }) ==
          "attention_block_forward: query block length Tq = -1 must be >= 1");
    CHECK(message_of([&] { host::attention_block_forward(p, 8, p, p, 8, p, p, 1, 4, 0, 2, 4, full); }) ==
          "attention_block_forward: key block length Tk = 0 must be >= 1");
    CHECK(message_of([&] { host::attention_block_backward(p, 8, p, p, 8, p, p, p, p, p, p, 1, 4, 4, 0, 4, full); }) ==
          "attention_block_backward: head count H = 0 must be >= 1");
    CHECK(message_of([&] { host::attention_block_backward(p, 8, p, p, 8, p, p, p, p, p, p, 1, 4, 4, 2, -2, full); }) ==
          "attention_block_backward: head size D = -2 must be >= 1");
    CHECK(message_of([&] { host::attention_merge(p, p, p, p, 1, 0, 2, 4); }) ==
          "attention_merge: query block length Tq = 0 must be >= 1");
    CHECK(message_of([&] { host::attention_merge(p, p, p, p, 1, 4, 2, 0); }) ==
          "attention_merge: head size D = 0 must be >= 1");
    CHECK(message_of([&] { host::attention_merge(p, p, p, p, 1, 4, I{1} << 20, 4096); }) ==
          "attention_merge: row width H*D = 1048576*4096 exceeds the BLAS's int range (at most 2147483647)");
    CHECK(message_of([&] { host::attention_block_forward(p, 7, p, p, 8, p, p, 1, 4, 4, 2, 4, full); }) ==
          "attention_block_forward: ld_q = 7 must be in [H*D = 8, 2147483647]");
    CHECK(message_of([&] { host::attention_block_backward(p, 8, p, p, 3, p, p, p, p, p, p, 1, 4, 4, 2, 4, full); }) ==
          "attention_block_backward: ld_kv = 3 must be in [H*D = 8, 2147483647]");
    CHECK(message_of([&] { host::attention_block_forward(p, I{1} << 31, p, p, 8, p, p, 1, 4, 4, 2, 4, full); }) ==
          "attention_block_forward: ld_q = 2147483648 must be in [H*D = 8, 2147483647]");
    CHECK(message_of([&] { host::attention_block_forward(p, 8, nullptr, p, 8, p, p, 1, 4, 4, 2, 4, full); }) ==
          "attention_block_forward: k is null (q, k, v, out and lse must all be non-null)");
    CHECK(message_of([&] { host::attention_block_forward(p, 8, p, p, 8, p, nullptr, 1, 4, 4, 2, 4, full); }) ==
          "attention_block_forward: lse is null (q, k, v, out and lse must all be non-null)");
    CHECK(message_of([&] {
              host::attention_block_backward(p, 8, p, p, 8, p, nullptr, p, p, p, p, 1, 4, 4, 2, 4, full);
          }) ==
          "attention_block_backward: dout is null (q, k, v, out, dout, lse, dq, dk and dv must all be non-null)");
    CHECK(message_of([&] {
              host::attention_block_backward(p, 8, p, p, 8, p, p, p, p, p, nullptr, 1, 4, 4, 2, 4, full);
          }) ==
          "attention_block_backward: dv is null (q, k, v, out, dout, lse, dq, dk and dv must all be non-null)");
    CHECK(message_of([&] { host::attention_merge(p, p, p, nullptr, 1, 4, 2, 4); }) ==
          "attention_merge: lse_b is null (out, lse, out_b and lse_b must all be non-null)");
    CHECK(message_of([&] { host::attention_merge(nullptr, p, p, p, 1, 4, 2, 4); }) ==
          "attention_merge: out is null (out, lse, out_b and lse_b must all be non-null)");
    // The bf16 forms check as the f32 ones do, with the same words.
    CHECK(message_of([&] { host::attention_block_forward_bf16_inputs(p, 7, p, p, 8, p, p, 1, 4, 4, 2, 4, full); }) ==
          "attention_block_forward: ld_q = 7 must be in [H*D = 8, 2147483647]");
    CHECK(message_of([&] {
              host::attention_block_backward_bf16_inputs(p, 8, p, p, 8, p, p, p, p, nullptr, p, 1, 4, 4, 2, 4, full);
          }) ==
          "attention_block_backward: dk is null (q, k, v, out, dout, lse, dq, dk and dv must all be non-null)");
    // Nothing was written by a refused call.
    CHECK(std::all_of(buffer.begin(), buffer.end(), [](float x) { return x == 0.0f; }));
}

}  // namespace LOOM_TEST_FILE
