// attention_forward_bf16_inputs and attention_backward_bf16_inputs: causal
// multi-head attention at MatmulPrecision::bf16 on the device, as the host's
// emulation (kernels/host/attention_bf16.hpp), run by the mma.sync kernels of
// attention_mma.cuh. Arguments, checks and messages are the f32 kernels'
// (kernels/cuda/attention.cuh). The entry points the CUDA backend calls:
// which kernels stand behind them is this header's business alone. (The
// first, wmma, kernels are a reference in dev/kernel_lab, not a choice here:
// docs/design.md says why.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "loom/kernels/cuda/attention_mma.cuh"
#include "loom/kernels/cuda/stream_scratch.cuh"

namespace loom::kernels::cuda {

// qkv [B, T, 3C] in, out [B, T, C] and lse [B, H, T] written, all f32 on the
// device; D <= 128.
inline void attention_forward_bf16_inputs(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                                          std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr) {
    attention_forward_bf16_mma(qkv, out, lse, B, T, H, D, stream);
}

// dqkv [B, T, 3C], written. D_i (B H T floats) lives in `scratch`, or in a
// scratch of the call's own when none is given.
inline void attention_backward_bf16_inputs(const float* qkv, const float* out, const float* dout, const float* lse,
                                           float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                           std::int64_t D, cudaStream_t stream = nullptr,
                                           StreamScratch* scratch = nullptr) {
    std::optional<StreamScratch> own;  // freed in stream order after the launches that use it
    attention_backward_bf16_mma(qkv, out, dout, lse, dqkv, B, T, H, D, scratch != nullptr ? *scratch : own.emplace(),
                                stream);
}

}  // namespace loom::kernels::cuda
