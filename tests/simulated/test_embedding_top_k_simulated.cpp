// The embedding and top-k kernels (kernels/cuda/embedding.cuh, top_k.cuh) on
// simulated threads, against their host twins bit for bit, as
// tests/cuda/test_kernels_embedding_topk.cu holds a GPU to them, on its
// inputs (tests/support/embedding_top_k_inputs.hpp).
//
// The kernels are the headers' own. Their launchers also call CUB (a radix
// sort, a scan, a stable compaction), which cannot run here; the launch
// sequences below restate the launchers' and stand in for CUB on the host
// with what CUB's documentation promises: a stable sort by key, an exclusive
// sum, and a compaction that keeps the inputs its predicate (the header's
// own functor, EmbeddingRunStart or TopKPick) accepts, in order. So this
// checks every kernel and predicate of the two headers and how they fit
// together; CUB itself, and the launchers' scratch layout, only a GPU checks.
// Each sequence runs on the launchers' grids and on grids of at most 3
// blocks, whose grid-stride loops then take several turns; outputs start as
// garbage.
#include <catch2/catch.hpp>

#include "loom/kernels/host/embedding.hpp"
#include "loom/kernels/host/top_k.hpp"
#include "support/comparisons.hpp"
#include "support/embedding_top_k_inputs.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_sim::Grid;
using loom_test::compare_floats;
using loom_test::compare_words;
using loom_test::uniform;

constexpr int block_threads = dev::threads_per_block;
constexpr long long garbage = 0x5a5a'5a5a'5a5a'5a5all;
constexpr std::int32_t garbage32 = 0x5a5a'5a5a;
constexpr std::uint32_t sentinel = 0xdead'beefu;
constexpr unsigned launcher_grid = std::numeric_limits<unsigned>::max();

// A launcher's grid, or at most `cap` blocks of it.
unsigned grid(unsigned launcher_blocks, unsigned cap) { return std::min(launcher_blocks, cap); }

// --- embedding.cuh's launchers, restated ----------------------------------------

// check_embedding_tokens: each block's first bad position and largest id,
// then one block combines them.
dev::detail::EmbeddingTokenReport check_tokens(const std::vector<std::int32_t>& tokens, std::int64_t limit,
                                               unsigned cap) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    const unsigned blocks = grid(std::min(dev::blocks_for(n), dev::detail::embedding_check_max_blocks), cap);
    std::vector<long long> first_bad(blocks, garbage), max_token(blocks, garbage);
    loom_sim::launch(Grid{blocks, 1}, block_threads, 0, [&] {
        dev::detail::embedding_check_tokens_kernel<block_threads>(tokens.data(), n, limit, first_bad.data(),
                                                                  max_token.data());
    });
    dev::detail::EmbeddingTokenReport report{garbage, garbage, garbage32};
    loom_sim::launch(Grid{1, 1}, block_threads, 0, [&] {
        dev::detail::embedding_check_combine_kernel<block_threads>(tokens.data(), n, first_bad.data(),
                                                                   max_token.data(), blocks, &report);
    });
    return report;
}

// What check_tokens must report: the first position outside [0, limit) (n
// when none), the id there, and the largest id.
void check_report(const dev::detail::EmbeddingTokenReport& report, const std::vector<std::int32_t>& tokens,
                  std::int64_t limit) {
    const auto bad = std::find_if(tokens.begin(), tokens.end(), [limit](std::int32_t id) { return id < 0 || id >= limit; });
    const auto first_bad = static_cast<long long>(bad - tokens.begin());
    CHECK(report.first_bad == first_bad);
    CHECK(report.max_token == (tokens.empty() ? -1 : *std::max_element(tokens.begin(), tokens.end())));
    if (bad != tokens.end()) CHECK(report.bad_token == *bad);
}

void forward(const std::vector<std::int32_t>& tokens, const std::vector<float>& token_table,
             const std::vector<float>& position_table, std::vector<float>& out, std::int64_t T, std::int64_t C,
             unsigned cap) {
    const std::int64_t count = static_cast<std::int64_t>(tokens.size()) * C;
    loom_sim::launch_each(Grid{grid(dev::blocks_for(count), cap), 1}, block_threads, [&] {
        dev::detail::embedding_forward_kernel<float>(tokens.data(), token_table.data(), position_table.data(),
                                                     out.data(), T, C, count);
    });
}

void slice_lookup(const std::vector<std::int32_t>& tokens, const std::vector<float>& table, std::vector<float>& out,
                  std::int64_t C, std::int64_t start, std::int64_t stop, unsigned cap) {
    const std::int64_t count = static_cast<std::int64_t>(tokens.size()) * C;
    loom_sim::launch_each(Grid{grid(dev::blocks_for(count), cap), 1}, block_threads, [&] {
        dev::detail::embedding_slice_lookup_kernel<float>(tokens.data(), table.data(), out.data(), C, start, stop,
                                                          count);
    });
}

// embedding_slice_backward after its check: positions 0..n-1, CUB's stable
// pair sort by id, the compaction of run starts, then the two sums.
void slice_backward(const std::vector<std::int32_t>& tokens, const std::vector<float>& dout,
                    std::vector<float>& dtoken_table, std::vector<float>& dposition_table, std::int64_t T,
                    std::int64_t C, std::int64_t start, std::int64_t stop, unsigned cap) {
    const auto n = static_cast<std::int64_t>(tokens.size());
    std::vector<std::int32_t> positions(tokens.size(), garbage32);
    loom_sim::launch_each(Grid{grid(dev::blocks_for(n), cap), 1}, block_threads,
                          [&] { dev::detail::embedding_iota_kernel<std::int32_t>(positions.data(), n); });
    // cub::DeviceRadixSort::SortPairs (stable): the ids ascending, each
    // carrying its position.
    std::vector<std::int32_t> sorted_positions = positions;
    std::stable_sort(sorted_positions.begin(), sorted_positions.end(),
                     [&](std::int32_t a, std::int32_t b) { return tokens[static_cast<std::size_t>(a)] < tokens[static_cast<std::size_t>(b)]; });
    std::vector<std::int32_t> sorted_tokens(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i)
        sorted_tokens[i] = tokens[static_cast<std::size_t>(sorted_positions[i])];
    // cub::DeviceSelect::If over `positions` with the header's predicate.
    const dev::detail::EmbeddingRunStart run_start{sorted_tokens.data()};
    std::vector<std::int32_t> run_starts(tokens.size(), garbage32);
    long long runs = 0;
    for (const std::int32_t p : positions)
        if (run_start(p)) run_starts[static_cast<std::size_t>(runs++)] = p;
    loom_sim::launch_each(Grid{grid(dev::blocks_for(n * C), cap), 1}, block_threads, [&] {
        dev::detail::embedding_token_grad_kernel<float>(run_starts.data(), &runs, sorted_tokens.data(),
                                                        sorted_positions.data(), dout.data(), dtoken_table.data(),
                                                        n, C, start, stop);
    });
    loom_sim::launch_each(Grid{grid(dev::blocks_for(T * C), cap), 1}, block_threads, [&] {
        dev::detail::embedding_position_grad_kernel<float>(dout.data(), dposition_table.data(), n / T, T, C);
    });
}

// --- top_k.cuh's launchers, restated --------------------------------------------

void pack_top_k(const std::vector<float>& x, std::int64_t k, std::vector<std::uint32_t>& words, float* residual,
                unsigned cap) {
    const auto n = static_cast<std::int64_t>(x.size());
    if (residual != nullptr && residual != x.data()) std::copy(x.begin(), x.end(), residual);
    if (k == 0) return;
    using Word = std::uint32_t;
    std::vector<Word> mags(x.size(), sentinel);
    loom_sim::launch_each(Grid{grid(dev::blocks_for(n), cap), 1}, block_threads,
                          [&] { dev::detail::top_k_magnitude_kernel<Word>(x.data(), n, mags.data()); });
    std::vector<Word> work = mags;  // cub::DeviceRadixSort::SortKeysDescending
    std::sort(work.begin(), work.end(), std::greater<>());
    dev::detail::TopKThreshold threshold{sentinel, sentinel};
    loom_sim::launch_each(Grid{1, 1}, 1,
                          [&] { dev::detail::top_k_threshold_kernel<Word>(work.data(), k, &threshold); });
    loom_sim::launch_each(Grid{grid(dev::blocks_for(n), cap), 1}, block_threads, [&] {
        dev::detail::top_k_tie_flags_kernel<Word>(mags.data(), n, &threshold, work.data());
    });
    std::exclusive_scan(work.begin(), work.end(), work.begin(), Word{0});  // cub::DeviceScan::ExclusiveSum
    // cub::DeviceSelect::If over the indices 0..n-1 with the header's predicate.
    const dev::detail::TopKPick pick{mags.data(), work.data(), &threshold};
    std::int64_t selected = 0;
    for (Word i = 0; i < static_cast<Word>(n); ++i)
        if (pick(i)) {
            if (selected == k) FAIL("TopKPick keeps more than k = " << k << " indices");
            words[static_cast<std::size_t>(selected++)] = i;
        }
    REQUIRE(selected == k);
    loom_sim::launch_each(Grid{grid(dev::blocks_for(k), cap), 1}, block_threads,
                          [&] { dev::detail::top_k_values_kernel<Word>(x.data(), k, words.data(), residual); });
}

// unpack_top_k_add's check: each block's first pair with a bad index and
// first pair out of increasing order, then one block combines them.
dev::detail::TopKUnpackReport check_pairs(const std::vector<std::uint32_t>& words, std::int64_t k, std::int64_t n,
                                          unsigned cap) {
    const unsigned blocks = grid(std::min(dev::blocks_for(k), dev::detail::top_k_check_max_blocks), cap);
    std::vector<long long> first_bad(blocks, garbage), first_unordered(blocks, garbage);
    loom_sim::launch(Grid{blocks, 1}, block_threads, 0, [&] {
        dev::detail::top_k_check_indices_kernel<block_threads, std::uint32_t>(words.data(), k, n, first_bad.data(),
                                                                              first_unordered.data());
    });
    dev::detail::TopKUnpackReport report{garbage, garbage, garbage};
    loom_sim::launch(Grid{1, 1}, block_threads, 0, [&] {
        dev::detail::top_k_check_combine_kernel<block_threads, std::uint32_t>(
            words.data(), k, first_bad.data(), first_unordered.data(), blocks, &report);
    });
    return report;
}

// The rest of unpack_top_k_add: one thread per pair when the indices
// increase, else one thread for all, in pair order.
void scatter(const std::vector<std::uint32_t>& words, std::int64_t k, bool increasing, std::vector<float>& out,
             float weight, unsigned cap) {
    const auto body = [&] { dev::detail::top_k_scatter_kernel<std::uint32_t>(words.data(), k, out.data(), weight); };
    if (increasing)
        loom_sim::launch_each(Grid{grid(dev::blocks_for(k), cap), 1}, block_threads, body);
    else
        loom_sim::launch_each(Grid{1, 1}, 1, body);
}

}  // namespace

TEST_CASE("simulated embedding forward and vocabulary-slice lookup equal the host's bit for bit",
          "[simulated][embedding]") {
    std::mt19937 rng(1101);
    for (const auto [B, T, C, vocab] : loom_test::embedding_shapes)
        for (const unsigned cap : {launcher_grid, 3u}) {
            CAPTURE(B, T, C, vocab, cap);
            const std::int64_t n = B * T;
            const std::vector<std::int32_t> tokens = loom_test::repeated_tokens(n, vocab, rng);
            const std::vector<float> token_table = uniform(static_cast<std::size_t>(vocab * C), -1.0f, 1.0f, rng);
            const std::vector<float> position_table = loom_test::wide_range(static_cast<std::size_t>((T + 3) * C), rng);
            std::vector<float> expected(static_cast<std::size_t>(n * C));
            host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), expected.data(), B, T,
                                    C, vocab);
            check_report(check_tokens(tokens, vocab, cap), tokens, vocab);
            std::vector<float> out(expected.size(), loom_test::from_bits(0xffff'ffffu));
            forward(tokens, token_table, position_table, out, T, C, cap);
            CHECK_NO_MISMATCHES("out", compare_floats(out, expected, false));

            for (const auto [start, stop] : loom_test::vocabulary_slices(vocab)) {
                CAPTURE(start, stop);
                const std::vector<float> table(token_table.begin() + start * C, token_table.begin() + stop * C);
                host::embedding_slice_lookup(tokens.data(), table.data(), expected.data(), n, T, C, start, stop, vocab);
                std::fill(out.begin(), out.end(), loom_test::from_bits(0xffff'ffffu));
                slice_lookup(tokens, table, out, C, start, stop, cap);
                CHECK_NO_MISMATCHES("slice out", compare_floats(out, expected, false));
            }
        }
}

// The tables start nonzero (the backward accumulates), the gradients span 24
// binary orders of magnitude (another order of additions changes bits: the
// CUDA test shows it for the GPT-2 shape), two calls accumulate twice, and
// one gradient is NaN. Then three vocabulary slices.
TEST_CASE("simulated embedding backward adds the host's sums in the host's order, bit for bit",
          "[simulated][embedding]") {
    std::mt19937 rng(1102);
    for (const auto [B, T, C, vocab] : loom_test::embedding_shapes)
        for (const unsigned cap : {launcher_grid, 3u}) {
            CAPTURE(B, T, C, vocab, cap);
            const std::int64_t n = B * T;
            const std::vector<std::int32_t> tokens = loom_test::repeated_tokens(n, vocab, rng);
            std::vector<float> dout = loom_test::wide_range(static_cast<std::size_t>(n * C), rng);
            const bool with_nan = n * C > 1;
            if (with_nan) dout[static_cast<std::size_t>(n * C / 2)] = std::numeric_limits<float>::quiet_NaN();
            std::vector<float> dtoken = uniform(static_cast<std::size_t>(vocab * C), -1.0f, 1.0f, rng);
            std::vector<float> dposition = uniform(static_cast<std::size_t>((T + 3) * C), -1.0f, 1.0f, rng);
            std::vector<float> sim_dtoken = dtoken, sim_dposition = dposition;
            check_report(check_tokens(tokens, std::numeric_limits<std::int64_t>::max(), cap), tokens,
                         std::numeric_limits<std::int64_t>::max());
            for (int call = 1; call <= 2; ++call) {
                CAPTURE(call);
                host::embedding_backward(tokens.data(), dout.data(), dtoken.data(), dposition.data(), B, T, C);
                slice_backward(tokens, dout, sim_dtoken, sim_dposition, T, C, 0, std::numeric_limits<std::int64_t>::max(),
                               cap);
                // NaN meets NaN with any payload (the GPU's is canonical), only where the NaN went.
                CHECK_NO_MISMATCHES("dtoken_table", compare_floats(sim_dtoken, dtoken, with_nan));
                CHECK_NO_MISMATCHES("dposition_table", compare_floats(sim_dposition, dposition, with_nan));
            }

            const std::vector<float> finite_dout = loom_test::wide_range(static_cast<std::size_t>(n * C), rng);
            for (const auto [start, stop] : loom_test::vocabulary_slices(vocab)) {
                CAPTURE(start, stop);
                std::vector<float> slice = uniform(static_cast<std::size_t>((stop - start) * C), -1.0f, 1.0f, rng);
                std::vector<float> sim_slice = slice, sim_positions = dposition;
                host::embedding_slice_backward(tokens.data(), finite_dout.data(), slice.data(), dposition.data(), n, T,
                                               C, start, stop);
                slice_backward(tokens, finite_dout, sim_slice, sim_positions, T, C, start, stop, cap);
                CHECK_NO_MISMATCHES("dtoken slice", compare_floats(sim_slice, slice, false));
                CHECK_NO_MISMATCHES("dposition", compare_floats(sim_positions, dposition, false));
            }
        }
}

// The check the launchers read back before anything is written: the least
// bad position over every block (bad ids placed so that the least is not in
// block 0, and a later block finds one too), the id there, the largest id.
TEST_CASE("simulated embedding token check reports the first bad position and the largest id",
          "[simulated][embedding]") {
    std::mt19937 rng(1104);
    const std::int64_t vocab = 97;
    std::vector<std::int32_t> tokens = loom_test::repeated_tokens(3 * 1025, vocab, rng);
    for (const unsigned cap : {launcher_grid, 3u}) {
        CAPTURE(cap);
        check_report(check_tokens(tokens, vocab, cap), tokens, vocab);
        std::vector<std::int32_t> bad = tokens;
        bad[2900] = -5;             // block 2 of the capped grid, 11 of the launcher's
        bad[300] = 97;              // block 1 of either grid: the least
        bad[300 + 3 * 256] = 98;    // the same thread of the capped grid, on its next turn
        bad[1000 + 3 * 256] = 500;  // block 0 of the capped grid, on the third turn of its stride
        const auto report = check_tokens(bad, vocab, cap);
        check_report(report, bad, vocab);
        CHECK(report.first_bad == 300);
        CHECK(report.bad_token == 97);
        CHECK(report.max_token == 500);
        // The backward's check: only the negative id is bad.
        const auto negative = check_tokens(bad, std::numeric_limits<std::int64_t>::max(), cap);
        CHECK(negative.first_bad == 2900);
        CHECK(negative.bad_token == -5);
    }
    check_report(check_tokens({}, vocab, launcher_grid), {}, vocab);  // n = 0: no bad position, no largest id
}

// The CUDA test's cases: words (k indices, then k value bits) with a sentinel
// past them, residuals separate, in place and absent.
TEST_CASE("simulated pack_top_k selects the host's elements: words and residuals bit for bit",
          "[simulated][top_k]") {
    std::mt19937 rng(1201);
    std::vector<std::int32_t> host_scratch;
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, (std::int64_t{1} << 20) + 3})
        for (int kind = 0; kind < 3; ++kind) {
            const std::vector<float> x = loom_test::top_k_inputs(n, kind, rng);
            for (const std::int64_t k : {std::int64_t{1}, std::max<std::int64_t>(1, n / 100), n})
                for (const unsigned cap : {launcher_grid, 3u}) {
                    CAPTURE(n, kind, k, cap);
                    const auto word_count = static_cast<std::size_t>(host::top_k_words(k));
                    std::vector<std::uint32_t> expected(word_count + 1, sentinel);
                    std::vector<float> expected_residual(x.size(), 8.0f);
                    host::pack_top_k(x.data(), n, k, expected.data(), host_scratch, expected_residual.data());
                    REQUIRE(expected.back() == sentinel);

                    std::vector<std::uint32_t> words(word_count + 1, sentinel), in_place_words = words,
                                                                                alone = words;
                    std::vector<float> residual(x.size(), loom_test::from_bits(0x5a5a'5a5au)), in_place = x;
                    pack_top_k(x, k, words, residual.data(), cap);
                    pack_top_k(in_place, k, in_place_words, in_place.data(), cap);
                    pack_top_k(x, k, alone, nullptr, cap);
                    CHECK_NO_MISMATCHES("words", compare_words(words, expected));
                    CHECK_NO_MISMATCHES("words, residual in place", compare_words(in_place_words, expected));
                    CHECK_NO_MISMATCHES("words, no residual", compare_words(alone, expected));
                    CHECK_NO_MISMATCHES("residual", compare_floats(residual, expected_residual, false));
                    CHECK_NO_MISMATCHES("residual in place", compare_floats(in_place, expected_residual, false));
                }
        }
    for (const std::vector<float>& x : loom_test::top_k_hand_picked()) {
        const auto n = static_cast<std::int64_t>(x.size());
        for (std::int64_t k = 0; k <= n; ++k) {
            CAPTURE(x, k);
            std::vector<std::uint32_t> expected(static_cast<std::size_t>(host::top_k_words(k)) + 1, 7u);
            host::pack_top_k(x.data(), n, k, expected.data(), host_scratch);
            std::vector<std::uint32_t> words(expected.size(), 7u);
            pack_top_k(x, k, words, nullptr, launcher_grid);
            CHECK_NO_MISMATCHES("words", compare_words(words, expected));
        }
    }
}

// Unpacking messages the host packed (increasing indices: a thread per pair)
// and one with repeated and decreasing indices (one thread, pair order), with
// weights whose products round; and the check's report of a corrupted index.
TEST_CASE("simulated unpack_top_k_add equals the host's bit for bit, and its check finds bad pairs",
          "[simulated][top_k]") {
    std::mt19937 rng(1301);
    std::vector<std::int32_t> host_scratch;
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, (std::int64_t{1} << 20) + 3}) {
        const std::vector<float> x = loom_test::top_k_inputs(n, 0, rng);
        const std::vector<float> start = uniform(x.size(), -1.0f, 1.0f, rng);
        for (const std::int64_t k : {std::int64_t{1}, std::max<std::int64_t>(1, n / 100), n}) {
            std::vector<std::uint32_t> words(static_cast<std::size_t>(host::top_k_words(k)));
            host::pack_top_k(x.data(), n, k, words.data(), host_scratch);
            for (const unsigned cap : {launcher_grid, 3u}) {
                CAPTURE(n, k, cap);
                const auto report = check_pairs(words, k, n, cap);
                REQUIRE(report.first_bad == k);
                REQUIRE(report.first_unordered == k);
                for (const float weight : {1.0f, 0.5f, 0.3f}) {
                    CAPTURE(weight);
                    std::vector<float> expected = start, out = start;
                    host::unpack_top_k_add(words.data(), k, n, expected.data(), weight);
                    scatter(words, k, true, out, weight, cap);
                    CHECK_NO_MISMATCHES("out", compare_floats(out, expected, true));
                }
            }
        }
    }

    const std::vector<std::uint32_t> repeated{2, 2, 5, 2, 1, 0,
                                              loom_test::bits_of(0.1f), loom_test::bits_of(1e8f),
                                              loom_test::bits_of(-3.0f), loom_test::bits_of(-1e8f),
                                              loom_test::bits_of(0.7f), loom_test::bits_of(2.5f)};
    const auto report = check_pairs(repeated, 6, 6, launcher_grid);
    CHECK(report.first_bad == 6);
    CHECK(report.first_unordered == 1);
    for (const float weight : {1.0f, 0.5f, 0.3f}) {
        CAPTURE(weight);
        std::vector<float> expected{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}, out = expected;
        host::unpack_top_k_add(repeated.data(), 6, 6, expected.data(), weight);
        scatter(repeated, 6, false, out, weight, launcher_grid);
        CHECK_NO_MISMATCHES("out, repeated indices", compare_floats(out, expected, false));
    }

    // Indices past n at pairs 700 (block 2 of either grid: the first) and
    // 900 (block 0 of the capped grid, on its second turn); an index going
    // down at pair 400.
    const std::int64_t k = 1000, n = 5000;
    std::vector<std::uint32_t> corrupted(2 * k);
    for (std::int64_t j = 0; j < k; ++j) corrupted[static_cast<std::size_t>(j)] = static_cast<std::uint32_t>(3 * j);
    corrupted[900] = 7000;
    corrupted[700] = 5000;
    corrupted[400] = 2;
    for (const unsigned cap : {launcher_grid, 3u}) {
        CAPTURE(cap);
        const auto bad = check_pairs(corrupted, k, n, cap);
        CHECK(bad.first_bad == 700);
        CHECK(bad.bad_index == 5000);
        CHECK(bad.first_unordered == 400);
    }
}
