#!/usr/bin/env bash
# GEMS' MAST (Jain et al., SC'20; issue 61) against 1F1B and interleaved 1F1B on bubble-heavy
# pipelines: the same ranks and samples a step, few micro-batches per replica (GEMS' setting: one
# sample a replica). MAST runs a second replica of the stages the other way on the same ranks, so
# each rank holds two stages (twice the weights) and the replicas' passes fill each other's
# bubbles. Simulated step, bubble and peak memory; predictions only. Record with
# bench/run.sh gems.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
row() {
  local label="$1"
  shift
  # shellcheck disable=SC2068
  "$sextant" simulate --stack sextant $@ --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
m = r["memory"]
verdict = "fits" if m["fits"] else "does not fit"
step, peak = 1000 * r["step_time_s"], m["peak_bytes"] / 2**30
bubble = 1000 * r["breakdown_s"]["bubble"]
print(f"{sys.argv[1]:<34} {step:9.1f} ms {peak:7.1f} GiB  bubble {bubble:8.1f} ms  {verdict}")
' "$label"
}
for pp in 4 8; do
  for m in 2 4 8; do
    echo "llama2-7b on 8 A100s, pp $pp, dp $((8 / pp)), $m micro-batches of 1 a replica, full recompute"
    common="--model llama2-7b --cluster dgx-a100 --gpus 8 --pp $pp --dp $((8 / pp)) --micro-batch 1"
    common+=" --global-batch $((m * 8 / pp)) --recompute full"
    row "1f1b" $common --schedule 1f1b
    if ((m % pp == 0)); then row "interleaved (2 chunks a rank)" $common --schedule interleaved --vpp 2; fi
    row "gems (2 replicas, opposite ways)" $common --schedule gems
    echo
  done
done
echo "amoebanet-d on 8 A100s, pp 8, 2 micro-batches of 1 (GEMS' setting: large samples)"
common="--model amoebanet-d --cluster dgx-a100 --gpus 8 --pp 8 --micro-batch 1 --global-batch 2"
row "1f1b" $common --schedule 1f1b
row "gems" $common --schedule gems
