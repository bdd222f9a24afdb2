// Catch2 main for tests run under mpirun: every rank runs the same tests, and
// the process exit code is the worst over all ranks, so one rank's failure
// fails the run on every rank instead of leaving the others to hang or pass.
#include "catch_session.hpp"
#include <mpi.h>

#include <cstdio>

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    // Errors come back as codes (and become loom::Error) instead of aborting.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);

    // Every rank runs and reports its own failures.
    int result = loom_test::run_catch(argc, argv);

    int worst = 0;
    MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) std::printf("mpi: worst result over all ranks: %d\n", worst);
    MPI_Finalize();
    return worst;
}
