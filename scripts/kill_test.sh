#!/usr/bin/env bash
# The kill test (issue 37): N tries, each starting train_gpt (resuming the
# previous try's checkpoint, saving every step so signals often land during a
# save) and sending it SIGINT, SIGTERM or SIGKILL after a random delay, from
# before its handlers are installed to the middle of training. After every
# try:
#   - SIGINT/SIGTERM: exit 130/143, no "<file>.tmp-<pid>" of that process,
#     and when the run said it stopped, --save holds the step it named;
#   - every checkpoint present (--save and the newest periodic one) loads and
#     trains one more step (--resume), so a kill, even SIGKILL, never leaves
#     a corrupt or half-written checkpoint behind the name;
# and at the end one more run with --save removes the temporaries SIGKILL left.
# Args: the train_gpt binary, a scratch directory, N (default 100), a seed
# for the random delays and signals (default: the clock), the largest delay
# in ms (default 1500), and the checkpoint form: whole (one file, the
# default) or sharded (--sharded: a directory, saved in the background).
set -u
# Job control: a background job of a non-interactive shell starts with SIGINT
# ignored, so a SIGINT before train_gpt installs its handler would be lost
# (a terminal's Ctrl-C is not); with -m it keeps the default action.
set -m
# And a shell that itself started with SIGINT ignored (a background job, nohup
# under some shells) cannot reset it for its children: env can.
DEFAULT_SIGNALS=()
env --default-signal=INT true 2>/dev/null && DEFAULT_SIGNALS=(env --default-signal=INT)
TRAIN_GPT=$1
DIR=$2
TRIES=${3:-100}
SEED=${4:-$(date +%s)}
MAX_DELAY_MS=${5:-1500}
FORM=${6:-whole}
RANDOM=$SEED
rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
MODEL=(--layers 1 --width 16 --heads 2 --seq 8 --batch 2 --seed 3)
SAVE=$DIR/run.st
SAVE_FLAGS=(--keep 2)
if [ "$FORM" = sharded ]; then SAVE=$DIR/run.d; SAVE_FLAGS=(--sharded); fi
# Whether a checkpoint is there: the file, or the directory's index.
present() { if [ "$FORM" = sharded ]; then [ -f "$1/index.json" ]; else [ -f "$1" ]; fi; }
fail() { echo "FAIL (try $try, seed $SEED): $*"; ls -la "$DIR"; for f in "$DIR"/*.out; do echo "--- $f"; tail -5 "$f"; done; exit 1; }

# The step a checkpoint holds, from its safetensors header's metadata.
step_of() {
  if [ -d "$1" ]; then grep -o '"step": "[0-9]*"' "$1/index.json" | head -1 | tr -dc 0-9
  else head -c 65536 "$1" | tr -d '\0' | grep -ao '"step":"[0-9]*"' | head -1 | tr -dc 0-9; fi
}

# The checkpoint loads and trains one step on from where it stopped.
check_loads() {
  local file=$1 step
  step=$(step_of "$file")
  [ -n "$step" ] || fail "$file has no step in its header: a half-written checkpoint"
  "$TRAIN_GPT" "${MODEL[@]}" --steps 1000000 --until $((step + 1)) --resume "$file" > "$DIR/check.out" 2>&1 ||
    fail "$file (step $step) does not resume: $(tail -1 "$DIR/check.out")"
  grep -q "resumed from $file at step $step" "$DIR/check.out" || fail "$file did not resume at step $step"
}

start=$(date +%s)
counts=(0 0 0)  # SIGINT, SIGTERM, SIGKILL
stopped=0       # tries where the handler ran and saved
for ((try = 1; try <= TRIES; ++try)); do
  r=$((RANDOM % 10))
  if [ $r -lt 4 ]; then sig=INT; want=130; counts[0]=$((counts[0] + 1))
  elif [ $r -lt 8 ]; then sig=TERM; want=143; counts[1]=$((counts[1] + 1))
  else sig=KILL; want=137; counts[2]=$((counts[2] + 1)); fi
  resume=()
  present "$SAVE" && resume=(--resume "$SAVE")
  "${DEFAULT_SIGNALS[@]}" "$TRAIN_GPT" "${MODEL[@]}" --steps 1000000 --save "$SAVE" --save-every 1 "${SAVE_FLAGS[@]}" "${resume[@]}" \
      > "$DIR/try.out" 2>&1 &
  pid=$!
  delay_ms=$((RANDOM * 32768 + RANDOM))
  delay_ms=$((delay_ms % MAX_DELAY_MS))
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -$sig $pid 2>/dev/null || fail "train_gpt ended before SIG$sig: $(tail -1 "$DIR/try.out")"
  # A stopped run ends within seconds; one that does not is a failure, not a hang.
  for ((n = 0; n < 600; ++n)); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  kill -0 $pid 2>/dev/null && { kill -KILL $pid; fail "SIG$sig after $delay_ms ms: still running 30 s later"; }
  wait $pid
  rc=$?
  [ $rc -eq $want ] || fail "SIG$sig after $delay_ms ms: exit $rc, expected $want: $(tail -1 "$DIR/try.out")"
  if [ $sig != KILL ]; then
    [ -n "$(find "$DIR" -name "*.tmp-$pid")" ] && fail "SIG$sig after $delay_ms ms left a temporary: $(ls -R "$DIR")"
    if grep -q "train_gpt: SIG$sig: stopped after step" "$DIR/try.out"; then
      said=$(sed -n "s/^train_gpt: SIG$sig: stopped after step \([0-9]*\) of .*/\1/p" "$DIR/try.out")
      [ "$(step_of "$SAVE")" = "$said" ] || fail "SIG$sig: stopped after step $said but $SAVE holds step $(step_of "$SAVE")"
      stopped=$((stopped + 1))
    fi
  fi
  present "$SAVE" && check_loads "$SAVE"
  newest=$(ls "$DIR" | grep '^run\.st\.step-[0-9]*$' | sort -t- -k2 -n | tail -1)
  [ -n "$newest" ] && check_loads "$DIR/$newest"
done
# A run with --save removes what SIGKILL left, and leaves nothing itself.
if present "$SAVE"; then
  step=$(step_of "$SAVE")
  last_flags=()
  [ "$FORM" = sharded ] && last_flags=(--sharded)
  "$TRAIN_GPT" "${MODEL[@]}" --steps 1000000 --until $((step + 1)) --save "$SAVE" "${last_flags[@]}" --resume "$SAVE" > "$DIR/last.out" 2>&1 ||
    fail "the last run failed: $(tail -1 "$DIR/last.out")"
  [ -n "$(find "$DIR" -name '*.tmp-*')" ] && fail "temporaries remain after a run with --save: $(ls -R "$DIR")"
fi
echo "kill test ($FORM): $TRIES tries (SIGINT ${counts[0]}, SIGTERM ${counts[1]}, SIGKILL ${counts[2]}; $stopped stopped and saved)," \
     "every checkpoint loaded and resumed, no temporaries left; seed $SEED, $(($(date +%s) - start)) s"
