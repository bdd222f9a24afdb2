// LOOM_HOST_DEVICE: marks small functions (dtype conversions, RNG rounds) that
// the CUDA kernels call on the device and the host code calls on the host, so
// both sides share one definition instead of two that could drift apart.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif
