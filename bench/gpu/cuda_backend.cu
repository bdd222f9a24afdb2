// The CUDA backend of bench_gpu_train (train_step.cpp, host C++): registered before main.
#include "loom/cuda_backend.cuh"
