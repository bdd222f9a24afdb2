// The warp simulator itself (warp_simulator.hpp): that its shuffles and
// ballots hand each lane the value CUDA's would (full warps, half-warp
// masks, widths), that its barriers order a block's threads, that a read no
// barrier orders shows (as NaN from the NaN-filled shared memory, dynamic
// and static) instead of passing by luck, and that its tensor-core
// operations (ldmatrix, mma.sync, wmma stores) lay fragments out as the GPU
// does. What stops a simulated process, and the turn orders:
// test_warp_simulator_stops.cpp. The simulated kernel tests are only as good
// as these.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "simulated/warp_simulator.hpp"

TEST_CASE("the warp simulator's shuffles hand each lane the value CUDA's do, within its own warp",
          "[simulated][simulator]") {
    constexpr int threads = 128;
    std::vector<float> from_lane_3(threads), from_xor_5(threads);
    std::vector<double> wide(threads);
    loom_sim::launch(loom_sim::Grid{2, 1}, threads, 0, [&] {
        const int t = static_cast<int>(threadIdx.x);
        const auto mine = static_cast<float>(1000 * blockIdx.x + t);
        const float a = __shfl_sync(0xffff'ffffu, mine, 3);
        const float b = __shfl_xor_sync(0xffff'ffffu, mine, 5);
        const double c = __shfl_xor_sync(0xffff'ffffu, static_cast<double>(mine) + 0.5, 16);
        if (blockIdx.x == 1) {
            from_lane_3[static_cast<std::size_t>(t)] = a;
            from_xor_5[static_cast<std::size_t>(t)] = b;
            wide[static_cast<std::size_t>(t)] = c;
        }
    });
    for (int t = 0; t < threads; ++t) {
        INFO("thread " << t);
        const int warp_base = t / 32 * 32;
        CHECK(from_lane_3[static_cast<std::size_t>(t)] == static_cast<float>(1000 + warp_base + 3));
        CHECK(from_xor_5[static_cast<std::size_t>(t)] == static_cast<float>(1000 + (t ^ 5)));
        CHECK(wide[static_cast<std::size_t>(t)] == 1000.5 + (t ^ 16));
    }
}

TEST_CASE("the warp simulator's half-warp shuffles and ballots follow their masks and widths",
          "[simulated][simulator]") {
    // Each half-warp on its own mask, as pack_signs' groups of 16 lanes: a
    // shuffle of width 16 from lane 3 of the half, and a ballot of the odd
    // lanes; the lanes of the other half never take part.
    constexpr int threads = 64;
    std::vector<float> from_lane_3(threads);
    std::vector<unsigned> ballots(threads);
    loom_sim::launch(loom_sim::Grid{}, threads, 0, [&] {
        const int t = static_cast<int>(threadIdx.x), lane = t % 32;
        const unsigned half = 0xffffu << (lane / 16 * 16);
        from_lane_3[static_cast<std::size_t>(t)] = __shfl_sync(half, static_cast<float>(t), 3, 16);
        ballots[static_cast<std::size_t>(t)] = __ballot_sync(half, lane % 2);
    });
    for (int t = 0; t < threads; ++t) {
        INFO("thread " << t);
        CHECK(from_lane_3[static_cast<std::size_t>(t)] == static_cast<float>(t / 16 * 16 + 3));
        CHECK(ballots[static_cast<std::size_t>(t)] == (t % 32 < 16 ? 0x0000'aaaau : 0xaaaa'0000u));
    }
}

TEST_CASE("the warp simulator's __syncthreads orders a block, and a read it does not order shows as NaN",
          "[simulated][simulator]") {
    constexpr int threads = 256;
    // Each thread writes its slot of dynamic shared memory (NaN until
    // written), then reads its neighbour's: with the barrier between, every
    // neighbour's value; without, the neighbours that had not run yet.
    for (const bool barrier : {true, false}) {
        INFO((barrier ? "with __syncthreads" : "without"));
        std::vector<float> seen(2 * threads, 0.0f);
        loom_sim::launch(loom_sim::Grid{2, 1}, threads, threads * sizeof(float), [&] {
            auto* slots = reinterpret_cast<float*>(loom_sim::block_shared());
            const int t = static_cast<int>(threadIdx.x);
            slots[t] = static_cast<float>(t);
            if (barrier) __syncthreads();
            seen[blockIdx.x * threads + static_cast<unsigned>(t)] = slots[(t + 1) % threads];
        });
        int unordered = 0;
        for (int i = 0; i < 2 * threads; ++i) {
            const float want = static_cast<float>((i % threads + 1) % threads);
            if (std::isnan(seen[static_cast<std::size_t>(i)]))
                ++unordered;
            else
                CHECK(seen[static_cast<std::size_t>(i)] == want);
        }
        if (barrier)
            CHECK(unordered == 0);
        else
            CHECK(unordered > 0);
    }
}

namespace {

// A kernel's shape: a function template holding static __shared__ arrays,
// each declaration followed by the call extract_device_code.py puts after
// every one in the extracted kernels. Each thread records what its slots
// held before it wrote them, and then its neighbour's slot.
template <int Threads>
void static_shared_kernel(float* before, long long* counts_before, float* after) {
    __shared__ float slots[Threads]; loom_sim::fill_static_shared(slots, sizeof slots);
    __shared__ long long counts[Threads]; loom_sim::fill_static_shared(counts, sizeof counts);
    const unsigned t = threadIdx.x, i = blockIdx.x * Threads + t;
    before[i] = slots[t];
    counts_before[i] = counts[t];
    slots[t] = static_cast<float>(1000 * blockIdx.x + t);
    counts[t] = i;
    __syncthreads();
    after[i] = slots[(t + 1) % Threads];
}

template <int Threads>
void static_shared_each_kernel(float* before) {
    __shared__ float slots[Threads]; loom_sim::fill_static_shared(slots, sizeof slots);
    before[blockIdx.x * Threads + threadIdx.x] = slots[threadIdx.x];
    slots[threadIdx.x] = 1.0f;
}

}  // namespace

TEST_CASE("the warp simulator gives every block static __shared__ arrays it has not written as NaN",
          "[simulated][simulator]") {
    // A GPU block's shared memory holds whatever it held: a kernel that
    // reads a static __shared__ array before writing it reads garbage. Here
    // that is NaN (or -1 as an integer) in every block, also after an earlier
    // block wrote the same array, in barrier-free launches too; filled once
    // a block, by the first of its threads to reach the declaration.
    constexpr int threads = 64, blocks = 3;
    std::vector<float> before(blocks * threads, 0.0f), after(blocks * threads, 0.0f);
    std::vector<long long> counts_before(blocks * threads, 0);
    const long fills = loom_sim::static_shared_fills;
    loom_sim::launch(loom_sim::Grid{blocks, 1}, threads, 0,
                     [&] { static_shared_kernel<threads>(before.data(), counts_before.data(), after.data()); });
    CHECK(loom_sim::static_shared_fills - fills == 2 * blocks);
    std::vector<float> each_before(blocks * threads, 0.0f);
    loom_sim::launch_each(loom_sim::Grid{blocks, 1}, threads, [&] { static_shared_each_kernel<threads>(each_before.data()); });
    for (unsigned i = 0; i < blocks * threads; ++i) {
        INFO("block " << i / threads << ", thread " << i % threads);
        CHECK(std::isnan(before[i]));
        CHECK(counts_before[i] == -1);
        CHECK(after[i] == static_cast<float>(1000 * (i / threads) + (i % threads + 1) % threads));
        CHECK(std::isnan(each_before[i]));
    }
}

TEST_CASE("the warp simulator's mma.m16n8k16 multiplies fragments loaded by ldmatrix as the PTX ISA lays them out",
          "[simulated][simulator]") {
    // A 16 x 16 A and a 16 x 8 B, stored row-major in "shared memory" (B also
    // stored transposed), loaded the way every kernel does, multiplied once:
    // each lane's four results must be the matching entries of A B. This
    // checks the simulator itself against a product written out plainly.
    std::vector<__nv_bfloat16> a(16 * 16), b(16 * 8), bt(8 * 16);
    auto value = [](int i) { return static_cast<float>(i % 7 - 3) * 0.5f; };
    for (int i = 0; i < 16 * 16; ++i) a[i] = __float2bfloat16_rn(value(i));
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 8; ++n) {
            b[k * 8 + n] = __float2bfloat16_rn(value(3 * k + 5 * n + 1));
            bt[n * 16 + k] = b[k * 8 + n];
        }
    std::vector<float> from_rows(16 * 8, NAN), from_columns(16 * 8, NAN);
    const long bad_before = loom_sim::bad_ldmatrix_rows;
    long bad_misaligned = 0;
    loom_sim::launch(1, 1024, [&] {
        if (threadIdx.x >= 32) return;  // one warp
        auto* shared = reinterpret_cast<__nv_bfloat16*>(loom_sim::block_shared());
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        if (lane == 0) {  // A at byte 0, B stored [n][k] at 512, B stored [k][n] at 768
            std::copy(a.begin(), a.end(), shared);
            std::copy(bt.begin(), bt.end(), shared + 256);
            std::copy(b.begin(), b.end(), shared + 384);
        }
        __syncwarp();  // lane 0's stores before every lane's ldmatrix
        unsigned fa[4], fb[4], fbt[4];
        // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
        loom_sim::ldmatrix_x4<false>(fa, shared + (lane % 8 + (lane / 8) % 2 * 8) * 16 + lane / 16 * 8);
        // B stored [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16-31 repeat them.
        loom_sim::ldmatrix_x4<false>(fbt, shared + 256 + (lane % 8) * 16 + (lane / 8) % 2 * 8);
        // B stored [k][n], transposed on the load: matrices (k 0-7), (k 8-15).
        loom_sim::ldmatrix_x4<true>(fb, shared + 384 + (lane % 8 + (lane / 8) % 2 * 8) * 8);
        // And the guard: rows 2 bytes off their 16-byte pieces are counted, one per lane.
        const long good = loom_sim::bad_ldmatrix_rows;
        loom_sim::warp_barrier();  // every lane has read it before any adds to it
        unsigned ignored[4];
        loom_sim::ldmatrix_x4<false>(ignored, shared + 1 + lane * 8);
        if (lane == 0) bad_misaligned = loom_sim::bad_ldmatrix_rows - good;
        loom_sim::warp_barrier();
        if (lane == 0) loom_sim::bad_ldmatrix_rows = good;
        float c1[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0};
        loom_sim::mma_m16n8k16(c1, fa, fbt[0], fbt[1]);
        loom_sim::mma_m16n8k16(c2, fa, fb[0], fb[1]);
        for (int e = 0; e < 4; ++e) {
            from_rows[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = c1[e];
            from_columns[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = c2[e];
        }
    });
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            float want = 0.0f;
            for (int k = 0; k < 16; ++k)
                want += loom::detail::bf16_bits_to_float(a[m * 16 + k].bits) *
                        loom::detail::bf16_bits_to_float(b[k * 8 + n].bits);
            INFO("C[" << m << "][" << n << "]");
            CHECK(from_rows[m * 8 + n] == want);
            CHECK(from_columns[m * 8 + n] == want);
        }
    CHECK(bad_misaligned == 32);
    CHECK(loom_sim::bad_ldmatrix_rows == bad_before);
}

TEST_CASE("the warp simulator's wmma stores write each lane's share of the matrix, as an sm_80 accumulator holds it",
          "[simulated][simulator]") {
    // Until every lane has stored, a lane reading the matrix finds only the
    // elements it holds (rows g and g + 8, columns 2t, 2t + 1, 2t + 8 and
    // 2t + 9 of lane 4g + t); the rest is what was there (NaN here). After a
    // __syncwarp every lane finds the whole matrix.
    std::vector<int> written_before(32, 0);
    std::vector<int> mine_before(32, 0), whole_after(32, 0);
    loom_sim::launch(loom_sim::Grid{}, 32, 16 * 16 * sizeof(float), [&] {
        auto* matrix = reinterpret_cast<float*>(loom_sim::block_shared());
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> c;
        for (int e = 0; e < 256; ++e) c.x[e] = static_cast<float>(e);
        nvcuda::wmma::store_matrix_sync(matrix, c, 16, nvcuda::wmma::mem_row_major);
        for (int e = 0; e < 256; ++e) {
            if (std::isnan(matrix[e])) continue;
            ++written_before[static_cast<std::size_t>(lane)];
            const int row = e / 16, column = e % 16;
            if (row % 8 == g && column % 8 / 2 == t && matrix[e] == static_cast<float>(e))
                ++mine_before[static_cast<std::size_t>(lane)];
        }
        __syncwarp();
        for (int e = 0; e < 256; ++e)
            if (matrix[e] == static_cast<float>(e)) ++whole_after[static_cast<std::size_t>(lane)];
    });
    // The turn order runs lane 0 first: it finds its 8 elements alone; lane
    // 31, last, finds every lane's.
    CHECK(written_before[0] == 8);
    CHECK(mine_before[0] == 8);
    CHECK(written_before[31] == 256);
    for (int lane = 0; lane < 32; ++lane) {
        INFO("lane " << lane);
        CHECK(mine_before[static_cast<std::size_t>(lane)] == 8);
        CHECK(whole_after[static_cast<std::size_t>(lane)] == 256);
    }
}
