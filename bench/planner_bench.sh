#!/usr/bin/env bash
# Planner speed: full search for GPT-3 175B on 1024 dgx-a100 GPUs (global batch 1536) and Llama-3
# 70B on 512 dgx-h100 GPUs (global batch 1024), on this machine's cores. Prints the wall time, the
# legal plans and plans per second (all estimated, the leaders simulated), and the closed-form
# estimator's CPU time per plan (estimate phase wall x threads / plans; issue 15's bar: 10 us).
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
printf '%-38s %8s %9s %8s %10s %12s %12s %10s\n' case wall_s plans fitting simulated plans_per_s \
  est_us_plan simulate_s
run() {
  local name="$1"
  shift
  "$sextant" plan "$@" --json | /usr/bin/python3 -c "
import json, sys
r = json.load(sys.stdin)
print('%-38s %8.2f %9d %8d %10d %12.0f %12.1f %10.2f' % ('$name', r['wall_s'], r['enumerated'],
      r['fitting'], r['simulated'], r['enumerated'] / r['wall_s'],
      r['phases_s']['estimate'] * r['threads'] / r['enumerated'] * 1e6, r['phases_s']['simulate']))"
}
run "gpt3-175b 1024 x dgx-a100" --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch 1536
run "llama3-70b 512 x dgx-h100" --model llama3-70b --cluster dgx-h100 --gpus 512 --global-batch 1024
# Issue 15's three searches, each with the top 100 re-simulated event by event. 16,384 H100s need
# 2048 DGX nodes: the dgx-h100 description with its node count raised.
big_h100=$(mktemp --suffix=.json)
trap 'rm -f "$big_h100"' EXIT
/usr/bin/python3 -c "
import json, sys
c = json.load(open('clusters/dgx-h100.json'))
c['nodes'] = 2048
c['name'] = 'dgx-h100-2048'
json.dump(c, open(sys.argv[1], 'w'))" "$big_h100"
run "gpt3-175b 1024 x dgx-a100, top 100" --model gpt3-175b --cluster dgx-a100 --gpus 1024 \
  --global-batch 1536 --leaders 100
run "megatron-1t 4096 x dgx-a100, top 100" --model megatron-1t --cluster dgx-a100 --gpus 4096 \
  --global-batch 3072 --leaders 100
run "llama3-405b 16384 x h100, top 100" --model llama3-405b --cluster "$big_h100" --gpus 16384 \
  --global-batch 2048 --leaders 100
