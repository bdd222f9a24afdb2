#!/usr/bin/env bash
# Removes each __syncwarp() of a CUDA header in turn, rebuilds the simulated
# tests and runs them: which removals the warp simulator catches
# (docs/design.md, "A rendezvous is not a memory barrier"). The header is
# restored after each run, and on exit.
#
#   scripts/syncwarp_removals.sh [HEADER] [TEST FILTER] [BUILD DIR]
#   defaults: include/loom/kernels/cuda/attention_bf16.cuh "[bf16]" build/release
#
# About 40 s a removal on 2 cores. Prints one line per call: its line number,
# then "caught" (the tests failed) or "passes".
set -euo pipefail
cd "$(dirname "$0")/.."
header=${1:-include/loom/kernels/cuda/attention_bf16.cuh}
filter=${2:-[bf16]}
build=${3:-build/release}
[[ -f "$header" ]] || { echo "syncwarp_removals: no header $header" >&2; exit 1; }
[[ -d "$build" ]] || { echo "syncwarp_removals: no build directory $build; configure it first (cmake --preset release)" >&2; exit 1; }
backup=$(mktemp)
cp "$header" "$backup"
trap 'cp "$backup" "$header"; rm -f "$backup"' EXIT
mapfile -t lines < <(grep -n "__syncwarp();" "$header" | cut -d: -f1)
echo "${#lines[@]} calls of __syncwarp() in $header"
for line in "${lines[@]}"; do
    cp "$backup" "$header"
    sed -i "${line}s/__syncwarp();/\/* removed *\//" "$header"
    make -C "$build" loom_simulated_tests > /dev/null
    if ("$build/tests/loom_simulated_tests" "$filter") > /dev/null 2>&1; then  # a subshell: an abort is a result
        echo "line $line: passes"
    else
        echo "line $line: caught"
    fi
done
