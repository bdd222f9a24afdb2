#!/usr/bin/env bash
# Removes each call of a barrier (__syncwarp() or __syncthreads()) in a CUDA
# header in turn, rebuilds the simulated tests and runs them under each of
# the warp simulator's turn orders (LOOM_SIM_TURNS): which removals the
# simulator catches (docs/design.md, "A rendezvous is not a memory barrier"
# and "Warps in step hide a missing __syncthreads"). The header is restored
# after each run, and on exit, when the tests are rebuilt from it.
#
#   scripts/barrier_removals.sh [BARRIER] [HEADER] [TEST FILTER] [BUILD DIR]
#   defaults: __syncwarp dev/kernel_lab/attention_wmma.cuh "~[simulator]" build/release
#   BARRIER_LINES="143 146" scripts/barrier_removals.sh ...   only the calls on those lines
#
# The unmodified header must pass first, under every turn order. About a
# minute a removal on 2 cores. Prints one line per call: its line number,
# then "caught" (the tests failed) with the turn orders that caught it, or
# "passes".
set -euo pipefail
cd "$(dirname "$0")/.."
barrier=${1:-__syncwarp}
header=${2:-dev/kernel_lab/attention_wmma.cuh}
filter=${3:-"~[simulator]"}
build=${4:-build/release}
case "$barrier" in
    __syncwarp | __syncthreads) ;;
    *) echo "barrier_removals: barrier '$barrier' is neither __syncwarp nor __syncthreads" >&2; exit 1 ;;
esac
[[ -f "$header" ]] || { echo "barrier_removals: no header $header" >&2; exit 1; }
[[ -d "$build" ]] || { echo "barrier_removals: no build directory $build; configure it first (cmake --preset release)" >&2; exit 1; }
mapfile -t lines < <(grep -n "$barrier();" "$header" | cut -d: -f1)
echo "${#lines[@]} calls of $barrier() in $header"
# (Not LINES: bash sets that to the terminal's height.)
if [[ -n "${BARRIER_LINES:-}" ]]; then
    read -r -a wanted <<< "$BARRIER_LINES"
    for line in "${wanted[@]}"; do
        [[ " ${lines[*]} " == *" $line "* ]] || { echo "barrier_removals: line $line of $header holds no $barrier();" >&2; exit 1; }
    done
    lines=("${wanted[@]}")
fi

rebuild() { cmake --build "$build" --target loom_simulated_tests > /dev/null; }
# The turn orders under which the tests fail, space-separated (none: empty).
failing_turns() {
    local turns failed=()
    for turns in sweeps warps warps-reversed; do
        # a subshell: an abort is a result (and the shell's "Aborted" goes to /dev/null too)
        if ! { (LOOM_SIM_TURNS=$turns timeout 900 "$build/tests/loom_simulated_tests" "$filter") > /dev/null 2>&1; } 2> /dev/null; then
            failed+=("$turns")
        fi
    done
    echo "${failed[*]}"
}

backup=$(mktemp)
cp "$header" "$backup"
trap 'cp "$backup" "$header"; rm -f "$backup"; rebuild || echo "barrier_removals: rebuild the simulated tests: they may hold a removal" >&2' EXIT
rebuild
baseline=$(failing_turns)
[[ -z "$baseline" ]] || { echo "barrier_removals: '$filter' fails with the header unmodified (turns: $baseline)" >&2; exit 1; }
for line in "${lines[@]}"; do
    cp "$backup" "$header"
    sed -i "${line}s/$barrier();/\/* removed *\//" "$header"
    rebuild
    caught=$(failing_turns)
    if [[ -z "$caught" ]]; then
        echo "line $line: passes"
    else
        echo "line $line: caught (turns: $caught)"
    fi
done
