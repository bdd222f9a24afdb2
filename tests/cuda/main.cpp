// Catch2 main for the CUDA tests. Without a usable CUDA device it prints why
// and exits 77, which ctest reports as "skipped", never as "passed".
// `--no-device` runs the tests that need only the CUDA runtime library.
#include "catch_session.hpp"
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
    std::vector<char*> args(argv, argv + argc);
    bool no_device = false;
    for (auto it = args.begin() + 1; it != args.end(); ++it) {
        if (std::strcmp(*it, "--no-device") == 0) {
            no_device = true;
            args.erase(it);
            break;
        }
    }
    if (!no_device) {
        int devices = 0;
        const cudaError_t status = cudaGetDeviceCount(&devices);
        if (status != cudaSuccess || devices == 0) {
            std::printf("SKIPPED: no usable CUDA device (cudaGetDeviceCount: %s, %d devices); "
                        "the CUDA tests were compiled but not run\n",
                        status == cudaSuccess ? "ok" : cudaGetErrorString(status), devices);
            return 77;
        }
        cudaDeviceProp props{};
        if (cudaGetDeviceProperties(&props, 0) == cudaSuccess)
            std::printf("CUDA device 0: %s (sm_%d%d)\n", props.name, props.major, props.minor);
    }
    return loom_test::run_catch(static_cast<int>(args.size()), args.data());
}
