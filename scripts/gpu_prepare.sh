#!/usr/bin/env bash
# Builds here, on a machine without a GPU, what one call of the device tool
# needs, into .gpu/ and packs it as .gpu.tar.xz (both ignored by git; name
# .gpu.tar.xz in the call's `carry`: OpenBLAS alone is 36 MB, and what
# travels is limited to 64 MiB):
#   .gpu/bin: loom_cuda_tests, train_gpt, bench_gpu_kernels, bench_gpu_train
#             (Release, sm_90 cubins only, MPI and NCCL off: the GPU machine
#             has neither Open MPI nor Debian's libraries), and
#             loom_cuda_tests_nccl, the same tests built with NCCL (its Nccl
#             cases; libnccl from the GPU machine's PyTorch), where NCCL is here
#   .gpu/lib: the shared libraries they need that a CUDA image lacks (OpenBLAS
#             and its Fortran runtime); cuBLAS comes from the image.
#   .gpu/ref: the host halves of gpu_run.sh's train_gpt comparisons and the host
#             checkpoint the GPU resumes from, run here on the CPU so that they
#             cost no device time (LOOM_GPU_REFS=0 leaves them to the device).
# Then, in the device call: bash scripts/gpu_run.sh (it writes to $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_MPI=OFF -DLOOM_WITH_NCCL=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_EXAMPLES=ON -DLOOM_BUILD_BENCH=ON >/dev/null
cmake --build build/gpu --target loom_cuda_tests train_gpt bench_gpu_kernels bench_gpu_train --parallel 2
# A second build of the tests with NCCL, so that the first never needs libnccl.
nccl_tests=""
if cmake -S . -B build/gpu-nccl -DCMAKE_BUILD_TYPE=Release -DLOOM_WITH_MPI=OFF -DLOOM_WITH_NCCL=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLOOM_BUILD_TESTS=ON -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCH=OFF >/dev/null 2>&1; then
  cmake --build build/gpu-nccl --target loom_cuda_tests --parallel 2
  nccl_tests=build/gpu-nccl/tests/loom_cuda_tests
else
  echo "gpu_prepare: no NCCL here; loom_cuda_tests_nccl is not built"
fi
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
cp build/gpu/tests/loom_cuda_tests build/gpu/examples/train_gpt build/gpu/bench/bench_gpu_kernels \
   build/gpu/bench/bench_gpu_train .gpu/bin/
[ -n "$nccl_tests" ] && cp "$nccl_tests" .gpu/bin/loom_cuda_tests_nccl
strip --strip-debug .gpu/bin/*
ldd .gpu/bin/* 2>/dev/null | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libopenblas*|libblas*|liblapack*|libgfortran*|libquadmath*) cp -L "$lib" .gpu/lib/ ;;
  esac
done
if [ "${LOOM_GPU_REFS:-1}" != 0 ]; then
  echo "gpu_prepare: the host halves of the train_gpt comparisons (a few minutes on 2 cores)"
  OPENBLAS_NUM_THREADS=1 LOOM_GPU_PARTS=hostrefs bash scripts/gpu_run.sh
fi
du -sh .gpu/*
tar -cJf .gpu.tar.xz .gpu
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
pack_bytes=$(stat -c %s .gpu.tar.xz)
echo "gpu_prepare: .gpu.tar.xz is $((pack_bytes >> 20)) MiB, the tracked tree $((tree_bytes >> 20)) MiB (the limit is 64 MiB together)"
echo "gpu_prepare: ready; in the device call carry .gpu.tar.xz and run: bash scripts/gpu_run.sh"
