#!/usr/bin/env bash
# `sextant plan --verify 2` on this machine: the two best plans of gpt-tiny on 2 CPU ranks run as
# child jobs (loop::ProcessMachine), each trial's plan, steps and trace are where the table says,
# both succeed, the ranking line is printed, and the trials' traces calibrate the cluster (or the
# refusal is said). No timing is asserted: the measured figures vary with the machine.
set -euo pipefail
sextant="$1"
out="$2"
rm -rf "$out"
mkdir -p "$out"
"$sextant" --wide plan --model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 16 --verify 2 \
  --verify-steps 3 --verify-dir "$out" --calibrated-out "$out/cal.json" >"$out/plan.txt" 2>&1
cat "$out/plan.txt" | tail -6
for i in 1 2; do
  [ -e "$out/trial$i.log" ] || { echo "FAIL: $out/trial$i.log missing"; exit 1; }
  for f in plan.json steps.jsonl measured.json; do
    [ -s "$out/trial$i.$f" ] || { echo "FAIL: $out/trial$i.$f missing"; exit 1; }
  done
  [ "$(wc -l <"$out/trial$i.steps.jsonl")" -eq 3 ] || { echo "FAIL: trial$i ran not 3 steps"; exit 1; }
done
[ "$(grep -cE '^ [12] .* ok$' "$out/plan.txt")" -eq 2 ] || { echo "FAIL: not both trials ok"; exit 1; }
grep -q "^ranking: Kendall tau" "$out/plan.txt" || { echo "FAIL: no ranking line"; exit 1; }
grep -qE "^calibrated local-cpu from the trials' traces -> $out/cal.json|^not writing $out/cal.json" \
  "$out/plan.txt" || { echo "FAIL: no calibration line"; exit 1; }
echo "plan --verify: both trials ran"
