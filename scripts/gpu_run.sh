#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root, with
# .gpu.tar.xz carried from scripts/gpu_prepare.sh (unpacked here into .gpu/).
# The summaries go to $OUT (or /tmp/loom-gpu), the rest (metrics, the trace, the
# test console) into $OUT/details.tar.gz: the device tool returns 8 files. Parts, in this order
# (LOOM_GPU_PARTS picks some of tests,nccl,bench,train,profile,sanitize; default all six):
#   tests  every CUDA test case in a process of its own (scripts/gpu_tests.py):
#          one line per case, and the output of each that did not pass
#   nccl   the Nccl test cases (loom_cuda_tests_nccl "[nccl]"), on the one GPU
#          there: a world of one rank, so the cases that need two GPUs say so
#          and pass; NCCL's library is the GPU machine's (PyTorch's wheel)
#   pairs  the GPT-2 step, loom's then PyTorch eager's, LOOM_GPU_PAIRS times (5)
#          back to back, and the median of the pairs' ratios (compare.py --pairs;
#          PyTorch's step drifts by several percent between calls). Not in the
#          default parts: LOOM_GPU_PARTS=pairs runs it
#   bench  the GPU benches beside PyTorch on the same GPU, then the ratios
#          (bench/gpu/compare.py)
#   train  train_gpt --device cuda against the same flags on the host: dp 2
#          (and resumed from a host checkpoint), dp 2 x pp 2 x tp 2 with ZeRO 1
#          (traced), PowerSGD, Optimus 2D, bf16 matrix products and OptEx on 2
#          workers (its gradients through ModelGradient's copies). The host
#          halves come from .gpu/ref/, made by gpu_prepare.sh on the CPU machine
#          so that no device time goes to them; without .gpu/ref they run here.
#   recompute Recompute<Full>, <Selective> and <Budget> on the GPU against the same
#          strategy without it (dp 2, dp 2 x pp 2 on 1F1B, dp 2 x tp 2 at ZeRO 3,
#          pp 2 zero-bubble): the saved parameters and moments byte for byte and
#          every printed loss (the same kernels on the same inputs: issue 38).
#          LOOM_GPU_DEVICE= (empty) runs the same check on the host
#   profile  the GPT-2 step with f32 matrix products, and one bf16 step under
#          Nsight Compute: kernel time per kernel (scripts/gpu_profile.py)
#   sanitize compute-sanitizer's racecheck, synccheck and memcheck on the bf16
#          attention kernels (mma.sync) at one small shape: the
#          shared-memory hazards and barriers that result checks can miss.
#          One summary line per tool and kernel; the reports go to details.tar.gz
# Device time is what a lease is short of, so the whole run keeps to
# LOOM_GPU_BUDGET seconds (default 450): each step gets at most its own cap and
# what is left, and a step with no time left is skipped, saying so. Give the
# call timeout_s 60 more than the budget.
#
# LOOM_GPU_PARTS=hostrefs (on the CPU machine, from gpu_prepare.sh) writes the
# host halves and the host checkpoint into .gpu/ref/ and nothing else.
set -uo pipefail
cd "$(dirname "$0")/.."
# A carried .gpu.tar.xz always replaces .gpu/: a warm device machine keeps
# ignored folders between calls, and its .gpu/ would hold the last call's binaries.
if [ -f .gpu.tar.xz ] && [[ ${LOOM_GPU_PARTS:-} != hostrefs ]]; then
  rm -rf .gpu && tar -xJf .gpu.tar.xz || { echo "gpu_run: .gpu.tar.xz did not unpack"; exit 2; }
fi
[ -d .gpu ] || { echo "gpu_run: no .gpu/ and no .gpu.tar.xz: run scripts/gpu_prepare.sh here first"; exit 2; }
out=${OUT:-/tmp/loom-gpu}
parts=${LOOM_GPU_PARTS:-tests,nccl,bench,train,recompute,profile,sanitize}
budget=${LOOM_GPU_BUDGET:-450}
started=$(date +%s)
# cuBLAS and the CUDA runtime from the image: its toolkit, else PyTorch's wheels.
cuda_libs=$(ls -d /usr/local/cuda/lib64 /usr/local/cuda/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
  2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-4} PYTHONUNBUFFERED=1
status=0

# capped SECONDS COMMAND...: runs COMMAND under a timeout of SECONDS or of what
# is left of the budget, whichever is less; skips it when under 5 s are left.
capped() {
  local cap=$1 left
  shift
  left=$((budget - ($(date +%s) - started)))
  if ((left < 5)); then
    echo "gpu_run: skipped, the ${budget} s budget is spent: $*"
    return 124
  fi
  ((cap > left)) && cap=$left
  timeout --kill-after=5 "$cap" "$@"
}

# The train_gpt runs: name and flags. The host half of each is the same flags without --device cuda.
declare -A runs=(
  [dp2]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 60 --lr 3e-3 --dp 2 --micro-batches 2"
  [pp]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 30 --lr 3e-3 --dp 2 --pp 2 --tp 2 --zero 1 --micro-batches 2 --partition 2,2"
  [psgd]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 30 --lr 3e-3 --dp 2 --compress powersgd:4"
  [2d]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 20 --lr 3e-3 --tp 4 --tp-mode 2d --micro-batches 2"
  [bf16]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 30 --lr 3e-3 --dp 2 --matmul bf16"
  [optex]="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 20 --lr 3e-3 --optex 2"
)
run_order="dp2 pp bf16 psgd 2d optex"

if [[ $parts == hostrefs ]]; then
  mkdir -p .gpu/ref
  # A checkpoint saved on the host half way, for the GPU to resume from.
  .gpu/bin/train_gpt ${runs[dp2]} --until 30 --save .gpu/ref/host.safetensors > .gpu/ref/host_half.txt 2>&1 || exit 1
  for name in $run_order; do
    echo "gpu_run: host reference $name"
    .gpu/bin/train_gpt ${runs[$name]} --metrics .gpu/ref/host_$name.jsonl > .gpu/ref/host_$name.txt 2>&1 || exit 1
  done
  exit 0
fi

work=$(mktemp -d)
trap 'tar -czf "$out/details.tar.gz" -C "$work" . 2>/dev/null' EXIT
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
for binary in .gpu/bin/*; do
  if ldd "$binary" | grep -q "not found"; then echo "$binary is missing:"; ldd "$binary" | grep "not found"; fi
done

if [[ $parts == *tests* ]]; then
  echo "== CUDA tests (one process each)"
  capped 200 python3 scripts/gpu_tests.py .gpu/bin/loom_cuda_tests "$out" --jobs 4 --timeout 90 \
    --budget $((budget * 2 / 5 < 150 ? budget * 2 / 5 : 150)) > "$work/cuda_tests_console.txt" 2>&1 || status=1
  tail -n 1 "$out/cuda_tests.txt" 2>/dev/null || echo "gpu_run: the test runner wrote no summary"
  grep -v '^pass' "$out/cuda_tests.txt" 2>/dev/null | head -n 40
fi

if [[ $parts == *nccl* ]]; then
  echo "== Nccl test cases on one GPU"
  if [ -x .gpu/bin/loom_cuda_tests_nccl ]; then
    NCCL_DEBUG=VERSION capped 150 .gpu/bin/loom_cuda_tests_nccl --durations yes "[nccl]" > "$work/nccl_tests.txt" 2>&1
    code=$?
    ((code == 0)) || status=1
    grep -E "NCCL version|passed|failed|FAILED|REQUIRE|CHECK|with message|WARNING|needs 2 GPUs| s: |not found" \
      "$work/nccl_tests.txt" | head -n 40 | cut -c1-220
    echo "gpu_run: loom_cuda_tests_nccl exit $code"
  else
    echo "gpu_run: no .gpu/bin/loom_cuda_tests_nccl (built where NCCL is found; see gpu_prepare.sh)"
  fi
fi

if [[ $parts == *pairs* ]]; then
  echo "== the GPT-2 step, loom then PyTorch eager, ${LOOM_GPU_PAIRS:-5} times"
  for ((pair = 1; pair <= ${LOOM_GPU_PAIRS:-5}; ++pair)); do
    capped 60 .gpu/bin/bench_gpu_train --steps 20 --warmup 3
    capped 90 python3 bench/gpu/torch_peer.py --gpt --steps 20 --warmup 3
  done > "$out/pairs.txt" 2>&1
  grep -E '^(loom|torch) gpt|rror' "$out/pairs.txt" | cut -c1-200
  python3 bench/gpu/compare.py --pairs "$out/pairs.txt"
fi

if [[ $parts == *bench* ]]; then
  echo "== benches"
  {
    capped 60 .gpu/bin/bench_gpu_kernels
    capped 60 python3 bench/gpu/torch_peer.py --kernels
    capped 60 .gpu/bin/bench_gpu_train
    capped 150 python3 bench/gpu/torch_peer.py --gpt --compile
  } > "$out/bench.txt" 2>&1
  grep -E '^(loom|torch|SKIPPED|device)|rror' "$out/bench.txt" | cut -c1-220
  python3 bench/gpu/compare.py "$out/bench.txt" | tee "$out/ratios.txt"
fi

if [[ $parts == *train* ]]; then
  echo "== train_gpt --device cuda beside the host"
  ref=.gpu/ref
  if [ ! -f $ref/host_dp2.jsonl ]; then
    ref=$work/ref
    mkdir -p "$ref"
    capped 60 .gpu/bin/train_gpt ${runs[dp2]} --until 30 --save "$ref/host.safetensors" > "$ref/host_half.txt" 2>&1 || status=1
    for name in $run_order; do
      capped 60 .gpu/bin/train_gpt ${runs[$name]} --metrics "$ref/host_$name.jsonl" > "$ref/host_$name.txt" 2>&1 || status=1
    done
  fi
  {
    # A checkpoint saved on the host continues on the GPU.
    echo "-- dp2 resumed from the host's step-30 checkpoint"
    capped 60 .gpu/bin/train_gpt ${runs[dp2]} --device cuda --resume "$ref/host.safetensors" --sample 80 \
      --metrics "$work/gpu_resumed.jsonl" || status=1
    python3 bench/gpu/compare.py --losses "$ref/host_dp2.jsonl" "$work/gpu_resumed.jsonl"
    # A sharded checkpoint written on the GPU continues on the host.
    echo "-- dp2 saved sharded on the GPU at step 30 (ZeRO 1), resumed on the host"
    capped 60 .gpu/bin/train_gpt ${runs[dp2]} --zero 1 --device cuda --until 30 --sharded --save "$work/gpu_sharded" \
      > "$work/gpu_sharded.txt" 2>&1 || { status=1; tail -n 2 "$work/gpu_sharded.txt"; }
    capped 60 .gpu/bin/train_gpt ${runs[dp2]} --resume "$work/gpu_sharded" --metrics "$work/host_from_gpu.jsonl" \
      > "$work/host_from_gpu.txt" 2>&1 || { status=1; tail -n 2 "$work/host_from_gpu.txt"; }
    python3 bench/gpu/compare.py --losses "$ref/host_dp2.jsonl" "$work/host_from_gpu.jsonl"
    for name in $run_order; do
      echo "-- $name: ${runs[$name]}"
      extra=""
      [ "$name" = pp ] && extra="--trace $work/trace_gpu_pp.json"
      capped 60 .gpu/bin/train_gpt ${runs[$name]} --device cuda --metrics "$work/gpu_$name.jsonl" $extra || status=1
      python3 bench/gpu/compare.py --losses "$ref/host_$name.jsonl" "$work/gpu_$name.jsonl"
    done
  } > "$out/train.txt" 2>&1
  grep -E '^(--|[0-9]+ steps|no losses|gpu_run)|rror|refus' "$out/train.txt" | cut -c1-220
fi
if [[ $parts == *recompute* ]]; then
  echo "== Recompute<...> on the GPU beside the same strategy without it"
  declare -A recompute_runs=(
    [dp2]="--dp 2 --micro-batches 2"
    [pp2]="--dp 2 --pp 2 --schedule 1f1b --micro-batches 4"
    [tp2z3]="--dp 2 --tp 2 --zero 3 --micro-batches 2"
    [zb]="--pp 2 --schedule zb --micro-batches 4"
  )
  model="--layers 4 --width 256 --heads 4 --seq 128 --batch 16 --steps 8 --lr 3e-3"
  for name in dp2 pp2 tp2z3 zb; do
    for mode in none full selective budget:16MiB; do
      file="$work/recompute_${name}_${mode/:/_}"
      capped 60 .gpu/bin/train_gpt $model ${recompute_runs[$name]} ${LOOM_GPU_DEVICE---device cuda} --recompute "$mode" \
        --save "$file.safetensors" --metrics "$file.jsonl" > "$file.txt" 2>&1 || { status=1; echo "$name $mode failed:"; tail -n 3 "$file.txt"; }
    done
    python3 - "$work/recompute_${name}" <<'PY' || status=1
import json, sys
base = sys.argv[1]
def tensors(path):  # the safetensors data section: parameters and moments, no metadata
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
def losses(path):
    return [json.loads(line)["loss"] for line in open(path)]
plain, plain_losses = tensors(base + "_none.safetensors"), losses(base + "_none.jsonl")
bad = 0
for mode in ("full", "selective", "budget_16MiB"):
    try:
        state, run_losses = tensors(f"{base}_{mode}.safetensors"), losses(f"{base}_{mode}.jsonl")
    except OSError as e:
        print(f"{base.split('_', 1)[1]} {mode}: no output ({e})"); bad += 1; continue
    differ = [k for k in plain if state.get(k) != plain[k]]
    same = not differ and run_losses == plain_losses and len(plain) == len(state)
    bad += not same
    print(f"{base.rsplit('recompute_', 1)[1]} {mode}: {len(state)} tensors, {'bit for bit' if not differ else str(len(differ)) + ' differ, e.g. ' + differ[0]}; "
          f"losses {'equal' if run_losses == plain_losses else 'differ'} ({len(run_losses)} steps, last {run_losses[-1] if run_losses else None})")
sys.exit(1 if bad else 0)
PY
  done > "$out/recompute.txt" 2>&1
  cat "$out/recompute.txt"
  grep -h "Recompute<Budget" "$work"/recompute_*budget*.txt | head -n 4 | cut -c1-200
fi
if [[ $parts == *profile* ]]; then
  echo "== where the GPT-2 step's time goes"
  capped 45 .gpu/bin/bench_gpu_train --matmul f32 >> "$out/bench.txt" 2>&1
  grep '^loom gpt.*matmul=f32' "$out/bench.txt"
  # Nsight Compute runs each kernel alone: the sum is the step's kernel time
  # without overlap, and the timed step minus it is launch gaps and host work.
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  if [ -n "$ncu" ]; then
    # The step as --matmul bf16 runs it.
    capped 60 "$ncu" --clock-control none \
      --metrics gpu__time_duration.sum --csv .gpu/bin/bench_gpu_train --steps 1 --warmup 0 > "$work/profile_raw.csv" 2>&1
    python3 scripts/gpu_profile.py "$work/profile_raw.csv" | tee "$out/profile.txt" | head -n 25
  else
    echo "gpu_run: no ncu here; no kernel profile"
  fi
fi
if [[ $parts == *sanitize* ]]; then
  echo "== compute-sanitizer on the bf16 attention kernels"
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
  if [ -n "$sanitizer" ]; then
    # The determinism cases: one small shape (B 2, T 130, H 3, D 64), forward and backward, three times.
    spec="CUDA bf16 attention on mma.sync is deterministic and runs on the caller's stream"
    for tool in racecheck synccheck memcheck; do
      report="$work/sanitize_${tool}_mma.txt"
      capped 60 "$sanitizer" --tool "$tool" --error-exitcode 3 .gpu/bin/loom_cuda_tests "$spec" > "$report" 2>&1
      code=$?
      ((code == 0)) || status=1
      echo "$tool mma (exit $code): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test case' "$report" \
        | tr '\n' ' ' | cut -c1-200)"
    done
  else
    echo "gpu_run: no compute-sanitizer here"
  fi
fi
echo "gpu_run: $(($(date +%s) - started)) s of the ${budget} s budget"
exit $status
