#!/usr/bin/env python3
"""Where a GPU program's kernel time goes, from Nsight Compute's per-launch CSV.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM > raw.csv
    python3 scripts/gpu_profile.py raw.csv [--top 25]

Sums gpu__time_duration over the launches of each kernel (its name without
template arguments and parameters) and prints one line per kernel, the
heaviest first: total ms, share of all kernel time, launches, mean us. Nsight
Compute runs each kernel alone, so the total is the step's kernel time without
overlap or launch gaps; compare it with the timed step to see the gaps.
"""

import argparse
import collections
import csv
import re
import sys

SECONDS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0}


def short_name(name):
    """`void loom::kernels::cuda::detail::gelu<float>(const float*, ...)` -> `loom::kernels::cuda::detail::gelu`."""
    name = re.sub(r"^void ", "", name)
    name = name.split("(")[0]
    depth, kept = 0, []
    for ch in name:  # drop template arguments, nested ones included
        depth += ch == "<"
        if depth == 0:
            kept.append(ch)
        depth -= ch == ">"
    return "".join(kept).strip() or name


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    lines = open(args.raw, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        print("gpu_profile: no Nsight Compute CSV table in", args.raw, "; its last lines:")
        print("\n".join(lines[-15:]))
        return 1
    total, launches = collections.Counter(), collections.Counter()
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            seconds = float(row["Metric Value"].replace(",", "")) * SECONDS.get(row.get("Metric Unit", "ns"), 1e-9)
        except (KeyError, ValueError):
            continue
        name = short_name(row.get("Kernel Name", "?"))
        total[name] += seconds
        launches[name] += 1
    all_seconds = sum(total.values())
    if not all_seconds:
        print("gpu_profile: the CSV had no gpu__time_duration rows")
        return 1
    print(f"{sum(launches.values())} launches of {len(total)} kernels, {all_seconds * 1e3:.2f} ms of kernel time")
    print(f"{'ms':>9} {'share':>6} {'launches':>8} {'mean us':>9}  kernel")
    for name, seconds in total.most_common(args.top):
        print(f"{seconds * 1e3:9.3f} {seconds / all_seconds:6.1%} {launches[name]:8d} "
              f"{seconds / launches[name] * 1e6:9.1f}  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
