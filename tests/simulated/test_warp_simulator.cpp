// The warp simulator itself (warp_simulator.hpp): that its shuffles and
// ballots hand each lane the value CUDA's would (full warps, half-warp
// masks, widths), that its barriers order a block's threads, that a read no
// barrier orders shows (as NaN from the NaN-filled shared memory, dynamic
// and static) instead of passing by luck, that each turn order runs the
// warps as it says, that threads meeting at different __syncthreads stop the
// process with both named, that a warp-wide load of shared memory that no
// barrier of its warp ordered stops it (its lanes' writes with only a
// shuffle between, another warp's with only a __syncwarp), that two warps
// writing one byte between two __syncthreads stop it, and that a thread
// overflowing its stack faults. The simulated kernel tests are only as good
// as these.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
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

namespace {

// How a child process that ran `body` ended: by a signal (which) or an
// exit (its code), and what it wrote to stderr.
struct ChildEnd {
    bool signaled = false;
    int signal = 0;
    int exit_code = -1;
    std::string message;
};

template <class Body>
ChildEnd run_in_child(Body body) {
    int pipe_ends[2];
    REQUIRE(pipe(pipe_ends) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        // The child dies as the process would, without the test framework's
        // handlers reporting a failure of their own from inside it.
        std::signal(SIGSEGV, SIG_DFL);
        std::signal(SIGABRT, SIG_DFL);
        alarm(60);  // a child that hangs dies by SIGALRM, which fails the checks, rather than hanging the test
        dup2(pipe_ends[1], STDERR_FILENO);
        body();
        _exit(0);
    }
    close(pipe_ends[1]);
    ChildEnd end;
    char buffer[512];
    for (ssize_t got; (got = read(pipe_ends[0], buffer, sizeof buffer)) > 0;)
        end.message.append(buffer, static_cast<std::size_t>(got));
    close(pipe_ends[0]);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    end.signaled = WIFSIGNALED(status);
    if (end.signaled) end.signal = WTERMSIG(status);
    if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
    return end;
}

// A child that must have run to its end (`ordered`: its accesses were
// ordered), or else been stopped with every one of `messages` in its stderr.
void check_ordered_or_stopped(const ChildEnd& end, bool ordered, std::initializer_list<std::string> messages) {
    INFO("the child's stderr: " << end.message);
    if (ordered) {
        CHECK_FALSE(end.signaled);
        CHECK(end.exit_code == 0);
        return;
    }
    CHECK(end.signaled);
    for (const std::string& message : messages) CHECK(end.message.find(message) != std::string::npos);
}

// Lane `lane`'s share of a 16 x 16 bf16 tile: elements 8 lane to 8 lane + 7,
// each its own index.
void write_tile_share(__nv_bfloat16* tile, int lane) {
    for (int e = 8 * lane; e < 8 * lane + 8; ++e) tile[e] = __float2bfloat16_rn(static_cast<float>(e));
}

// The tile loaded as a wmma matrix_a fragment by the calling warp: its last element (255 when written).
float wmma_load_last(const __nv_bfloat16* tile) {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major> a;
    nvcuda::wmma::load_matrix_sync(a, tile, 16);
    return nvcuda::wmma::detail::value_of(a.x[255]);
}

}  // namespace

TEST_CASE("the warp simulator aborts, naming both places, where a block's threads meet at different __syncthreads",
          "[simulated][simulator]") {
    // On a GPU this hangs or misbehaves; here the process stops with a
    // message. Run in a child process, whose stderr and end are checked.
    const ChildEnd end = run_in_child([] {
        loom_sim::launch(loom_sim::Grid{}, 64, 0, [] {
            if (threadIdx.x < 32)
                __syncthreads();
            else
                __syncthreads();
        });
    });
    INFO("the child's stderr: " << end.message);
    CHECK(end.signaled);
    CHECK(end.message.find("met its block or warp at __syncthreads") != std::string::npos);
    CHECK(end.message.find("test_warp_simulator.cpp") != std::string::npos);
}

TEST_CASE("the warp simulator stops a warp-wide load of shared memory that only a shuffle orders after its writes",
          "[simulated][simulator]") {
    // The lanes write a 16 x 16 bf16 tile, eight elements each, exchange a
    // value with a shuffle, and load the tile as a warp: a wmma fragment, or
    // four 8 x 8 matrices with ldmatrix. On a GPU a shuffle orders no memory,
    // so without a __syncwarp before the load a lane may read rows another
    // lane's writes have not reached: the child must stop, naming the load.
    // With the __syncwarp it loads the tile and exits normally.
    for (const bool wmma_load : {true, false})
        for (const bool barrier : {true, false}) {
            const char* load = wmma_load ? "wmma::load_matrix_sync" : "ldmatrix";
            INFO(load << (barrier ? " after __syncwarp" : " after a shuffle only"));
            const ChildEnd end = run_in_child([&] {
                float loaded = 0.0f;
                loom_sim::launch(loom_sim::Grid{}, 32, 16 * 16 * sizeof(__nv_bfloat16), [&] {
                    auto* tile = reinterpret_cast<__nv_bfloat16*>(loom_sim::block_shared());
                    const int lane = static_cast<int>(threadIdx.x);
                    write_tile_share(tile, lane);
                    const float other = __shfl_xor_sync(0xffff'ffffu, static_cast<float>(lane), 1);
                    if (barrier) __syncwarp();
                    if (wmma_load) {
                        const float last = wmma_load_last(tile);
                        if (lane == 0) loaded = last;
                    } else {
                        unsigned r[4];
                        loom_sim::ldmatrix_x4<false>(r, tile + (lane % 16) * 16 + lane / 16 * 8);
                        if (lane == 0) loaded = loom_sim::low_half(r[0]);
                    }
                    loaded += 0.0f * other;
                });
                _exit(loaded == (wmma_load ? 255.0f : 0.0f) ? 0 : 3);
            });
            check_ordered_or_stopped(end, barrier,
                                     {std::string(load) + " by thread", "written by its own lanes since its warp's last",
                                      "no barrier orders that write before this load"});
        }
}

TEST_CASE("the warp simulator's turn orders run warps in step, or one warp ahead of the others",
          "[simulated][simulator]") {
    // Each thread notes its warp and step four times: before and after a
    // shuffle (which its warp meets at), twice, with a __syncthreads after
    // each pair. In sweeps the warps go in step: every thread's note before
    // a shuffle comes before any note after it. In warps the first warp
    // passes its shuffle before the second warp makes its first note, and
    // makes each note after a shuffle before the second warp's; in
    // warps-reversed the same from the second warp.
    struct Note {
        int warp, step;
    };
    // The turn order as it was when the test ends, however it ends.
    struct Restore {
        loom_sim::Turns turns = loom_sim::turns;
        ~Restore() { loom_sim::turns = turns; }
    } restore;
    for (const loom_sim::Turns turns :
         {loom_sim::Turns::sweeps, loom_sim::Turns::warps, loom_sim::Turns::warps_reversed}) {
        INFO("turn order " << static_cast<int>(turns));
        loom_sim::turns = turns;
        std::vector<Note> notes;
        loom_sim::launch(loom_sim::Grid{}, 64, 0, [&] {
            const int warp = static_cast<int>(threadIdx.x / 32);
            for (int round = 0; round < 2; ++round) {
                notes.push_back({warp, 2 * round});
                (void)__shfl_xor_sync(0xffff'ffffu, 0, 1);
                notes.push_back({warp, 2 * round + 1});
                __syncthreads();
            }
        });
        REQUIRE(notes.size() == 256);
        // The first and last place of a note of `step` (by `warp`, or any warp when -1).
        const auto first = [&](int step, int warp) {
            for (std::size_t i = 0; i < notes.size(); ++i)
                if (notes[i].step == step && (warp < 0 || notes[i].warp == warp)) return static_cast<long>(i);
            return -1L;
        };
        const auto last = [&](int step, int warp) {
            for (std::size_t i = notes.size(); i-- > 0;)
                if (notes[i].step == step && (warp < 0 || notes[i].warp == warp)) return static_cast<long>(i);
            return -1L;
        };
        if (turns == loom_sim::Turns::sweeps) {
            CHECK(last(0, -1) < first(1, -1));
            CHECK(last(2, -1) < first(3, -1));
        } else {
            const int ahead = turns == loom_sim::Turns::warps ? 0 : 1, behind = 1 - ahead;
            CHECK(first(1, ahead) < first(0, behind));
            CHECK(last(1, ahead) < first(1, behind));
            CHECK(last(3, ahead) < first(3, behind));
        }
    }
}

TEST_CASE("the warp simulator stops a warp-wide load of another warp's writes that only a __syncwarp orders",
          "[simulated][simulator]") {
    // Warp 0 writes a 16 x 16 bf16 tile; warp 1 opens a __syncwarp and
    // loads the tile with wmma. A __syncwarp orders only its own warp's
    // writes: without a __syncthreads between, warp 1 may load the tile
    // before warp 0's writes reach it, so the child must stop, naming the
    // load. With the __syncthreads it loads the tile and exits normally.
    for (const bool block_barrier : {true, false}) {
        INFO((block_barrier ? "after __syncthreads" : "after __syncwarp only"));
        const ChildEnd end = run_in_child([&] {
            loom_sim::turns = loom_sim::Turns::sweeps;  // warp 0 writes before warp 1 loads
            float loaded = 0.0f;
            loom_sim::launch(loom_sim::Grid{}, 64, 16 * 16 * sizeof(__nv_bfloat16), [&] {
                auto* tile = reinterpret_cast<__nv_bfloat16*>(loom_sim::block_shared());
                const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
                if (warp == 0) write_tile_share(tile, lane);
                if (block_barrier) __syncthreads();
                if (warp == 1) {
                    __syncwarp();
                    const float last = wmma_load_last(tile);
                    if (lane == 0) loaded = last;
                }
            });
            _exit(loaded == 255.0f ? 0 : 3);
        });
        check_ordered_or_stopped(end, block_barrier,
                                 {"wmma::load_matrix_sync by thread 63", "written by warp 0 since the last __syncthreads",
                                  "no barrier orders that write before this load"});
    }
}

TEST_CASE("the warp simulator stops where two warps write one byte of shared memory with no __syncthreads between",
          "[simulated][simulator]") {
    // On a GPU which of the two writes lands last is unspecified. Each warp
    // writes its own number into the same float: with a __syncthreads
    // between the two writes the block runs to the end; without one the
    // child stops, naming the byte and both warps, whether the second write
    // is seen when the block ends or at a __syncthreads that thread 63, the
    // last to arrive, opens just after it.
    enum class Between { block_barrier, nothing, nothing_then_block_barrier };
    for (const Between between : {Between::block_barrier, Between::nothing, Between::nothing_then_block_barrier}) {
        INFO("case " << static_cast<int>(between));
        const ChildEnd end = run_in_child([&] {
            loom_sim::turns = loom_sim::Turns::sweeps;  // warp 0 writes first; thread 63 arrives last
            loom_sim::launch(loom_sim::Grid{}, 64, 2 * sizeof(float), [&] {
                auto* shared = reinterpret_cast<float*>(loom_sim::block_shared());
                const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
                if (warp == 0 && lane == 0) shared[1] = 2.0f;  // bytes 00 00 00 40
                if (between == Between::block_barrier) __syncthreads();
                if (warp == 1 && lane == 31) shared[1] = 0.1f;  // cd cc cc 3d: byte 4 differs
                if (between == Between::nothing_then_block_barrier) __syncthreads();
            });
            _exit(0);
        });
        check_ordered_or_stopped(
            end, between == Between::block_barrier,
            {"warps 0 and 1 of block 0 both wrote byte 4 of shared memory with no __syncthreads between"});
    }
}

TEST_CASE("the warp simulator lets each warp load its own lanes' writes after a __syncwarp while warps interleave",
          "[simulated][simulator]") {
    // Each warp writes a tile of its own, meets at shuffles (so that the
    // turns pass between the warps while they write), opens a __syncwarp and
    // loads its tile: correct code, which must run to the end with every
    // warp's tile whole.
    const loom_sim::Turns orders[] = {loom_sim::Turns::sweeps, loom_sim::Turns::warps, loom_sim::Turns::warps_reversed};
    for (const loom_sim::Turns turns : orders) {
        INFO("turn order " << static_cast<int>(turns));
        const ChildEnd end = run_in_child([&] {
            loom_sim::turns = turns;
            float loaded[2] = {0.0f, 0.0f};
            loom_sim::launch(loom_sim::Grid{}, 64, 2 * 16 * 16 * sizeof(__nv_bfloat16), [&] {
                const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
                auto* tile = reinterpret_cast<__nv_bfloat16*>(loom_sim::block_shared()) + warp * 16 * 16;
                write_tile_share(tile, lane);
                for (int round = 0; round < 3; ++round) (void)__shfl_xor_sync(0xffff'ffffu, lane, 1);
                __syncwarp();
                const float last = wmma_load_last(tile);
                if (lane == 0) loaded[warp] = last;
            });
            _exit(loaded[0] == 255.0f && loaded[1] == 255.0f ? 0 : 3);
        });
        check_ordered_or_stopped(end, true, {});
    }
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

namespace {

// 1 KiB of this frame written at each of `depth` levels: far past a fiber's
// 256 KiB stack for depth 1000.
int deep(int depth) {
    volatile char frame[1024];
    frame[0] = static_cast<char>(depth);
    frame[sizeof frame - 1] = frame[0];
    return depth == 0 ? frame[0] : deep(depth - 1) + frame[sizeof frame - 1];
}

}  // namespace

TEST_CASE("a simulated thread that overflows its stack faults at its guard page", "[simulated][simulator]") {
    // In a child process: recursion a thousand frames of 1 KiB deep must
    // stop the child with SIGSEGV, not run on over the stacks of the fibers
    // below (without the guard pages it does, and the child exits 0).
    const ChildEnd end = run_in_child([&] {
        int sink = 0;
        loom_sim::launch(loom_sim::Grid{}, 32, 0, [&sink] {
            if (threadIdx.x == 31) sink = deep(1000);  // the highest stack: other fibers' lie below it
        });
        _exit(sink == 12345 ? 1 : 0);  // not reached if the guard page works
    });
    CHECK(end.signaled);
    CHECK(end.signal == SIGSEGV);
}
