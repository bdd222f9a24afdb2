#!/bin/sh
# SIGINT and SIGTERM stop train_gpt after its current step: it saves --save,
# exits 128 + the signal (130, 143), leaves no "<file>.tmp-<pid>" behind,
# and the checkpoint resumes. A temporary a killed run left is removed on
# the next run. --save-every 1 --keep 2 makes the signal often land during a
# save and checks the retention. Only generous waits, no timing asserts.
# Args: the train_gpt binary, a scratch directory.
set -u
TRAIN_GPT=$1
DIR=$2
rm -rf "$DIR" && mkdir -p "$DIR" || exit 1
MODEL="--layers 1 --width 16 --heads 2 --seq 8 --batch 2 --seed 3"
fail() { echo "FAIL: $*"; for f in "$DIR"/*.out; do echo "--- $f"; cat "$f"; done; exit 1; }

# A temporary "left by a killed run": a pid that cannot be alive (above pid_max).
: > "$DIR/INT.st.tmp-999999999"

# SIGINT on one rank, SIGTERM on one, SIGINT on 8 rank threads (dp x pp x tp):
# the ranks agree on the step to stop at, and none waits forever.
for each in INT: TERM: "INT:--layers 2 --batch 4 --dp 2 --pp 2 --tp 2"; do
  sig=${each%%:*}
  extra=${each#*:}
  name=$sig${extra:+-ranks}
  want=$([ $sig = INT ] && echo 130 || echo 143)
  "$TRAIN_GPT" $MODEL $extra --steps 1000000 --save "$DIR/$name.st" --save-every 1 --keep 2 \
      --metrics "$DIR/$name.jsonl" > "$DIR/$name.out" 2>&1 &
  pid=$!
  # Wait (up to 60 s) until it has trained a few steps, then signal it.
  n=0
  while [ "$(cat "$DIR/$name.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; do
    kill -0 $pid 2>/dev/null || fail "SIG$sig: train_gpt ended before it was signalled"
    n=$((n + 1)); [ $n -gt 600 ] && { kill -KILL $pid; fail "no 3 steps in 60 s"; }
    sleep 0.1
  done
  kill -$sig $pid
  wait $pid
  rc=$?
  [ $rc -eq $want ] || fail "SIG$sig: exit $rc, expected $want"
  grep -q "train_gpt: SIG$sig: stopped after step [0-9]* of 1000000; continue with --resume $DIR/$name.st" "$DIR/$name.out" ||
    fail "SIG$sig: no stop message"
  saved=$(sed -n 's/^saved .* (step \([0-9]*\))$/\1/p' "$DIR/$name.out" | tail -1)
  [ -n "$saved" ] || fail "SIG$sig: nothing saved"
  ls "$DIR" | grep -q '\.tmp-' && fail "SIG$sig: a temporary file remains: $(ls "$DIR")"
  periodic=$(ls "$DIR" | grep -c "^$name\\.st\\.step-[0-9]*$")
  [ "$periodic" -eq 2 ] || fail "SIG$sig: $periodic periodic checkpoints, expected --keep 2: $(ls "$DIR")"
  # The checkpoint loads and the run goes on from it.
  "$TRAIN_GPT" $MODEL $extra --steps 1000000 --until $((saved + 2)) --resume "$DIR/$name.st" > "$DIR/$name-resume.out" 2>&1 ||
    fail "SIG$sig: the resume failed"
  grep -q "resumed from $DIR/$name.st at step $saved" "$DIR/$name-resume.out" || fail "SIG$sig: did not resume at step $saved"
  grep -q "final loss" "$DIR/$name-resume.out" || fail "SIG$sig: the resumed run did not train"
done
grep -q "removed $DIR/INT.st.tmp-999999999, a temporary file left by a run that was killed" "$DIR/INT.out" ||
  fail "the stale temporary was not reported as removed"
echo "SIGINT and SIGTERM, on 1 and 8 ranks: saved, exit 130 and 143, no temporaries, resumed"
