// The CUDA backend of train_gpt --device cuda: this translation unit, compiled by
// nvcc, registers loom's CUDA runtime and kernels before main (loom/cuda_backend.cuh)
// and, in a build with NCCL, the joiner of one GPU per MPI process
// (loom/cuda_backend_nccl.cuh); the rest of train_gpt stays host C++.
#if LOOM_EXAMPLE_WITH_NCCL
#include <loom/cuda_backend_nccl.cuh>
#else
#include <loom/cuda_backend.cuh>
#endif
