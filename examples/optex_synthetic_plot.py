#!/usr/bin/env python3
"""Plots examples/optex_synthetic's CSV the way Figure 2 of the OptEx paper
(arXiv 2402.11427) does: log10 of the optimality gap f(x) - f* against
sequential iterations, one panel per function, with Vanilla, OptEx N and
Target N (colour: N; line style: the method). OptEx and Target with N = 1 are
Vanilla (the example checks OptEx's bit for bit), so they are not drawn again.

  optex_synthetic_plot.py CSV [--out PNG] [--title TEXT]
  optex_synthetic_plot.py --run BUILD/examples/optex_synthetic [CSV] [--out PNG] [-- FLAGS FOR THE EXAMPLE]

With --run it runs the example first (its output passes through), writing the
CSV to CSV when given, else to a temporary file.
"""

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "images", "optex_synthetic.png")
FUNCTION_ORDER = ["sphere", "ackley", "rosenbrock", "levy"]
METHOD_STYLE = {"optex": "-", "target": ":"}


def read_runs(path):
    """{function: {(method, workers): [(iteration, gap), ...]}}, in the file's order."""
    runs = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        expected = {"function", "method", "workers", "iteration", "gap"}
        if reader.fieldnames is None or not expected <= set(reader.fieldnames):
            sys.exit(f"optex_synthetic_plot: {path} has columns {reader.fieldnames}; expected {sorted(expected)}")
        for row in reader:
            runs[row["function"]][(row["method"], int(row["workers"]))].append(
                (int(row["iteration"]), float(row["gap"])))
    if not runs:
        sys.exit(f"optex_synthetic_plot: {path} has no rows")
    return runs


def log10_gap(gap):
    # A gap can reach exactly 0 (or round below it for Ackley's e - e); clip it
    # at the smallest positive double so the log stays finite.
    return math.log10(max(gap, sys.float_info.min))


def plot(runs, out, title):
    functions = sorted(runs, key=lambda f: (FUNCTION_ORDER.index(f) if f in FUNCTION_ORDER else len(FUNCTION_ORDER), f))
    worker_counts = sorted({n for f in runs.values() for (method, n) in f if method != "vanilla" and n > 1})
    colours = {n: plt.get_cmap("viridis")(k / max(1, len(worker_counts) - 1) * 0.85) for k, n in enumerate(worker_counts)}

    fig, axes = plt.subplots(1, len(functions), figsize=(4.2 * len(functions), 3.8), squeeze=False)
    for ax, function in zip(axes[0], functions):
        for (method, n), points in runs[function].items():
            iterations = [t for t, _ in points]
            gaps = [log10_gap(g) for _, g in points]
            if method == "vanilla":
                ax.plot(iterations, gaps, color="black", lw=1.8, label="Vanilla")
            elif n > 1:
                ax.plot(iterations, gaps, color=colours[n], ls=METHOD_STYLE.get(method, "--"), lw=1.5,
                        label=f"{'OptEx' if method == 'optex' else 'Target'} N={n}")
        ax.set_title(function.capitalize())
        ax.set_xlabel("sequential iterations")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("log10 optimality gap  f(x) - f*")
    # One legend for the figure: Vanilla, then OptEx and Target by N.
    handles, labels = axes[0][0].get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i] != "Vanilla", labels[i].split()[0] == "Target",
                                                      labels[i]))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="lower center", ncol=len(labels),
               frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"optex_synthetic_plot: wrote {out}")


def main():
    # The example's flags are everything after "--", split off before argparse
    # sees them (it would take their values for the CSV argument).
    argv = sys.argv[1:]
    example_flags = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("csv", nargs="?", help="the example's --csv output (with --run: where to write it)")
    parser.add_argument("--run", metavar="BINARY", help="run this optex_synthetic first")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the PNG to write (default: docs/images/optex_synthetic.png)")
    parser.add_argument("--title", default="OptEx vs Vanilla and Target, AdamW (arXiv 2402.11427, Figure 2)")
    args = parser.parse_args(own)
    if example_flags and not args.run:
        parser.error(f"flags for the example ({' '.join(example_flags)}) need --run BINARY")

    path = args.csv
    if args.run:
        if path is None:
            handle, path = tempfile.mkstemp(suffix=".csv", prefix="optex_synthetic_")
            os.close(handle)
        result = subprocess.run([args.run, *example_flags, "--csv", path])
        if result.returncode != 0:
            sys.exit(f"optex_synthetic_plot: {args.run} exited with status {result.returncode}")
    elif path is None:
        parser.error("give the CSV to plot, or --run BINARY")
    plot(read_runs(path), args.out, args.title)


if __name__ == "__main__":
    main()
