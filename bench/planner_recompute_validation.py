#!/usr/bin/env python3
"""Checks loom-plan's joint search of strategy and recomputation against measured train_gpt steps.

The cluster (bench/planner_recompute_8_threads.json) is this machine's 8 rank
threads with a memory per rank small enough that data parallelism over 8 must
recompute, as the planner counts memory. For each configuration (layouts with
no recomputation, Recompute<Full>, Recompute<Selective> and Recompute<Budget ...>), loom-plan
--evaluate predicts the step, then train_gpt runs the same --strategy line and
the median step after the warm-up is measured (the memory limit is the
planner's: rank threads are not held to it). Prints both, the Spearman rank
correlation, and then the top plans of three searches, each run and measured:
the joint search (--recompute when-needed), shard until it fits (never),
recompute everything (full) and keep the products (selective).

    OPENBLAS_NUM_THREADS=1 python3 bench/planner_recompute_validation.py [--build build/release] [--steps 8] [--repeat 2]
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planner_validation import pin_measured, spearman  # noqa: E402

GPT = "8,192,8,128,256"
BATCH = 16
TOKENS = BATCH * 128
CLUSTER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planner_recompute_8_threads.json")
CLUSTER = CLUSTER_FILE  # replaced by a copy with the speed measured once (main)

LAYOUTS = [
    "--dp 8 --micro-batches 2 --zero 1",
    "--dp 4 --tp 2 --micro-batches 2 --zero 1",
    "--dp 4 --pp 2 --schedule 1f1b --micro-batches 4 --zero 1",
    "--dp 2 --pp 4 --schedule 1f1b --micro-batches 8 --zero 1",
    "--dp 2 --pp 4 --schedule zb --micro-batches 8 --zero 1",
    "--dp 2 --pp 2 --tp 2 --schedule 1f1b --micro-batches 8 --zero 1",
    "--dp 1 --pp 8 --schedule zb --micro-batches 16",
]
RECOMPUTE = ["none", "full", "selective"]
EXTRA = [
    "--dp 2 --pp 4 --schedule zb --micro-batches 8 --zero 1 --recompute budget:20MiB",
    "--dp 8 --micro-batches 2 --zero 1 --recompute budget:30MiB",
]


def evaluate(plan, flags, env):
    out = subprocess.run([plan, "--gpt", GPT, "--batch", str(BATCH), "--cluster", CLUSTER, "--json", "--profile", "--evaluate",
                          flags],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"planner_recompute_validation: loom-plan refused {flags}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def search(plan, when, env):
    out = subprocess.run([plan, "--gpt", GPT, "--batch", str(BATCH), "--cluster", CLUSTER, "--json", "--profile", "--top",
                          "1", "--recompute", when], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return json.loads(out.stdout), ""


def compiler_running():
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() in ("cc1plus", "cicc", "ptxas"):
                    return True
        except OSError:
            pass
    return False


def wait_for_quiet(limit_seconds=120):
    """On a shared machine: until the load is under 2 with no compiler running, or, after half of
    limit_seconds, beside a compiler that never stops (--repeat keeps the fastest run)."""
    start = time.time()
    while time.time() - start < limit_seconds:
        if os.getloadavg()[0] <= 2.0 and (not compiler_running() or time.time() - start > limit_seconds / 2):
            return
        time.sleep(5)


WAIT = False


def measure(train, strategy_flags, steps, warmup, env, repeat=1):
    # The least of `repeat` runs' medians: other work on the machine only slows a run down.
    best = float("inf")
    for _ in range(repeat):
        if WAIT:
            wait_for_quiet()
        best = min(best, measure_once(train, strategy_flags, steps, warmup, env))
    return best


def measure_once(train, strategy_flags, steps, warmup, env):
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as metrics:
        cmd = [train, *shlex.split(strategy_flags), "--steps", str(steps), "--cluster", CLUSTER, "--metrics",
               metrics.name, "--no-memory-check"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            sys.exit(f"planner_recompute_validation: {shlex.join(cmd)} failed: {done.stderr.strip()}")
        rows = [json.loads(line) for line in open(metrics.name)]
    return statistics.median(TOKENS / s["tokens_per_s"] for s in rows[warmup:])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default="build/release")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the median (Budget's first step runs as Full)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per configuration; the fastest median counts")
    parser.add_argument("--wait-quiet", action="store_true",
                        help="before each run, wait (up to 2 minutes) for no compiler on this machine and a load under 2")
    parser.add_argument("--csv", default="")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        sys.exit(f"planner_recompute_validation: --steps {args.steps} must exceed --warmup {args.warmup}")
    plan = os.path.join(args.build, "tools", "loom-plan")
    train = os.path.join(args.build, "examples", "train_gpt")
    for tool in (plan, train):
        if not os.path.exists(tool):
            sys.exit(f"planner_recompute_validation: {tool} is missing; build the loom-plan and train_gpt targets first")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    # The cluster's "measure" fields (the GEMM speed, a blocking exchange's CPU
    # on the shared cores) time this machine once, here, and every prediction
    # and search below sees the same numbers; --profile prices the GPT's layers
    # at the speed they run here. Nothing is taken from the runs.
    global CLUSTER, WAIT
    WAIT = args.wait_quiet
    if WAIT:
        wait_for_quiet()
    pinned = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    pinned.close()
    pin_measured(plan, GPT, BATCH, CLUSTER_FILE, pinned.name, env, "planner_recompute_validation")
    CLUSTER = pinned.name
    print(f"cluster: {open(CLUSTER).read()}")
    configs = [f"{layout} --recompute {r}" for layout in LAYOUTS for r in RECOMPUTE] + EXTRA
    rows = []
    for n, flags in enumerate(configs, 1):
        predicted = evaluate(plan, flags, env)
        seconds = measure(train, predicted["strategy_flags"], args.steps, args.warmup, env, args.repeat)
        rows.append((flags, predicted["step_seconds"], seconds, predicted["fits"], predicted["recomputed_layers"]))
        print(f"{n:2d} predicted {predicted['step_seconds']:.3f} s  measured {seconds:.3f} s  "
              f"{'fits' if predicted['fits'] else 'over '} {predicted['recomputed_layers']} recomputed  {flags}", flush=True)
    rho = spearman([r[1] for r in rows], [r[2] for r in rows])
    print(f"\nSpearman rank correlation over {len(rows)} configurations: {rho:.3f}")
    by_flags = {r[0]: r for r in rows}
    print("recomputation's cost per layout, Full and Selective over none (predicted / measured):")
    for layout in LAYOUTS:
        none, full = by_flags[f"{layout} --recompute none"], by_flags[f"{layout} --recompute full"]
        selective = by_flags[f"{layout} --recompute selective"]
        print(f"  Full {full[1] / none[1]:.2f} / {full[2] / none[2]:.2f}, "
              f"Selective {selective[1] / none[1]:.2f} / {selective[2] / none[2]:.2f}  {layout}")
    fitting = [r for r in rows if r[3]]
    if len(fitting) > 2:
        print(f"  over the {len(fitting)} that fit the planner's memory: {spearman([r[1] for r in fitting], [r[2] for r in fitting]):.3f}")

    print("\nthe top plan of each search, run:")
    for when in ("when-needed", "never", "full", "selective"):
        found, why = search(plan, when, env)
        if found is None:
            print(f"  --recompute {when:11s}: no plan ({why})")
            continue
        best = found["plans"][0]
        seconds = measure(train, best["strategy_flags"], args.steps, args.warmup, env, args.repeat)
        print(f"  --recompute {when:11s}: predicted {best['step_seconds']:.3f} s  measured {seconds:.3f} s  "
              f"{best['strategy_flags'].split(' --layers')[0]}", flush=True)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("flags,predicted_s,measured_s,fits,recomputed_layers\n")
            for r in rows:
                f.write(f"{r[0]},{r[1]:.6f},{r[2]:.6f},{int(r[3])},{r[4]}\n")
    os.unlink(CLUSTER)


if __name__ == "__main__":
    main()
