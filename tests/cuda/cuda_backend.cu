// The CUDA backend for the tests that run loom's layers on the GPU from host C++
// (test_device_training.cpp): this nvcc translation unit registers it before main.
#include "loom/cuda_backend.cuh"
