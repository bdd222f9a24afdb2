#!/usr/bin/python3
"""OptEx applied to training: GPT loss vs sequential iterations against AdamW.

Trains the small GPT of config B of the GPT benchmark (layers 2, width 64,
heads 4, seq 64, batch 16, lr 1e-3, as in compression_convergence.py) with
train_gpt, one run at a time:

  AdamW     plain AdamW, one batch per sequential iteration;
  OptEx N   --optex N: N - 1 proxy AdamW steps on a kernelized gradient
            estimate, then N true gradients (worker k of iteration t reads
            batch t N + k, one rank thread each); the last worker's step is
            the next iterate;
  Target N  the ideal OptEx with exact gradients: plain AdamW for N x S steps,
            its loss at sequential iteration i being that of step (i+1) N - 1
            (the batch OptEx's last worker reads). Its cosine schedule spans
            N x S steps (the same shape per sequential iteration), and its
            20-step warm-up is 20 / N sequential iterations.

Per run: the final loss (mean of the last 10 sequential iterations), the
sequential iterations until the 10-iteration trailing mean first reaches
AdamW's final loss, the speed-up over AdamW beside sqrt(N), and the training
seconds per sequential iteration (from the metrics' tokens/s; OptEx's N
workers are N rank threads, so it shows their parallelism only on N cores or
more). With --optex-select lowest-loss the logged loss is the lowest of the N
workers' batch losses, biased low against the others. Prints a
markdown table, checks that --optex 1 gives AdamW's losses exactly, and saves
a plot of the loss curves.

Usage:
    /usr/bin/python3 bench/optex_gpt.py [--train-gpt PATH] [--steps 300] [--workers 2,4]
        [--out PNG] [--extra]

Exits non-zero if a run fails or --optex 1 differs from AdamW.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64", "--batch", "16", "--lr", "1e-3"]
TOKENS = 16 * 64  # batch x seq: tokens of one gradient
WINDOW = 10       # final loss, time-to-target and plot smoothing: 10 sequential iterations
COLORS = {2: "tab:blue", 4: "tab:red", 8: "tab:green", 16: "tab:purple"}
EXTRA = [("OptEx 4, l = 0.1 untuned", 4, ["--optex-tune", "0"], "tab:orange"),
         ("OptEx 4, l = 1 untuned", 4, ["--optex-tune", "0", "--optex-length-scale", "1"], "tab:olive"),
         ("OptEx 4, lowest-loss", 4, ["--optex-select", "lowest-loss"], "tab:brown")]


def train(train_gpt, tmp, name, steps, flags):
    """Runs train_gpt; returns ([loss per step], [seconds per step], wall seconds) or raises."""
    metrics = os.path.join(tmp, "".join(c if c.isalnum() else "_" for c in name) + ".jsonl")
    cmd = [train_gpt] + CONFIG + ["--steps", str(steps)] + flags + ["--metrics", metrics]
    print("$ OPENBLAS_NUM_THREADS=1 " + " ".join(cmd), file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout)
        raise RuntimeError("%s: train_gpt exited with status %d" % (name, proc.returncode))
    workers = int(flags[flags.index("--optex") + 1]) if "--optex" in flags else 1
    records = {}
    with open(metrics) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                records[int(r["step"])] = (float(r["loss"]), workers * TOKENS / float(r["tokens_per_s"]))
    if sorted(records) != list(range(steps)):
        raise RuntimeError("%s: %s has %d steps, expected %d" % (name, metrics, len(records), steps))
    return [records[s][0] for s in range(steps)], [records[s][1] for s in range(steps)], wall


def trailing_mean(values, window=WINDOW):
    """Trailing mean; the first points average what there is."""
    return [sum(values[max(0, i + 1 - window):i + 1]) / min(i + 1, window) for i in range(len(values))]


def iterations_to(losses, target):
    """Sequential iterations (1-based) until a full WINDOW-iteration trailing mean is <= target; None if never."""
    smooth = trailing_mean(losses)
    return next((i + 1 for i in range(WINDOW - 1, len(losses)) if smooth[i] <= target), None)


def plot(runs, steps, out):
    fig, ax = plt.subplots(figsize=(11, 5))
    for run in runs:
        x = range(1, len(run["losses"]) + 1)
        style = dict(color=run["color"], linestyle="--" if run["kind"] == "target" else "-")
        ax.plot(x, run["losses"], linewidth=0.6, alpha=0.18, **style)
        ax.plot(x, trailing_mean(run["losses"]), linewidth=2.2 if run["kind"] == "adamw" else 1.4,
                label=run["name"], **style)
    ax.axhline(runs[0]["final"], color="black", linestyle=":", linewidth=0.8, label="AdamW's final loss")
    ax.set_yscale("log")
    low = min(min(trailing_mean(r["losses"])) for r in runs)
    ax.set_ylim(0.9 * low, 6.0)
    ticks = [t for t in (0.5, 0.6, 0.7, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0) if t >= 0.9 * low]
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(0, steps)
    ax.set_xlabel("sequential iteration")
    ax.set_ylabel("training loss (%d-iteration trailing mean; raw faint; log scale)" % WINDOW)
    ax.set_title("OptEx<AdamW> vs AdamW, GPT config B, %d sequential iterations" % steps)
    ax.grid(True, which="major", alpha=0.3)
    # Outside the axes: every corner inside holds a curve.
    ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="solid: OptEx N (estimated)\ndashed: Target N (exact)", title_fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-gpt", default=os.path.join(REPO, "build", "release", "examples", "train_gpt"),
                        help="path of the train_gpt binary (default build/release/examples/train_gpt)")
    parser.add_argument("--steps", type=int, default=300, help="sequential iterations per run (default 300)")
    parser.add_argument("--workers", default="2,4", help="OptEx worker counts, comma-separated (default 2,4)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "images", "optex_gpt.png"),
                        help="output PNG (default docs/images/optex_gpt.png)")
    parser.add_argument("--extra", action="store_true",
                        help="also OptEx 4 untuned at l = 0.1 (the reference's default) and l = 1, "
                             "and with --optex-select lowest-loss")
    args = parser.parse_args()
    if args.steps < 2 * WINDOW:
        parser.error("--steps must be at least %d" % (2 * WINDOW))
    workers = sorted({int(n) for n in args.workers.split(",") if n.strip()})
    if not workers or workers[0] < 2:
        parser.error("--workers takes counts >= 2")
    if not os.access(args.train_gpt, os.X_OK):
        print("error: %s is not an executable; build it first" % args.train_gpt, file=sys.stderr)
        return 2

    # (name, kind, N, train_gpt flags, colour); Target N's curve is every N-th step.
    plan = [("AdamW", "adamw", 1, [], "black"), ("OptEx 1 (sanity)", "sanity", 1, ["--optex", "1"], "grey")]
    for n in workers:
        color = COLORS.get(n, "tab:cyan")
        plan += [("OptEx %d" % n, "optex", n, ["--optex", str(n)], color), ("Target %d" % n, "target", n, [], color)]
    if args.extra:
        plan += [(name, "optex", n, ["--optex", str(n)] + flags, color) for name, n, flags, color in EXTRA]

    runs, failed = [], []
    with tempfile.TemporaryDirectory(prefix="optex_gpt_") as tmp:
        for name, kind, n, flags, color in plan:  # one run at a time
            steps = n * args.steps if kind == "target" else args.steps
            try:
                losses, seconds, wall = train(args.train_gpt, tmp, name, steps, flags)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                print("error: %s" % e, file=sys.stderr, flush=True)
                failed.append(name)
                continue
            if kind == "target":  # sequential iteration i = steps i N .. (i+1) N - 1; report the last
                losses = losses[n - 1::n]
            runs.append(dict(name=name, kind=kind, n=n, color=color, losses=losses, wall=wall,
                             per_iteration=sum(seconds) / args.steps, final=sum(losses[-WINDOW:]) / WINDOW))
    if not runs or runs[0]["kind"] != "adamw":
        print("error: the AdamW baseline failed", file=sys.stderr)
        return 1

    adamw = runs[0]
    sanity = next((r for r in runs if r["kind"] == "sanity"), None)
    identical = sanity is not None and sanity["losses"] == adamw["losses"]
    print("sanity: --optex 1 and AdamW losses %s over %d steps" % (
        "identical" if identical else "DIFFER" if sanity else "not compared (run failed)", args.steps))

    base_iterations = iterations_to(adamw["losses"], adamw["final"])
    print("\n| run | N | final loss (mean of last %d) | iterations to AdamW's final %.4f | speed-up vs AdamW "
          "| sqrt(N) | s per sequential iteration | wall s |" % (WINDOW, adamw["final"]))
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        if run["kind"] == "sanity":
            continue
        reached = iterations_to(run["losses"], adamw["final"])
        speedup = "%.2f" % (base_iterations / reached) if reached else "-"
        print("| %s | %d | %.4f | %s | %s | %.2f | %.4f | %.1f |" % (
            run["name"], run["n"], run["final"], reached if reached else "not reached", speedup,
            math.sqrt(run["n"]), run["per_iteration"], run["wall"]))
    if any("lowest-loss" in r["name"] for r in runs):
        print("\nlowest-loss: its logged loss is the lowest of the N workers' batch losses, biased low "
              "against the others (one batch each)")
    sys.stdout.flush()

    plot([r for r in runs if r["kind"] != "sanity"], args.steps, args.out)
    print("\nwrote %s" % args.out, file=sys.stderr)
    if failed:
        print("error: failed runs: %s" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
