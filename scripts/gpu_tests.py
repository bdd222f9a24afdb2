#!/usr/bin/env python3
"""Runs every test case of loom_cuda_tests in a process of its own, a few at a time.

    python3 scripts/gpu_tests.py BINARY OUT_DIR [--jobs 4] [--timeout 90] [--budget 150]

Why one process per test case: on a GPU that has never run these kernels, one
illegal address poisons the CUDA context and a crash ends the binary, which
would leave every later test unreported; a hang would eat the whole device
call. Here a crash or a hang costs only its own test case, and every case gets
a line: pass, FAIL (with its exit code or signal), TIMEOUT, or "not run" when
the --budget seconds ran out first. Writes OUT_DIR/cuda_tests.txt (one line per
case as it ends, then the totals) and OUT_DIR/cuda_tests_failures.txt (the
output of every case that did not pass); exits 1 unless every case passed.
"""

import argparse
import collections
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time


def spec_of(name):
    """A Catch2 v2 test spec that matches exactly this name: `\\`, `,`, `[` and `]` escaped."""
    for special in ("\\", ",", "[", "]"):
        name = name.replace(special, "\\" + special)
    return name


def test_names(binary):
    # Catch2 v2 exits with the number of test cases listed, so the exit code says nothing here.
    listing = subprocess.run([binary, "--list-test-names-only"], capture_output=True, text=True, timeout=120)
    # main() prints the device's name before Catch2 lists the tests.
    names = [line for line in listing.stdout.splitlines() if line.strip() and not line.startswith("CUDA device ")]
    if not names or names[0].startswith("SKIPPED"):
        sys.exit(f"gpu_tests: {binary} --list-test-names-only listed no tests:\n{listing.stdout}{listing.stderr}")
    return names


def verdict(code):
    """subprocess gives a signal as a negative code; a positive one is Catch2's
    count of failed assertions (capped at 255), never a signal."""
    if code == 0:
        return "pass"
    if code == 124:
        return "TIMEOUT"
    if code < 0:
        try:
            return f"FAIL (signal {signal.Signals(-code).name})"
        except ValueError:
            return f"FAIL (signal {-code})"
    return f"FAIL (exit {code})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("out_dir")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--timeout", type=int, default=90, help="seconds one test case may take")
    parser.add_argument("--budget", type=int, default=150, help="seconds after which no new case starts")
    parser.add_argument("--list-specs", action="store_true", help="print each name's spec and exit (no GPU needed)")
    args = parser.parse_args()
    names = test_names(args.binary)
    if args.list_specs:
        print("\n".join(spec_of(n) for n in names))
        return 0
    started = time.monotonic()
    os.makedirs(args.out_dir, exist_ok=True)
    summary_path = os.path.join(args.out_dir, "cuda_tests.txt")
    failures_path = os.path.join(args.out_dir, "cuda_tests_failures.txt")
    lock = threading.Lock()
    # Each result is written as it comes, so that a run killed from outside still reports what ran.
    with open(summary_path, "w", encoding="utf-8"), open(failures_path, "w", encoding="utf-8"):
        pass

    def record(line, failure):
        with lock:
            with open(summary_path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
            if failure:
                with open(failures_path, "a", encoding="utf-8") as f:
                    f.write(failure)

    def run(name):
        elapsed = time.monotonic() - started
        if elapsed > args.budget:
            record(f"not run  {name}", "")
            return "not run"
        t0 = time.monotonic()
        # A case started near the end of the budget gets less than --timeout, never under 10 s.
        limit = max(10.0, min(args.timeout, args.budget + 30 - elapsed))
        try:
            done = subprocess.run([args.binary, spec_of(name)], capture_output=True, text=True,
                                  timeout=limit, errors="replace")
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            code = 124
            output = "".join(part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
                             for part in (e.stdout, e.stderr))
        v = verdict(code)
        # A case whose test spec matched nothing would pass by doing nothing.
        if code == 0 and "No tests ran" in output:
            v = "FAIL (its test spec matched no test case)"
        record(f"{v:<8} {time.monotonic() - t0:6.1f} s  {name}",
               "" if v == "pass" else f"===== {v}: {name}\n{output[-6000:]}\n")
        return "pass" if v == "pass" else "fail"

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(run, names))
    counts = collections.Counter(outcomes)
    totals = (f"{counts['pass']} passed, {counts['fail']} failed, {counts['not run']} not run, "
              f"of {len(names)} test cases; {time.monotonic() - started:.0f} s")
    record(totals, "")
    with open(failures_path, "a", encoding="utf-8") as f:
        if not counts["fail"]:
            f.write("no failures\n")
    print(open(summary_path, encoding="utf-8").read(), end="")
    return 0 if counts["fail"] == 0 and counts["not run"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
