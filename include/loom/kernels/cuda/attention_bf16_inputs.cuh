// attention_forward_bf16_inputs and attention_backward_bf16_inputs: causal
// multi-head attention at MatmulPrecision::bf16 on the device, as the host's
// emulation (kernels/host/attention_bf16.hpp), run by the kernels that
// LOOM_CUDA_ATTENTION chooses (kernels/bf16_attention_kernels.hpp): the
// mma.sync kernels of attention_mma.cuh (the default) or the wmma kernels of
// attention_bf16.cuh. Arguments, checks and messages are the f32 kernels'
// (kernels/cuda/attention.cuh) whichever runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "loom/kernels/bf16_attention_kernels.hpp"
#include "loom/kernels/cuda/attention_bf16.cuh"
#include "loom/kernels/cuda/attention_mma.cuh"
#include "loom/kernels/cuda/stream_scratch.cuh"

namespace loom::kernels::cuda {

// qkv [B, T, 3C] in, out [B, T, C] and lse [B, H, T] written, all f32 on the
// device; D <= 128.
inline void attention_forward_bf16_inputs(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                                          std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr,
                                          Bf16AttentionKernels kernels = bf16_attention_kernels()) {
    if (kernels == Bf16AttentionKernels::mma)
        attention_forward_bf16_mma(qkv, out, lse, B, T, H, D, stream);
    else
        attention_forward_bf16_wmma(qkv, out, lse, B, T, H, D, stream);
}

// dqkv [B, T, 3C], written. The mma kernels keep D_i (B H T floats) in
// `scratch`, or in a scratch of their own for the call when none is given.
inline void attention_backward_bf16_inputs(const float* qkv, const float* out, const float* dout, const float* lse,
                                           float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                           std::int64_t D, cudaStream_t stream = nullptr,
                                           StreamScratch* scratch = nullptr,
                                           Bf16AttentionKernels kernels = bf16_attention_kernels()) {
    if (kernels != Bf16AttentionKernels::mma) {
        attention_backward_bf16_wmma(qkv, out, dout, lse, dqkv, B, T, H, D, stream);
        return;
    }
    std::optional<StreamScratch> own;  // freed in stream order after the launches that use it
    attention_backward_bf16_mma(qkv, out, dout, lse, dqkv, B, T, H, D, scratch != nullptr ? *scratch : own.emplace(),
                                stream);
}

}  // namespace loom::kernels::cuda
