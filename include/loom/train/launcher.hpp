// What a launcher (mpirun, srun) tells each process in its environment: that
// it was launched, its rank (in the world and on its node) and the world's size. A program reads them before
// MPI is initialized, so an error every process finds identically (a bad
// flag, degrees that do not fit the world, a size memory cannot hold) can be
// printed once, by rank 0, and every process can exit without ever starting
// MPI: no process waits for another, and the launcher sees no abort.
#pragma once

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <thread>

#include "loom/core/error.hpp"

namespace loom::train {

namespace detail {

// The first of `variables` that is set and holds a whole number >= 0, or -1.
[[nodiscard]] inline int first_number_in(std::initializer_list<const char*> variables) {
    for (const char* variable : variables) {
        const char* text = std::getenv(variable);
        if (text == nullptr || *text == '\0') continue;
        char* end = nullptr;
        const long value = std::strtol(text, &end, 10);
        if (*end == '\0' && value >= 0 && value <= 1 << 30) return static_cast<int>(value);
    }
    return -1;
}

}  // namespace detail

// mpirun (Open MPI, MPICH's Hydra) and srun name the process's world.
[[nodiscard]] inline bool launched_by_mpi() {
    for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
        if (std::getenv(variable) != nullptr) return true;
    return false;
}

// This process's rank in the launcher's world; 0 when not launched (or when
// the launcher does not say, so a message is printed rather than lost).
[[nodiscard]] inline int launcher_rank() {
    const int rank = detail::first_number_in({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"});
    return rank < 0 ? 0 : rank;
}

// The number of processes the launcher started; 1 when not launched, 0 when
// launched by one that does not say (the caller then checks after MPI starts).
[[nodiscard]] inline int launcher_world_size() {
    if (!launched_by_mpi()) return 1;
    const int size = detail::first_number_in({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"});
    return size < 0 ? 0 : size;
}

// This process's rank among those the launcher started on its node, and the
// variable that says so (a GPU per process: comm::device_of_local_rank);
// rank -1 when no launcher says. A value that is not a whole number from 0
// is refused by name.
struct LocalRank {
    int rank = -1;
    const char* variable = "";
};
[[nodiscard]] inline LocalRank launcher_local_rank() {
    for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "PMI_LOCAL_RANK"})
        if (const char* value = std::getenv(variable)) {
            char* end = nullptr;
            const long rank = std::strtol(value, &end, 10);
            LOOM_CHECK(end != value && *end == '\0' && rank >= 0 && rank <= 1'000'000, variable, " = '", value,
                       "' is not a local rank (a whole number from 0)");
            return {static_cast<int>(rank), variable};
        }
    return {};
}

// Called by a process that found an error every process finds alike, before
// MPI starts, and is about to exit 1 without printing it. Rank 0 prints it; a
// launcher ends the whole job as soon as any process exits non-zero, so a
// rank that exited first could have rank 0 killed before it printed. Waiting
// here a few seconds lets rank 0 speak and end the job; were rank 0 not to
// fail (an error only this process saw, such as a file its node lacks), the
// job still ends, a few seconds later, by this exit.
inline void let_rank_zero_report_first(std::chrono::milliseconds wait = std::chrono::seconds(5)) {
    if (!launched_by_mpi() || launcher_rank() == 0) return;
    std::this_thread::sleep_for(wait);
}

}  // namespace loom::train
