// MpiSession: MPI's lifetime in one process (MPI_Init_thread .. MPI_Finalize),
// and the end of the job after a communicator fault. A broken communicator
// still has collectives in flight that MPI cannot cancel, and MPI_Finalize may
// wait for them (or for a rank that never arrives) forever, so after a fault
// the session first lets every process reach its own end (where the fault has
// been printed), then calls MPI_Abort: the job ends, with a non-zero status.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string_view>
#include <thread>

#include "loom/comm/control_mpi.hpp"
#include "loom/core/check_mpi.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

struct MpiSessionOptions {
    // loom calls MPI only from the thread that calls a communicator, one call
    // at a time; MPI_THREAD_SERIALIZED lets that thread change.
    int thread_level = MPI_THREAD_SERIALIZED;
    // After a fault: how long to wait for the other processes to reach the end
    // of their sessions (and print their errors) before aborting the job.
    std::chrono::milliseconds exit_timeout{std::chrono::seconds(10)};
};

namespace detail {

[[nodiscard]] constexpr std::string_view thread_level_name(int level) {
    switch (level) {
        case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
        case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
        case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
        case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
        default: return "an unknown thread level";
    }
}

}  // namespace detail

// One per process, created before any other MPI call and destroyed after
// every communicator:
//   int main(int argc, char** argv) {
//       loom::comm::MpiSession session(argc, argv);
//       auto comm = loom::comm::Mpi::world();
//       comm.run([&](loom::comm::Mpi& c) { ... });
//   }
class MpiSession {
public:
    explicit MpiSession(MpiSessionOptions options = {}) : MpiSession(nullptr, nullptr, options) {}
    MpiSession(int& argc, char**& argv, MpiSessionOptions options = {}) : MpiSession(&argc, &argv, options) {}
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;

    ~MpiSession() {
        if (detail::mpi_finalized()) return;  // someone else ended MPI; nothing is left to do
        std::fflush(nullptr);  // what this process printed leaves before anyone aborts
        int mine = mpi_fault_happened() ? 1 : 0;
        int any = mine;
        // Every process learns whether any process saw a fault: a process the
        // fault never reached (it never called again) must abort too.
        MPI_Request request = MPI_REQUEST_NULL;
        if (MPI_Iallreduce(&mine, &any, 1, MPI_INT, MPI_MAX, exit_, &request) == MPI_SUCCESS) {
            const auto give_up = std::chrono::steady_clock::now() + options_.exit_timeout;
            for (int done = 0; done == 0;) {
                if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
                // A healthy process waits as long as MPI_Finalize would; a
                // faulted one only as long as it was told to.
                if (done == 0 && mine != 0 && std::chrono::steady_clock::now() >= give_up) {
                    any = 1;
                    break;
                }
                if (done == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // no core burnt
            }
        } else {
            any = mine;
        }
        if (any != 0) {
            if (rank_ == 0)
                std::fprintf(stderr, "loom: a communicator fault ended this MPI job; MPI cannot continue after one, "
                                     "so the job ends with MPI_Abort\n");
            std::fflush(nullptr);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        MPI_Comm_free(&exit_);
        MPI_Finalize();
    }

    // The thread level MPI provides (at least the one requested).
    [[nodiscard]] int thread_level() const noexcept { return provided_; }
    [[nodiscard]] int world_rank() const noexcept { return rank_; }
    [[nodiscard]] int world_size() const noexcept { return size_; }

private:
    MpiSession(int* argc, char*** argv, MpiSessionOptions options) : options_(options) {
        int initialized = 0;
        LOOM_MPI_CHECK(MPI_Initialized(&initialized));
        LOOM_CHECK(initialized == 0, "MpiSession: MPI is already initialized; create one MpiSession per process, "
                                     "before any other MPI call");
        LOOM_MPI_CHECK(MPI_Init_thread(argc, argv, options.thread_level, &provided_));
        if (provided_ < options.thread_level) {
            MPI_Finalize();
            LOOM_FAIL("MpiSession: MPI provides ", detail::thread_level_name(provided_), " but ",
                      detail::thread_level_name(options.thread_level),
                      " was requested; use an MPI built with thread support or request less");
        }
        // Errors come back as codes (and become loom::Error) instead of aborting.
        LOOM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
        LOOM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
        LOOM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
        // A private communicator for the end of the job, untouched by any fault.
        LOOM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &exit_));
    }

    MpiSessionOptions options_;
    int provided_ = MPI_THREAD_SINGLE;
    int rank_ = 0;
    int size_ = 1;
    MPI_Comm exit_ = MPI_COMM_NULL;
};

}  // namespace loom::comm
