// The CUDA backend of train_gpt --device cuda: this translation unit, compiled by
// nvcc, registers loom's CUDA runtime and kernels before main (loom/cuda_backend.cuh);
// the rest of train_gpt stays host C++.
#include <loom/cuda_backend.cuh>
