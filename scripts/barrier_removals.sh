#!/usr/bin/env bash
# Removes each call of a barrier (__syncwarp() or __syncthreads()) in a CUDA
# header in turn, rebuilds the simulated tests and runs them: which removals
# the warp simulator catches (docs/design.md, "A rendezvous is not a memory
# barrier"). The header is restored after each run, and on exit.
#
#   scripts/barrier_removals.sh [BARRIER] [HEADER] [TEST FILTER] [BUILD DIR]
#   defaults: __syncwarp include/loom/kernels/cuda/attention_bf16.cuh "[bf16]" build/release
#   LINES="143 146" scripts/barrier_removals.sh ...   only the calls on those lines
#
# Runs the tests under each of the simulator's turn orders (LOOM_SIM_TURNS).
# About a minute a removal on 2 cores. Prints one line per call: its line
# number, then "caught" (the tests failed) with the turn orders that caught
# it, or "passes".
set -euo pipefail
cd "$(dirname "$0")/.."
barrier=${1:-__syncwarp}
header=${2:-include/loom/kernels/cuda/attention_bf16.cuh}
filter=${3:-[bf16]}
build=${4:-build/release}
case "$barrier" in
    __syncwarp | __syncthreads) ;;
    *) echo "barrier_removals: barrier '$barrier' is neither __syncwarp nor __syncthreads" >&2; exit 1 ;;
esac
[[ -f "$header" ]] || { echo "barrier_removals: no header $header" >&2; exit 1; }
[[ -d "$build" ]] || { echo "barrier_removals: no build directory $build; configure it first (cmake --preset release)" >&2; exit 1; }
backup=$(mktemp)
cp "$header" "$backup"
trap 'cp "$backup" "$header"; rm -f "$backup"' EXIT
mapfile -t lines < <(grep -n "$barrier();" "$header" | cut -d: -f1)
echo "${#lines[@]} calls of $barrier() in $header"
if [[ -n "${LINES:-}" ]]; then  # only these (their line numbers, space-separated)
    read -r -a wanted <<< "$LINES"
    for line in "${wanted[@]}"; do
        [[ " ${lines[*]} " == *" $line "* ]] || { echo "barrier_removals: line $line of $header holds no $barrier();" >&2; exit 1; }
    done
    lines=("${wanted[@]}")
fi
for line in "${lines[@]}"; do
    cp "$backup" "$header"
    sed -i "${line}s/$barrier();/\/* removed *\//" "$header"
    make -C "$build" loom_simulated_tests > /dev/null
    caught=()
    for turns in sweeps warps warps-reversed; do  # warp_simulator.hpp, Turns
        # a subshell: an abort is a result (and the shell's "Aborted" goes to /dev/null too)
        if ! { (LOOM_SIM_TURNS=$turns "$build/tests/loom_simulated_tests" "$filter") > /dev/null 2>&1; } 2> /dev/null; then
            caught+=("$turns")
        fi
    done
    if ((${#caught[@]} == 0)); then
        echo "line $line: passes"
    else
        echo "line $line: caught (turns: ${caught[*]})"
    fi
done
