// LOOM_CUDA_CHECK and LOOM_CUBLAS_CHECK: turn a failed CUDA runtime or cuBLAS
// call into loom::Error naming the call, the library's error string and the
// place. Needs the CUDA toolkit (link loom::cuda); host compilers can use it.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "loom/core/error.hpp"

namespace loom::detail {

[[noreturn]] inline void cuda_failed(cudaError_t code, const char* call, ::loom::SourceLocation where) {
    throw Error(concat(call, " failed: ", cudaGetErrorName(code), " (", cudaGetErrorString(code),
                                ")"),
                where);
}

[[noreturn]] inline void cublas_failed(cublasStatus_t code, const char* call, ::loom::SourceLocation where) {
    throw Error(concat(call, " failed: ", cublasGetStatusName(code), " (", cublasGetStatusString(code),
                                ")"),
                where);
}

}  // namespace loom::detail

#define LOOM_CUDA_CHECK(call)                                                                \
    do {                                                                                     \
        const cudaError_t loom_cuda_status_ = (call);                                        \
        if (loom_cuda_status_ != cudaSuccess) [[unlikely]]                                   \
            ::loom::detail::cuda_failed(loom_cuda_status_, #call, ::loom::SourceLocation::current()); \
    } while (false)

#define LOOM_CUBLAS_CHECK(call)                                                              \
    do {                                                                                     \
        const cublasStatus_t loom_cublas_status_ = (call);                                   \
        if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                       \
            ::loom::detail::cublas_failed(loom_cublas_status_, #call, ::loom::SourceLocation::current()); \
    } while (false)
