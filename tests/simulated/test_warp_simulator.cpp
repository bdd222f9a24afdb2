// The warp simulator itself (warp_simulator.hpp): that its shuffles hand
// each lane the value CUDA's would, that its barriers order a block's
// threads, and that a read no barrier orders shows (as NaN from the
// NaN-filled shared memory) instead of passing by luck. The simulated kernel
// tests are only as good as these.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
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
