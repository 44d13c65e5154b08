#!/usr/bin/env bash
# `sextant calibrate --log`: a stack's training log of the profiled run is a measured step the fit
# is checked on (not fitted on: a step time says nothing of which op took it). The log
# (tests/data/logs/gpt2-124m-h100-b8.torchtitan.log, TorchTitan's step-line format) was written
# by hand at the profile's own wall step: 55.93 ms between its two Optimizer.step ends on the GPU,
# 8 x 1024 tokens at 146,470 and 146,510 tokens/s. A log the fit predicts worse than the cluster it
# started from refuses the fit (exit 1); per-rank profiles of one step average per class.
set -uo pipefail
sextant="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
source "$(dirname "$0")/probe_lib.sh"
samples="$root/traces/samples"
run=(--cluster dgx-h100 --model "$samples/kineto-gpt2-124m-h100-b8.model.json"
  --plan "$samples/kineto-gpt2-124m-h100-b8.plan.json")
kineto="$samples/kineto-gpt2-124m-h100-b8.json.gz"
log="$root/tests/data/logs/gpt2-124m-h100-b8.torchtitan.log"

"$sextant" calibrate "${run[@]}" --kineto "$kineto" --log "$log" --out "$dir/c.json" --json \
  >"$dir/with_log.json" 2>"$dir/err.txt" || fail "calibrate --log: $(cat "$dir/err.txt")"
python3 - "$dir/with_log.json" <<'PY' || fail "the logged run's check"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["refused"] == "" and r["out"], r
rows = [x for x in r["step_check"]["rows"] if x["logged"]]
assert len(rows) == 1, r["step_check"]
row = rows[0]
want = (8192 / 146470 + 8192 / 146510) / 2  # the median of the two steps after the first
assert abs(row["measured_s"] - want) < 1e-12, (row["measured_s"], want)
before = abs(row["predicted_before_s"] / want - 1)
after = abs(row["predicted_after_s"] / want - 1)
assert after < before, (before, after)  # the profile's fit moves the step towards the log
PY

# The same profile given as two ranks' traces: the per-step class times are their mean, so the
# fit is the same.
"$sextant" calibrate "${run[@]}" --kineto "$kineto" --kineto "$kineto" --out "$dir/c2.json" \
  --json >"$dir/two_ranks.json" 2>"$dir/err2.txt" || fail "two ranks: $(cat "$dir/err2.txt")"
python3 - "$dir/with_log.json" "$dir/two_ranks.json" <<'PY' || fail "two ranks' mean"
import json, sys
one, two = (json.load(open(f))["class_fit"] for f in sys.argv[1:3])
for a, b in zip(one["classes"], two["classes"]):
    assert a["class"] == b["class"] and abs(a["measured_s"] - b["measured_s"]) < 1e-12, (a, b)
    assert abs(a["value_after"] - b["value_after"]) < 1e-12, (a, b)
PY

# A log faster than the profile itself: the fit predicts it worse than before, so it is refused.
sed 's/tps: 146,470/tps: 409,600/; s/tps: 146,510/tps: 409,600/' "$log" >"$dir/fast.log"
"$sextant" calibrate "${run[@]}" --kineto "$kineto" --log "$dir/fast.log" --out "$dir/no.json" \
  >"$dir/fast.txt" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "a fit that predicts the log worse exited $rc: $(tail -3 "$dir/fast.txt")"
grep -q "predicted worse after the fit" "$dir/fast.txt" || fail "no refusal: $(cat "$dir/fast.txt")"
[ ! -e "$dir/no.json" ] || fail "the refused fit was written"

# A log needs the run it logged; a malformed line is named.
expect_error "--log = $log: given with --model and --plan" "$sextant" calibrate \
  --cluster dgx-h100 --kineto "$kineto" --log "$log" --out "$dir/x.json"
printf '[titan] 2026 - root - INFO - step:  2  loss: 1.0  tps: many\n' >"$dir/bad.log"
expect_error "bad.log" "$sextant" calibrate "${run[@]}" --kineto "$kineto" --log "$dir/bad.log" \
  --out "$dir/x.json"

[ "$failures" -eq 0 ] && echo "calibrate --log: all checks passed"
exit "$failures"
