// The CUDA and cuBLAS check macros: the message names the call, the library's
// error name and string, and the place. Needs no device, only the runtime.
#include <catch2/catch.hpp>

#include <loom/core/check_cuda.hpp>

#include <string>

TEST_CASE("LOOM_CUDA_CHECK names the call, the error and the place", "[check]") {
    try {
        LOOM_CUDA_CHECK(cudaErrorInvalidValue);
        FAIL("LOOM_CUDA_CHECK did not throw");
    } catch (const loom::Error& e) {
        const std::string what = e.what();
        CHECK(e.message() == "cudaErrorInvalidValue failed: cudaErrorInvalidValue (invalid argument)");
        CHECK_THAT(what, Catch::Contains("tests/cuda/test_check_cuda.cpp:"));
    }
    CHECK_NOTHROW([] { LOOM_CUDA_CHECK(cudaSuccess); }());
}

TEST_CASE("LOOM_CUBLAS_CHECK names the status", "[check]") {
    try {
        LOOM_CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
        FAIL("LOOM_CUBLAS_CHECK did not throw");
    } catch (const loom::Error& e) {
        CHECK_THAT(e.message(), Catch::StartsWith("CUBLAS_STATUS_NOT_INITIALIZED failed: CUBLAS_STATUS_NOT_INITIALIZED"));
    }
}

#ifdef LOOM_TEST_NCCL
#include <loom/core/check_nccl.hpp>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("LOOM_NCCL_CHECK names the call and NCCL's error string", "[check]") {
    try {
        LOOM_NCCL_CHECK(ncclInvalidArgument);
        FAIL("LOOM_NCCL_CHECK did not throw");
    } catch (const loom::Error& e) {
        CHECK_THAT(e.message(), Catch::StartsWith("ncclInvalidArgument failed: invalid argument"));
    }
}
#endif

}  // namespace LOOM_TEST_FILE
