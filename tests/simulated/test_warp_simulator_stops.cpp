// What stops a simulated process, each case in a child process of its own:
// threads meeting at different __syncthreads (both places named), a
// warp-wide load of shared memory that no barrier of its warp ordered (its
// lanes' writes with only a shuffle between, another warp's with only a
// __syncwarp), two warps writing one byte between two __syncthreads, and a
// thread overflowing its stack (its guard page); each lets what is ordered
// run to its end. Also here, in this process: that each turn order runs the
// warps as it says (the orders these stops depend on).
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
    CHECK(end.message.find("test_warp_simulator_stops.cpp") != std::string::npos);
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
