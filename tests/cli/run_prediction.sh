#!/usr/bin/env bash
# `sextant run` holds a plan file's prediction against the run: the summary's line names the
# predicted step and the cluster it was predicted on, and its percentage is the mean logged step
# after the warm-up (spec/step_times.hpp: the first two of more than three steps left out, as the
# summary says) against that prediction, recomputed here from --log-json; a plan file without
# a prediction prints no such line; a traced run says how steady the cores were. The prediction is a made-up 50 ms: the test checks the
# arithmetic and the wording, not how fast this machine is.
set -euo pipefail
sextant="$1"
out="$2"
rm -rf "$out"
mkdir -p "$out"
cat >"$out/plan.json" <<'JSON'
{"schema": "sextant.plan/1", "dp": 1, "tp": 1, "pp": 1, "zero": 0, "micro_batch": 2,
 "global_batch": 4, "cluster": "made-up-cluster",
 "predicted": {"step_time_s": 0.05, "tokens_per_s": 1}}
JSON
"$sextant" run --model gpt-tiny --plan "$out/plan.json" --np 1 --steps 4 \
  --log-json "$out/steps.jsonl" >"$out/run.txt" 2>&1 ||
  { cat "$out/run.txt"; echo "FAIL: the run failed"; exit 1; }
python3 - "$out/run.txt" "$out/steps.jsonl" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
steps = [json.loads(l)["step_time_s"] for l in open(sys.argv[2])]
assert len(steps) == 4, steps
assert "mean step" in text and "(after the first 2)" in text, text
mean = sum(steps[2:]) / len(steps[2:])
m = re.search(r"predicted 50\.00 ms on made-up-cluster \(the plan file\): the mean step is "
              r"([0-9.]+)% (slower|faster)", text)
assert m, f"no prediction line in:\n{text}"
off = float(m.group(1)) * (1 if m.group(2) == "slower" else -1)
want = 100 * (mean / 0.05 - 1)
assert abs(off - want) <= 0.05 + 1e-9, f"printed {off:+.1f}%, the log's mean says {want:+.2f}%"
print(f"prediction line: {m.group(0)} (log: {want:+.2f}%)")
PY
# Without a prediction in the file: no line.
cat >"$out/bare.json" <<'JSON'
{"schema": "sextant.plan/1", "dp": 1, "tp": 1, "pp": 1, "zero": 0, "micro_batch": 2,
 "global_batch": 4, "cluster": "made-up-cluster"}
JSON
"$sextant" run --model gpt-tiny --plan "$out/bare.json" --np 1 --steps 2 >"$out/bare.txt" 2>&1 ||
  { cat "$out/bare.txt"; echo "FAIL: the run without a prediction failed"; exit 1; }
if grep -q "the plan file" "$out/bare.txt"; then
  cat "$out/bare.txt"; echo "FAIL: a prediction line without a prediction"; exit 1
fi
# With --trace, a line on how steady the cores were (which one depends on the machine's quiet;
# tests/cli/step_steadiness_test.cpp checks the arithmetic on set traces).
"$sextant" run --model gpt-tiny --plan "$out/plan.json" --np 1 --steps 5 \
  --trace "$out/trace.json" >"$out/traced.txt" 2>&1 ||
  { cat "$out/traced.txt"; echo "FAIL: the traced run failed"; exit 1; }
if ! grep -Eq "^cores (steady: every step's compute within|slowed: in [0-9]+ of 3 steps)" \
  "$out/traced.txt"; then
  cat "$out/traced.txt"; echo "FAIL: no steadiness line after a traced run"; exit 1
fi
echo "PASS"
