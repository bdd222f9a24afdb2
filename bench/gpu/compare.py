#!/usr/bin/env python3
"""loom beside PyTorch from one run's output (scripts/gpu_run.sh), as ratios.

    python3 bench/gpu/compare.py BENCH.txt
        reads the 'loom ...' and 'torch ...' lines of bench_gpu_kernels, bench_gpu_train and
        torch_peer.py and prints, per figure, loom's value, PyTorch's and loom / PyTorch, with
        the issue's targets: GEMM >= 0.85 of torch's matmul, elementwise >= 0.80 of the copy
        bandwidth, GPT tokens/s >= torch eager (and the ratio to torch.compile).
    python3 bench/gpu/compare.py --losses A.jsonl B.jsonl
        the largest relative difference between two train_gpt --metrics files' losses.
    python3 bench/gpu/compare.py --pairs PAIRS.txt
        alternating 'loom gpt' and 'torch gpt mode=eager' lines (gpu_run.sh's pairs part):
        each pair's tokens/s and ratio, then the medians, against the target >= 1.0. One
        pair is one call of each, back to back, so the machine's drift between calls
        reaches both sides.
"""

import json
import os
import re
import sys


def fields(line):
    return dict(re.findall(r"(\w+)=([^\s]+)", line))


def compare(path):
    loom, torch = {}, {}
    for line in open(path, encoding="utf-8"):
        words = line.split()
        if len(words) < 2 or words[0] not in ("loom", "torch"):
            continue
        f = fields(line)
        key = words[1]
        if key == "attention":
            key += f" seq={f['seq']}" + (f" {f['dtype']}" if "dtype" in f else "")
        if key == "gpt" and "mode" in f:
            key += f" {f['mode']}"
        if key == "gpt" and f.get("matmul", "bf16") != "bf16":
            key += f" {f['matmul']}"
        (loom if words[0] == "loom" else torch)[key] = f
    rows = []

    def ratio(name, loom_key, torch_key, metric, target=None):
        if loom_key in loom and torch_key in torch:
            a, b = float(loom[loom_key][metric]), float(torch[torch_key][metric])
            verdict = "" if target is None else (" meets" if a / b >= target else " BELOW") + f" target {target}"
            rows.append(f"{name}: loom {a:g}, torch {b:g} {metric}; loom/torch = {a / b:.3f}{verdict}")

    ratio("bf16 GEMM", "gemm_bf16", "gemm_bf16", "tflops", 0.85)
    ratio("device-to-device copy", "copy_d2d", "copy_d2d", "gbps")
    for kernel in ("gelu_forward", "adamw", "cast_bf16"):
        if kernel in loom:
            rows.append(f"{kernel}: loom {float(loom[kernel]['of_copy']):.3f} of the copy bandwidth"
                        f" ({'meets' if float(loom[kernel]['of_copy']) >= 0.8 else 'BELOW'} target 0.80)")
        ratio(kernel, kernel, kernel, "gbps")
    for seq in ("1024", "4096"):
        for dtype in ("f32", "bf16"):
            ratio(f"attention seq {seq} {dtype} (beside torch SDPA {dtype})", f"attention seq={seq} {dtype}",
                  f"attention seq={seq} {dtype}", "fwd_bwd_tflops")
        ratio(f"attention seq {seq} bf16, the kernel lab's wmma kernels (beside torch SDPA bf16)",
              f"attention seq={seq} bf16_wmma", f"attention seq={seq} bf16", "fwd_bwd_tflops")
    ratio("GPT training vs torch eager", "gpt", "gpt eager", "tokens_per_s", 1.0)
    ratio("GPT training vs torch.compile", "gpt", "gpt compile", "tokens_per_s")
    ratio("GPT training with f32 matmuls vs torch eager", "gpt f32", "gpt eager", "tokens_per_s")
    print("\n".join(rows) if rows else f"no loom/torch pairs found in {path}")


def losses(a_path, b_path):
    def read(path):
        return {r["step"]: r["loss"] for r in map(json.loads, open(path, encoding="utf-8"))}

    for path in (a_path, b_path):
        if not os.path.exists(path):
            print(f"no losses to compare: {path} was not written (its run failed; see its output)")
            return
    a, b = read(a_path), read(b_path)
    common = sorted(set(a) & set(b))
    if not common:
        print(f"no common steps in {a_path} and {b_path}")
        return
    worst = max(common, key=lambda s: abs(a[s] - b[s]) / abs(a[s]))
    print(f"{len(common)} steps: largest relative loss difference {abs(a[worst] - b[worst]) / abs(a[worst]):.2e} "
          f"at step {worst} ({a[worst]:.6f} vs {b[worst]:.6f}); final {a[common[-1]]:.4f} vs {b[common[-1]]:.4f}")


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2 if n else float("nan")


def pairs(path):
    loom, torch = [], []
    for line in open(path, encoding="utf-8"):
        f = fields(line)
        if line.startswith("loom gpt") and f.get("matmul", "bf16") == "bf16" and f.get("attention", "mma") == "mma":
            loom.append(float(f["tokens_per_s"]))
        elif line.startswith("torch gpt") and f.get("mode") == "eager":
            torch.append(float(f["tokens_per_s"]))
    n = min(len(loom), len(torch))
    if n == 0:
        print(f"no loom/torch GPT pairs in {path}")
        return
    ratios = [loom[i] / torch[i] for i in range(n)]
    for i in range(n):
        print(f"pair {i + 1}: loom {loom[i]:.0f}, torch eager {torch[i]:.0f} tokens_per_s; loom/torch = {ratios[i]:.3f}")
    verdict = "meets" if median(ratios) >= 1.0 else "BELOW"
    print(f"{n} pairs: median loom {median(loom[:n]):.0f}, torch eager {median(torch[:n]):.0f} tokens_per_s; "
          f"median ratio {median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f}), {verdict} target 1.0")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--losses":
        losses(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "--pairs":
        pairs(sys.argv[2])
    elif len(sys.argv) == 2:
        compare(sys.argv[1])
    else:
        print(__doc__)
        sys.exit(2)
