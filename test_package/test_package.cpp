// Compiles loom's headers, links every requested backend, prints the version
// and fails if it is not the one the package was created with.
#include <loom/core/error.hpp>
#include <loom/version.hpp>

#include <iostream>
#include <string>

#if defined(LOOM_TEST_MPI)
#include <mpi.h>
#endif
#if defined(LOOM_TEST_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(LOOM_TEST_NCCL)
#include <nccl.h>
#endif

int main() {
    const auto v = loom::version;
    const std::string version =
        std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
    std::cout << "loom " << version << "\n";
    try {
        LOOM_CHECK(version == LOOM_EXPECTED_VERSION, "headers say ", version, ", package says ",
                   LOOM_EXPECTED_VERSION);
    } catch (const loom::Error& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
    // Calls that are valid before any initialisation and need no device: they
    // prove that each backend's headers and libraries reached this program.
#if defined(LOOM_TEST_MPI)
    int mpi_major = 0, mpi_minor = 0;
    MPI_Get_version(&mpi_major, &mpi_minor);
    std::cout << "MPI standard " << mpi_major << "." << mpi_minor << "\n";
#endif
#if defined(LOOM_TEST_CUDA)
    int cuda_runtime = 0;
    cudaRuntimeGetVersion(&cuda_runtime);
    std::cout << "CUDA runtime " << cuda_runtime << "\n";
#endif
#if defined(LOOM_TEST_NCCL)
    int nccl = 0;
    ncclGetVersion(&nccl);
    std::cout << "NCCL " << nccl << "\n";
#endif
    return 0;
}
