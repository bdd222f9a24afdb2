#!/usr/bin/python3
"""Convergence study of data-parallel gradient compression (issue 9).

Trains the small GPT of config B of the GPT benchmark (layers 2, width 64,
heads 4, seq 64, batch 16, dp = 4: 4 sequences per rank) once per
compressor, one run at a time, and compares the loss curves with the
uncompressed run.

Prints a markdown table (final loss as the mean of the last 10 steps and as
the last step's loss, ratio to uncompressed, within 5 %, warm-up steps, wall
seconds) and saves a plot of the loss curves (10-step moving average, the
end of each compressor's uncompressed warm-up as a dotted line).

Usage:
    /usr/bin/python3 bench/compression_convergence.py [--train-gpt PATH] [--steps N]
        [--out PNG] [--extra "topk:0.05,topk:0.1"]

Exits non-zero if any run fails.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPRESSORS = ["none", "bf16", "fp16", "int8", "topk:0.01", "powersgd:4", "onebit"]
# Controls: uncompressed with AdamW's variance frozen where the error-feedback
# compressors freeze it (their warm-up ends), "none@fv30" = --freeze-variance 30.
CONTROLS = ["none@fv30", "none@fv60"]
CONFIG = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64", "--batch", "16", "--dp", "4"]
LAST = 10        # final loss: mean of the last LAST steps
SMOOTH = 10      # moving-average window of the plot
TOLERANCE = 0.05  # "within 5 %": final <= 1.05 x the uncompressed final (lower is better)
WARMUP_RE = re.compile(r"starts after (\d+) uncompressed warm-up steps")


def file_name(compressor):
    """A file-name-safe form of a compressor spec: topk:0.01 -> topk_0.01."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", compressor)


def run(train_gpt, compressor, steps):
    """Runs one training; returns (losses, warmup, wall seconds) or raises."""
    metrics = "/tmp/conv_%s.jsonl" % file_name(compressor)
    if os.path.exists(metrics):
        os.remove(metrics)
    spec, _, frozen = compressor.partition("@fv")
    cmd = [train_gpt] + CONFIG + ["--steps", str(steps), "--compress", spec, "--metrics", metrics]
    if frozen:
        cmd += ["--freeze-variance", frozen]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    print("$ OPENBLAS_NUM_THREADS=1 " + " ".join(cmd), file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout)
        raise RuntimeError("%s: train_gpt exited with status %d" % (compressor, proc.returncode))
    match = WARMUP_RE.search(proc.stdout)
    warmup = int(match.group(1)) if match else 0
    by_step = {}
    with open(metrics) as f:
        for line in f:
            line = line.strip()
            if line:
                record = json.loads(line)
                by_step[int(record["step"])] = float(record["loss"])
    losses = [by_step[s] for s in sorted(by_step)]
    if len(losses) != steps:
        raise RuntimeError("%s: %s has %d steps, expected %d" % (compressor, metrics, len(losses), steps))
    return losses, warmup, wall


def moving_average(values, window):
    """Trailing moving average; the first points average what there is."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(results, compressors, steps, out):
    """Loss curves ({compressor: (losses, warmup, wall)}) on one axis, saved as a PNG."""
    fig, ax = plt.subplots(figsize=(9, 5))
    colors = [c for c in plt.get_cmap("tab10").colors if c != plt.get_cmap("tab10").colors[7]]  # no grey
    lows = []
    i = 0
    for compressor in compressors:
        if compressor not in results:
            continue
        losses, warmup, _ = results[compressor]
        smooth = moving_average(losses, SMOOTH)
        lows.append(min(smooth))
        spec, _, frozen = compressor.partition("@fv")
        label = spec + (" (warm-up %d)" % warmup if warmup > 0 else "") + \
            (", AdamW v frozen at step %s (control)" % frozen if frozen else "")
        if compressor == "none":
            # The reference: thick and black, under the others (the casts lie on it).
            ax.plot(range(len(losses)), smooth, color="black", linewidth=3.0, alpha=0.55, zorder=1,
                    label=label + ", reference")
            continue
        color = colors[i % len(colors)]
        style = "-" if i < len(colors) else "--"
        i += 1
        ax.plot(range(len(losses)), smooth, style, color=color, linewidth=1.3, zorder=2, label=label)
        if warmup > 0:
            ax.axvline(warmup, color=color, linestyle=":", linewidth=1.2, zorder=0)
    ax.set_yscale("log")
    ticks = [t for t in (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0) if t >= 0.9 * min(lows)]
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(0, steps)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (%d-step moving average, log scale)" % SMOOTH)
    ax.set_title("Gradient compression, GPT config B, dp = 4, %d steps" % steps)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(title="compressor (dotted line: end of warm-up)", fontsize=9, title_fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-gpt", default=os.path.join(REPO, "build", "release", "examples", "train_gpt"),
                        help="path of the train_gpt binary (default build/release/examples/train_gpt)")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "images", "compression_convergence.png"),
                        help="output PNG (default docs/images/compression_convergence.png)")
    parser.add_argument("--extra", default="", help="extra compressors, comma-separated, e.g. topk:0.05,topk:0.1")
    args = parser.parse_args()

    if args.steps < LAST:
        parser.error("--steps must be at least %d" % LAST)
    if not os.access(args.train_gpt, os.X_OK):
        print("error: %s is not an executable; build it first" % args.train_gpt, file=sys.stderr)
        return 2
    compressors = list(COMPRESSORS) + list(CONTROLS)
    for extra in (c.strip() for c in args.extra.split(",")):
        if extra and extra not in compressors:
            compressors.append(extra)

    results, failed = {}, []
    for compressor in compressors:  # sequentially: never two runs at once
        try:
            results[compressor] = run(args.train_gpt, compressor, args.steps)
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            print("error: %s" % e, file=sys.stderr, flush=True)
            failed.append(compressor)

    baseline = None
    if "none" in results:
        baseline = sum(results["none"][0][-LAST:]) / LAST
    print()
    def final_of(name):
        return sum(results[name][0][-LAST:]) / LAST if name in results else None

    print("| compressor | final loss (mean of last %d) | final loss (last step) | ratio to none "
          "| within 5%% | ratio to none with v frozen alike | warm-up steps | wall s |" % LAST)
    print("|---|---:|---:|---:|:---:|---:|---:|---:|")
    for compressor in compressors:
        if compressor not in results:
            print("| %s | failed | | | | | |" % compressor)
            continue
        losses, warmup, wall = results[compressor]
        final = sum(losses[-LAST:]) / LAST
        if baseline:
            ratio = final / baseline
            ratio_s, within = "%.3f" % ratio, ("yes" if ratio <= 1.0 + TOLERANCE else "no")
        else:
            ratio_s, within = "n/a", "n/a"
        # Error-feedback compressors freeze AdamW's variance at their warm-up's end.
        control = final_of("none@fv%d" % warmup) if warmup > 0 and "@fv" not in compressor else None
        controlled = "%.3f" % (final / control) if control else "-"
        print("| %s | %.4f | %.4f | %s | %s | %s | %d | %.1f |"
              % (compressor, final, losses[-1], ratio_s, within, controlled, warmup, wall))
    sys.stdout.flush()

    if results:
        plot(results, compressors, args.steps, args.out)
        print("\nwrote %s" % args.out, file=sys.stderr)

    if failed:
        print("error: failed runs: %s" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
