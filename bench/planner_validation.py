#!/usr/bin/env python3
"""Checks loom-plan's cost model against measured train_gpt steps on this machine.

For each configuration of 8 rank threads (data, pipeline, tensor and sequence
parallelism, several schedules, ZeRO, on a cluster description whose two
"nodes" of 4 ranks are joined by a slow Shaped link, and on one without slow
links): loom-plan --evaluate predicts the step time, then train_gpt --cluster
runs it and the median step time after the warm-up steps is measured. Prints
both, the Spearman rank correlation, and whether the predicted best is the
measured best or within 10% of it. Nothing is fitted to the runs: the clusters'
"measure" fields (the GEMM speed, a blocking exchange's cost on the shared cores) are
timed once at the start and held for every configuration, and loom-plan --profile
prices the GPT's layers at the speed they run here. Run it on an idle machine: the
exchange cost reads 0 when other processes fill the cores.

    OPENBLAS_NUM_THREADS=1 python3 bench/planner_validation.py [--build build/release] [--steps 6] [--csv out.csv]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = ["--layers", "8", "--width", "256", "--heads", "8", "--seq", "128", "--vocab", "256"]
GPT = "8,256,8,128,256"
BATCH = 16

SLOW = "examples/plan/local_2x4_slow.json"
UNIFORM = "examples/plan/local_8_threads.json"

CONFIGS = [
    (SLOW, "--dp 8 --micro-batches 1"),
    (SLOW, "--dp 8 --micro-batches 2 --zero 1"),
    (SLOW, "--dp 8 --micro-batches 1 --zero 2"),
    (SLOW, "--dp 4 --tp 2 --micro-batches 1"),
    (SLOW, "--dp 2 --tp 4 --micro-batches 1"),
    (SLOW, "--dp 2 --pp 4 --schedule 1f1b --micro-batches 4"),
    (SLOW, "--dp 1 --pp 8 --schedule 1f1b --micro-batches 8"),
    (SLOW, "--dp 1 --pp 8 --schedule gpipe --micro-batches 8"),
    (SLOW, "--dp 2 --pp 2 --tp 2 --schedule 1f1b --micro-batches 4"),
    (SLOW, "--dp 1 --pp 2 --tp 4 --schedule 1f1b --micro-batches 4"),
    (SLOW, "--dp 2 --pp 4 --schedule zb --micro-batches 4"),
    (SLOW, "--dp 1 --pp 4 --tp 2 --schedule interleaved --chunks 2 --micro-batches 4"),
    (SLOW, "--dp 4 --sp 2 --micro-batches 1"),
    (UNIFORM, "--dp 8 --micro-batches 1"),
    (UNIFORM, "--dp 1 --pp 8 --schedule 1f1b --micro-batches 8"),
    (UNIFORM, "--dp 2 --tp 4 --micro-batches 1"),
    (UNIFORM, "--dp 2 --pp 2 --tp 2 --schedule 1f1b --micro-batches 4"),
]


def spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def pin_measured(plan, gpt, batch, cluster, out_path, env, who):
    """Times this machine once through loom-plan (the GEMM speed, a blocking exchange's CPU on the
    shared cores) and writes `cluster` to out_path with its "measure" fields replaced by the
    numbers, so that every configuration is priced with the same ones. Returns (tflops, wake_us)."""
    out = subprocess.run([plan, "--gpt", gpt, "--batch", str(batch), "--cluster", cluster, "--evaluate", "--dp 8"],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{who}: loom-plan refused {cluster}: {out.stderr.strip()}")
    line = next(l for l in out.stdout.splitlines() if l.startswith("cluster:"))
    tflops = float(line.split(" TFLOP/s")[0].split(" x ")[-1])
    wake = float(line.split(" us of CPU per blocking exchange")[0].split(", ")[-1]) if "us of CPU" in line else 0.0
    description = json.load(open(cluster))
    for node in description["nodes"]:
        if node.get("tflops") == "measure":
            node["tflops"] = tflops
    if description.get("wake_us") == "measure":
        description["wake_us"] = wake
    with open(out_path, "w") as f:
        json.dump(description, f)
    return tflops, wake


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build/release")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    parser.add_argument("--csv", default="")
    parser.add_argument("--only", type=int, default=0, help="run the first N configurations (a quick check)")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        sys.exit(f"planner_validation: --steps {args.steps} must exceed --warmup {args.warmup}")
    plan = os.path.join(args.build, "tools", "loom-plan")
    train = os.path.join(args.build, "examples", "train_gpt")
    for tool in (plan, train):
        if not os.path.exists(tool):
            sys.exit(f"planner_validation: {tool} is missing; build the loom-plan and train_gpt targets first")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    rows = []
    configs = CONFIGS[: args.only] if args.only else CONFIGS
    # The clusters' "measure" fields time this machine once, here, and every
    # configuration is priced and run with those numbers: measured again per
    # call they would move the predictions by the benchmarks' noise.
    measured = tempfile.TemporaryDirectory()
    held = {}
    for cluster in sorted({c for c, _ in configs}):
        held[cluster] = os.path.join(measured.name, os.path.basename(cluster))
        tflops, wake = pin_measured(plan, GPT, BATCH, cluster, held[cluster], env, "planner_validation")
        print(f"{cluster}: {tflops:.4f} TFLOP/s per thread, {wake:.1f} us of CPU per blocking exchange", flush=True)
    for n, (cluster, flags) in enumerate(configs, 1):
        cluster = held[cluster]
        # --profile: the layers' FLOPs at the speed they run here; the clusters'
        # "measure" fields time this machine's GEMM and its threads' exchanges.
        # Nothing is taken from the runs below.
        out = subprocess.run([plan, "--gpt", GPT, "--batch", str(BATCH), "--cluster", cluster, "--json", "--profile",
                              "--evaluate", flags], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(f"planner_validation: loom-plan refused {flags}: {out.stderr.strip()}")
        predicted = json.loads(out.stdout)
        # Run exactly what was priced: the planner's flags include its partition.
        run_flags = predicted["flags"].split()
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as metrics:
            cmd = [train, *MODEL, *run_flags, "--steps", str(args.steps), "--cluster", cluster, "--metrics", metrics.name]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"planner_validation: {' '.join(cmd)} failed: {done.stderr.strip()}")
            steps = [json.loads(line) for line in open(metrics.name)]
        tokens = BATCH * 128
        seconds = statistics.median(tokens / s["tokens_per_s"] for s in steps[args.warmup:])
        rows.append((os.path.basename(cluster), predicted["flags"].split(" --layers")[0], predicted["step_seconds"], seconds))
        print(f"{n:2d} {rows[-1][0]:22s} predicted {predicted['step_seconds']:.3f} s  measured {seconds:.3f} s  {rows[-1][1]}",
              flush=True)
    predicted = [r[2] for r in rows]
    measured = [r[3] for r in rows]
    if len(rows) < 2:
        return
    rho = spearman(predicted, measured)
    best_predicted = min(range(len(rows)), key=lambda i: predicted[i])
    best_measured = min(range(len(rows)), key=lambda i: measured[i])
    gap = measured[best_predicted] / measured[best_measured] - 1
    print(f"\nSpearman rank correlation over {len(rows)} configurations: {rho:.3f}")
    print(f"predicted best: #{best_predicted + 1} ({rows[best_predicted][1]}, measured {measured[best_predicted]:.3f} s); "
          f"measured best: #{best_measured + 1} ({measured[best_measured]:.3f} s); "
          f"{'the same' if best_predicted == best_measured else f'{100 * gap:.1f}% slower'}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("cluster,flags,predicted_s,measured_s\n")
            for r in rows:
                f.write(f"{r[0]},{r[1]},{r[2]:.6f},{r[3]:.6f}\n")


if __name__ == "__main__":
    main()
