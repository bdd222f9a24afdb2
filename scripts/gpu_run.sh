#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root, with
# .gpu.tar.xz carried from scripts/gpu_prepare.sh (unpacked here into .gpu/): the CUDA tests (a JUnit file with
# every test case's result, and the console summary), train_gpt --device cuda
# --dp 2 (and --dp 2 --pp 2 --tp 2 --zero 1, traced) against the same run on the host, and a
# checkpoint saved on the host
# resumed on the GPU, and the GPU benches
# beside PyTorch on the same GPU, then the ratios (bench/gpu/compare.py).
# Everything goes to $OUT (or /tmp/loom-gpu). Give the call timeout_s 540.
# LOOM_GPU_PARTS picks parts: tests,train,bench (default: all three).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d .gpu ] || tar -xJf .gpu.tar.xz || { echo "gpu_run: no .gpu/ and no .gpu.tar.xz: run scripts/gpu_prepare.sh here first"; exit 2; }
out=${OUT:-/tmp/loom-gpu}
mkdir -p "$out"
parts=${LOOM_GPU_PARTS:-tests,train,bench}
export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=4 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for binary in .gpu/bin/*; do
  if ldd "$binary" | grep -q "not found"; then echo "$binary is missing:"; ldd "$binary" | grep "not found"; fi
done
status=0
if [[ $parts == *tests* ]]; then
  echo "== CUDA tests"
  timeout 240 .gpu/bin/loom_cuda_tests -r junit -o "$out/cuda_tests.xml"; rc=$?
  echo "loom_cuda_tests exit $rc"; [ $rc -eq 0 ] || status=1
  # One line per test case, from the JUnit file.
  python3 - "$out/cuda_tests.xml" <<'PY' | tee "$out/cuda_tests.txt"
import os, sys, xml.etree.ElementTree as ET
if not os.path.exists(sys.argv[1]):
    sys.exit("no JUnit file: the CUDA tests did not run (see their exit code above)")
cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
failed = 0
for c in cases:
    bad = c.find("failure") is not None or c.find("error") is not None
    failed += bad
    print(("FAIL " if bad else "pass ") + c.get("name", "?"))
print(f"{len(cases) - failed} passed, {failed} failed")
PY
fi
if [[ $parts == *train* ]]; then
  echo "== train_gpt --device cuda"
  flags="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 60 --lr 3e-3 --dp 2 --micro-batches 2"
  # A checkpoint saved on the host resumes on the GPU; the GPU run from the
  # start is compared loss for loss with the host run of the same flags.
  .gpu/bin/train_gpt $flags --until 30 --save "$out/host.safetensors" > "$out/train_host_half.txt" 2>&1 || status=1
  .gpu/bin/train_gpt $flags --device cuda --resume "$out/host.safetensors" --sample 80 2>&1 | tee "$out/train_gpu_resumed.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  .gpu/bin/train_gpt $flags --device cuda --metrics "$out/gpu.jsonl" 2>&1 | tee "$out/train_gpu.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  .gpu/bin/train_gpt $flags --metrics "$out/host.jsonl" > "$out/train_host.txt" 2>&1 || status=1
  python3 bench/gpu/compare.py --losses "$out/host.jsonl" "$out/gpu.jsonl" | tee "$out/losses.txt"
  # ZeRO 1, a 1F1B pipeline and Megatron tp: dp 2 x pp 2 x tp 2 rank threads on the GPU against
  # the same on the host (a given partition: profiling would differ).
  zflags="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 30 --lr 3e-3 --dp 2 --pp 2 --tp 2 --zero 1 --micro-batches 2 --partition 2,2"
  .gpu/bin/train_gpt $zflags --device cuda --metrics "$out/gpu_pp.jsonl" --trace "$out/trace_gpu_pp.json" 2>&1 | tee "$out/train_gpu_pp.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  .gpu/bin/train_gpt $zflags --metrics "$out/host_pp.jsonl" > "$out/train_host_pp.txt" 2>&1 || status=1
  python3 bench/gpu/compare.py --losses "$out/host_pp.jsonl" "$out/gpu_pp.jsonl" | tee "$out/losses_pp.txt"
  # The dp exchange compressed with PowerSGD (GEMMs, orthonormalisation and error feedback on the GPU).
  cflags="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 30 --lr 3e-3 --dp 2 --compress powersgd:4"
  .gpu/bin/train_gpt $cflags --device cuda --metrics "$out/gpu_psgd.jsonl" 2>&1 | tee "$out/train_gpu_psgd.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  .gpu/bin/train_gpt $cflags --metrics "$out/host_psgd.jsonl" > "$out/train_host_psgd.txt" 2>&1 || status=1
  python3 bench/gpu/compare.py --losses "$out/host_psgd.jsonl" "$out/gpu_psgd.jsonl" | tee "$out/losses_psgd.txt"
  # Optimus 2D on a 2 x 2 grid (SUMMA and the grid LayerNorm on the GPU).
  oflags="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 20 --lr 3e-3 --tp 4 --tp-mode 2d --micro-batches 2"
  .gpu/bin/train_gpt $oflags --device cuda --metrics "$out/gpu_2d.jsonl" 2>&1 | tee "$out/train_gpu_2d.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  .gpu/bin/train_gpt $oflags --metrics "$out/host_2d.jsonl" > "$out/train_host_2d.txt" 2>&1 || status=1
  python3 bench/gpu/compare.py --losses "$out/host_2d.jsonl" "$out/gpu_2d.jsonl" | tee "$out/losses_2d.txt"
  # bf16 matrix products (tensor cores) against the host's exact emulation of them.
  bflags="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 30 --lr 3e-3 --dp 2 --matmul bf16"
  .gpu/bin/train_gpt $bflags --device cuda --metrics "$out/gpu_bf16.jsonl" 2>&1 | tee "$out/train_gpu_bf16.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  .gpu/bin/train_gpt $bflags --metrics "$out/host_bf16.jsonl" > "$out/train_host_bf16.txt" 2>&1 || status=1
  python3 bench/gpu/compare.py --losses "$out/host_bf16.jsonl" "$out/gpu_bf16.jsonl" | tee "$out/losses_bf16.txt"
  rm -f "$out/host.safetensors"
fi
if [[ $parts == *bench* ]]; then
  echo "== benches"
  { timeout 150 .gpu/bin/bench_gpu_kernels; timeout 150 python3 bench/gpu/torch_peer.py --kernels;
    timeout 120 .gpu/bin/bench_gpu_train; timeout 120 .gpu/bin/bench_gpu_train --matmul f32; timeout 240 python3 bench/gpu/torch_peer.py --gpt --compile; } 2>&1 | tee "$out/bench.txt"
  python3 bench/gpu/compare.py "$out/bench.txt" | tee "$out/ratios.txt"
fi
exit $status
