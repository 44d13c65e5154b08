#!/usr/bin/env bash
# `sextant run` on real MPI ranks: a bad plan is refused on every rank with one message (exit 2);
# a rank that fails ends the whole job (no hang), and so does one that stops (the watchdog names
# it); resume edge cases are refused or named; a diverging loss stops with the step named; --np
# starts mpirun itself.
set -u
sextant="$1"
mpirun_cmd=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_cmd+=(--allow-run-as-root)
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
tiny=(--model gpt-tiny --micro-batch 2 --quiet)

out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run "${tiny[@]}" --steps 3 --global-batch 6 --dp 3 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "bad plan: exit $rc, want 2: $out"
[ "$(grep -c 'error:' <<<"$out")" -eq 1 ] || fail "bad plan: want exactly one error line: $out"
grep -q 'dp\*tp\*pp must equal the number of ranks (2)' <<<"$out" || fail "bad plan message: $out"

# Interleaving runs for transformers; an MLP is refused once, naming the field.
out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run --model mlp-small --quiet --steps 3 --pp 2 --schedule interleaved --vpp 2 --global-batch 4 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "interleaved MLP: exit $rc, want 2: $out"
grep -q '/schedule = "interleaved": the executor interleaves transformer stages only' <<<"$out" || fail "interleaved message: $out"

# An output path only rank 0 writes, unwritable: every rank ends with rank 0's one message (rank 1
# once waited forever at its first collective).
for flag in --log-json --trace; do
  out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run "${tiny[@]}" --steps 2 --global-batch 4 --dp 2 "$flag" /proc/nope/x.json 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "unwritable $flag: exit $rc (124 = hung), want 2: $out"
  [ "$(grep -c 'error:' <<<"$out")" -eq 1 ] || fail "unwritable $flag: want exactly one error line: $out"
  grep -q -- "$flag = /proc/nope/x.json" <<<"$out" || fail "unwritable $flag message: $out"
done

# A checkpoint directory no rank can create is refused before the first step, not after K steps;
# --resume on a directory without checkpoints (a mistyped path) is an error, not a silent step 0.
out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run "${tiny[@]}" --steps 2 --global-batch 4 --dp 2 --checkpoint /proc/nope/ckpt --checkpoint-every 1 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "unwritable checkpoint dir: exit $rc, want 2: $out"
grep -q -- "--checkpoint = /proc/nope/ckpt" <<<"$out" || fail "unwritable checkpoint message: $out"
missing=$(mktemp -d)/no-such-checkpoints
out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run "${tiny[@]}" --steps 2 --global-batch 4 --dp 2 --checkpoint "$missing" --resume 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "resume from nothing: exit $rc, want 2: $out"
grep -q "no checkpoint in this directory" <<<"$out" || fail "resume from nothing message: $out"
out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run "${tiny[@]}" --steps 2 --global-batch 4 --dp 2 --checkpoint "$missing" --resume-if-exists 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "resume-if-exists from nothing: exit $rc, want 0: $out"

# A model far too big for host memory (405B parameters: ~6 TiB of fp32 state) is refused before
# anything is allocated, on every rank, with what it needs (it died with a bare std::bad_alloc).
out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run --model llama3-405b --quiet --steps 1 --global-batch 2 --dp 2 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "model too big for the host: exit $rc, want 2: $out"
grep -q "GiB of host memory" <<<"$out" || fail "model too big message: $out"

start=$(date +%s)
out=$(SEXTANT_FAULT_RANK=1 SEXTANT_FAULT_STEP=1 timeout 120 "${mpirun_cmd[@]}" -x SEXTANT_FAULT_RANK -x SEXTANT_FAULT_STEP -np 2 "$sextant" run "${tiny[@]}" --steps 3 --global-batch 4 --dp 2 2>&1)
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "failing rank: exit $rc (124 = hung): $out"
grep -q '\[rank 1\] error: fault injected at step 1' <<<"$out" || fail "failing rank message: $out"
[ $(( $(date +%s) - start )) -lt 60 ] || fail "failing rank: the job took too long to end"

# A rank that stops (SIGSTOP) leaves the other waiting at its next collective forever: the
# watchdog ends the job within its timeout and names the rank.
start=$(date +%s)
out=$(SEXTANT_FAULT_RANK=1 SEXTANT_FAULT_STEP=2 SEXTANT_FAULT_KIND=stop timeout 120 "${mpirun_cmd[@]}" -x SEXTANT_FAULT_RANK -x SEXTANT_FAULT_STEP -x SEXTANT_FAULT_KIND -np 2 "$sextant" run "${tiny[@]}" --steps 50 --global-batch 4 --dp 2 --watchdog 5 2>&1)
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "stopped rank: exit $rc (124 = hung): $out"
grep -q 'error: rank 1 holds the job: it is stopped (SIGSTOP or SIGTSTP)' <<<"$out" || fail "stopped rank message: $out"
[ $(( $(date +%s) - start )) -lt 40 ] || fail "stopped rank: the job took too long to end"

# Resume edge cases: a checkpoint at or past --steps leaves nothing to train (it exited 0 doing
# nothing); a renamed step directory is named, not passed over for an older one in silence.
ckpt=$(mktemp -d)
out=$(timeout 120 "$sextant" run "${tiny[@]}" --global-batch 4 --steps 4 --checkpoint "$ckpt" --checkpoint-every 2 2>&1)
[ $? -eq 0 ] || fail "checkpointed run: $out"
out=$(timeout 120 "$sextant" run "${tiny[@]}" --global-batch 4 --steps 4 --checkpoint "$ckpt" --resume 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "resume at --steps: exit $rc, want 2: $out"
grep -q -- '--steps = 4: the checkpoint resumed is at step 4: nothing left to train' <<<"$out" || fail "resume at --steps message: $out"
mv "$ckpt/step-00000004" "$ckpt/step-00000004.good"
out=$(timeout 120 "$sextant" run "${tiny[@]}" --global-batch 4 --steps 5 --checkpoint "$ckpt" --resume 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "resume beside a renamed checkpoint: exit $rc: $out"
grep -q 'step-00000004.good skipped: it holds a manifest.json but is not named step-NNNNNNNN' <<<"$out" || fail "renamed checkpoint message: $out"
rm -rf "$ckpt"

out=$(timeout 120 "$sextant" run "${tiny[@]}" --global-batch 4 --lr 1e12 --steps 20 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "NaN: exit $rc, want 1: $out"
grep -qE 'the loss is -?(nan|inf) at step [0-9]+' <<<"$out" || fail "NaN message: $out"

out=$(timeout 120 "$sextant" run "${tiny[@]}" --steps 3 --global-batch 4 --np 2 --dp 2 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "--np 2: exit $rc: $out"

# A trace of some ranks and steps, gzip-compressed: only rank 1's events of steps 1-2 come back.
work=$(mktemp -d)
out=$(timeout 120 "${mpirun_cmd[@]}" -np 2 "$sextant" run "${tiny[@]}" --steps 4 --global-batch 4 --dp 2 --trace "$work/t.json.gz" --trace-ranks 1 --trace-steps 1-2 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "--trace-ranks: exit $rc: $out"
kept=$(python3 -c 'import gzip, json, sys
ev = [e for e in json.load(gzip.open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
print(len(ev) > 0, sorted({e["pid"] for e in ev}), sorted({e["args"].get("step", 0) for e in ev}))' "$work/t.json.gz" 2>&1)
[ "$kept" = "True [1] [1, 2]" ] || fail "--trace-ranks 1 --trace-steps 1-2 kept: $kept"
rm -rf "$work"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "run failures handled"
