#!/usr/bin/env bash
# The main job, end to end on this machine: sets up and builds, plans a large model on a GPU
# cluster and simulates the chosen plan, shows what more GPUs would buy, writes a trace that opens
# in Perfetto, runs the calibration loop on this machine (measure, fit, predict, compare), then
# plans a small GPT with the fitted file and trains it on local CPU ranks. Outputs go to out/demo
# (or $SEXTANT_DEMO_OUT).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
scripts/build.sh
sextant="$root/build/release/cli/sextant"
out="${SEXTANT_DEMO_OUT:-$root/out/demo}"
mkdir -p "$out"

echo "== 1. Plan: GPT-3 175B on 1024 A100s (DGX A100 nodes), global batch 1536"
"$sextant" plan --model gpt3-175b --cluster dgx-a100 --gpus 1024 --global-batch 1536 --top 5 \
  --out "$out/gpt3-175b-plan.json"

echo
echo "== 2. Simulate the chosen plan (the plan file is accepted unchanged)"
"$sextant" simulate --model gpt3-175b --cluster dgx-a100 --plan "$out/gpt3-175b-plan.json"

echo
echo "== 3. What do more GPUs buy? GPT-3 13B, global batch 512, 300B tokens at 2.50 USD/GPU-hour"
"$sextant" scale --model gpt3-13b --cluster dgx-a100 --gpus 16,64,256,1024 --global-batch 512 \
  --tokens 3e11 --price 2.5 --leaders 8

echo
echo "== 4. A trace to look at: GPT-3 1.3B on 16 A100s, dp2.tp4.pp2, interleaved, in Perfetto"
"$sextant" simulate --model gpt3-1.3b --cluster dgx-a100 --dp 2 --tp 4 --pp 2 --global-batch 32 \
  --micro-batch 2 --schedule interleaved --vpp 2 --recompute selective --sp \
  --trace "$out/gpt3-1.3b-predicted-trace.json"

echo
echo "== 5. Learn this machine first: bench it, fit local-cpu to it, then predict twelve plans of"
echo "      gpt-tiny (most of them not used for the fit) and run them for real"
# On a CPU other than the one the shipped local-cpu was made for, the loop measures this one first
# (sextant clusters detect) and starts from that file.
scripts/calibrate-local.sh --out "$out/calibrate-local"
# Plans on this machine use the fitted file (made for this CPU and its measured runs).
local_cluster="$out/calibrate-local/local-cpu-calibrated.json"
[ -f "$local_cluster" ] || local_cluster=local-cpu
echo
echo "== 6. Run it for real: plan gpt-tiny on this machine's 2 CPU cores ($local_cluster), train it"
"$sextant" plan --model gpt-tiny --cluster "$local_cluster" --gpus 2 --global-batch 16 \
  --top 3 --out "$out/gpt-tiny-plan.json"
"$sextant" run --model gpt-tiny --plan "$out/gpt-tiny-plan.json" --np 2 --steps 30 \
  --trace "$out/gpt-tiny-measured-trace.json" --log-json "$out/gpt-tiny-steps.jsonl"
echo
echo "Traces (open at https://ui.perfetto.dev: one process per rank, one thread per stream):"
echo "  predicted: $out/gpt3-1.3b-predicted-trace.json"
echo "  measured:  $out/gpt-tiny-measured-trace.json"
