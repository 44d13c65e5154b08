#!/usr/bin/env bash
# Asynchronous PipeDream (weight stashing, Narayanan et al., SOSP'19; issue 61) against 1F1B and
# PipeDream-2BW with the same samples per update and replica: Llama-2 7B on 8 A100s (dgx-a100),
# pp 2, 4 and 8, 8 sequences of 4096 a replica. 1F1B and 2BW split them into micro-batches of 1;
# PipeDream sends them as one micro-batch and updates after each. Simulated step (one update) and
# the most memory a stage holds; then the staleness each stage's gradients carry. Predictions
# only; numbers, never pass/fail. Record with bench/run.sh pipedream.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
row() {
  local label="$1"
  shift
  # shellcheck disable=SC2068
  "$sextant" simulate --model llama2-7b --cluster dgx-a100 --gpus 8 --stack sextant $@ --json |
    python3 -c '
import json, sys
r = json.load(sys.stdin)
m = r["memory"]
verdict = "fits" if m["fits"] else "does not fit"
step, peak = 1000 * r["step_time_s"], m["peak_bytes"] / 2**30
bubble = 1000 * r["breakdown_s"]["bubble"]
print(f"{sys.argv[1]:<30} {step:9.1f} ms {peak:7.1f} GiB  bubble {bubble:7.1f} ms  {verdict}")
' "$label"
}
for pp in 2 4 8; do
  dp=$((8 / pp))
  gb=$((8 * dp))
  echo "llama2-7b dp$dp pp$pp, $gb sequences an update (8 a replica): step, peak memory, bubble"
  row "1f1b, 8 micro-batches of 1" --dp "$dp" --pp "$pp" --micro-batch 1 --global-batch "$gb" \
    --schedule 1f1b --recompute full
  row "pipedream-2bw, 8 of 1" --dp "$dp" --pp "$pp" --micro-batch 1 --global-batch "$gb" \
    --schedule pipedream-2bw --recompute full
  row "pipedream, 1 of 8" --dp "$dp" --pp "$pp" --micro-batch 8 --global-batch "$gb" \
    --schedule pipedream --recompute full
  echo "  staleness (updates behind) of each stage's weights under pipedream: $(
    for ((s = 0; s < pp; s++)); do printf '%d ' $((pp - 1 - s)); done)"
  echo
done
