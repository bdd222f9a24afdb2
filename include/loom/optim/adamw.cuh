// The device AdamW: mirror of the update in optim/adamw.hpp (detail::adamw_blocks):
// f32 master weights, gradients and moments in device memory, updated with the
// per-step scalars the host computes once (optim::detail::adamw_scalars(config,
// step)), so bias corrections and PyTorch's rounding of the settings are
// decided in one place. Optionally writes a bf16 compute copy of each updated
// weight, for the forward and backward passes of the next step.
//
// Bit for bit equal to the host update. Each element takes the host's
// operations in the host's order (PyTorch's _single_tensor_adamw):
//   p *= decay;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g g;
//   denom = sqrt(v) / sqrt(bc2) + eps;  p += neg_step_size m / denom,
// each written with a round-to-nearest intrinsic (__fmul_rn, __fadd_rn,
// __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an FMA, and
// division and square root are correctly rounded on both sides. The host
// matches when it does not contract either: loom builds for baseline x86-64,
// which has no FMA instruction, and adamw_blocks is not a CPU-dispatched loop.
// (A host build with FMA enabled, say -march=native, may round m, v and p
// differently in the last bit; the test then switches to a tolerance.)
// Subnormals are kept, as on the host, under nvcc's default -ftz=false.
//
// The bf16 copy is loom::to_bf16 of the updated weight, the same
// round-to-nearest-even code the host runs (core/dtype.hpp; equal on device,
// tests/cuda/test_dtype_device.cu), so it equals to_bf16 of the host's weight.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/launch.cuh"

#include "loom/optim/adamw.hpp"

namespace loom::optim::cuda {

namespace detail {

// One element per thread of a grid-stride loop. A template (on whether the
// bf16 copy is written) so the header may be included in many translation
// units; params, grads, m, v and params_bf16 do not overlap.
template <bool write_bf16_copy>
__global__ void adamw_kernel(float* __restrict__ params, const float* __restrict__ grads, float* __restrict__ m,
                             float* __restrict__ v, bf16* __restrict__ params_bf16, std::int64_t n,
                             const optim::detail::AdamWScalars s) {
    for (std::int64_t i = kernels::cuda::grid_index(); i < n; i += kernels::cuda::grid_stride()) {
        const float g = grads[i];
        const float decayed = __fmul_rn(params[i], s.decay);
        const float m_new = __fadd_rn(__fmul_rn(s.beta1, m[i]), __fmul_rn(s.one_minus_beta1, g));
        const float v_new = __fadd_rn(__fmul_rn(s.beta2, v[i]), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), s.bias_correction2_sqrt), s.eps);
        const float p_new = __fadd_rn(decayed, __fdiv_rn(__fmul_rn(s.neg_step_size, m_new), denom));
        params[i] = p_new;
        m[i] = m_new;
        v[i] = v_new;
        if constexpr (write_bf16_copy) params_bf16[i] = to_bf16(p_new);
    }
}

}  // namespace detail

// One AdamW step over n elements of device arrays: params (f32 master
// weights), grads, and the moments m and v, all distinct, non-overlapping.
// `scalars` is optim::detail::adamw_scalars(config, step) for this step.
inline void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t n,
                         const optim::detail::AdamWScalars scalars, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::adamw_kernel<false>
        <<<kernels::cuda::blocks_for(n), kernels::cuda::threads_per_block, 0, stream>>>(params, grads, m, v, nullptr,
                                                                                       n, scalars);
    LOOM_CUDA_CHECK_LAUNCH();
}

// adamw_update, and params_bf16[i] = to_bf16(params[i]) of each updated weight
// in the same pass (the bf16 compute copy; n elements, overlapping nothing).
inline void adamw_update_with_bf16_copy(float* params, const float* grads, float* m, float* v, bf16* params_bf16,
                                        std::int64_t n, const optim::detail::AdamWScalars scalars,
                                        cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    LOOM_CHECK(params_bf16 != nullptr, "adamw_update_with_bf16_copy: params_bf16 is null; use adamw_update "
                                       "to update without a bf16 copy");
    detail::adamw_kernel<true>
        <<<kernels::cuda::blocks_for(n), kernels::cuda::threads_per_block, 0, stream>>>(params, grads, m, v,
                                                                                       params_bf16, n, scalars);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::optim::cuda
