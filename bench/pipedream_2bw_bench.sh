#!/usr/bin/env bash
# PipeDream-2BW against 1F1B (issue 14): simulated on DGX A100 (llama2-7b untied, gpt3-1.3b whose
# tied table makes the end stages wait for each other at every batch's end), and measured on this
# machine's CPU ranks with the executor (llama-tiny, untied; 2 stages, 2 micro-batches: the 1F1B
# bubble is 1/3 of the step). Numbers, never pass/fail: record them with
# bench/run.sh pipedream_2bw bench/pipedream_2bw_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
echo "Simulated (analytic network), one step in steady state, 8 A100s (dp x pp = 8), micro-batch 1,"
echo "under Sextant's executor's stack (the one that runs PipeDream-2BW):"
for model in llama2-7b gpt3-1.3b; do
  for pp in 4 8; do
    for m in 8 32; do
      for schedule in 1f1b pipedream-2bw; do
        "$sextant" simulate --model "$model" --cluster dgx-a100 --gpus 8 --dp $((8 / pp)) --pp $pp \
          --micro-batch 1 --global-batch $((m * 8 / pp)) --schedule $schedule --stack sextant --json |
          python3 -c 'import json, sys
r = json.load(sys.stdin); b = r["breakdown_s"]; m = r["memory"]
print("  %-10s %-26s step %7.3f s  bubble %6.3f s  weights %5.2f GiB  peak %5.1f GiB" % (
    r["model"], r["plan"], r["step_time_s"], b.get("bubble", 0), m["weights"] / 2**30,
    m["peak_bytes"] / 2**30))'
      done
    done
  done
done
echo
echo "Measured on this machine: llama-tiny at 256 tokens, pp 2, 2 micro-batches of 1, --clip 0,"
echo "mean step time of steps 3-12 (2 ranks on its cores), and the loss after 12 steps:"
for schedule in 1f1b pipedream-2bw; do
  "$sextant" run --model llama-tiny --np 2 --pp 2 --micro-batch 1 --global-batch 2 --seq-len 256 \
    --schedule $schedule --clip 0 --steps 12 --quiet --log-json /dev/stdout 2>/dev/null |
    python3 -c '
import json, sys
steps = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
t = [s["step_time_s"] for s in steps[3:]]
print("  %-14s %.1f ms a step, loss %.4f" % (sys.argv[1], 1e3 * sum(t) / len(t), steps[-1]["loss"]))' \
    "$schedule"
done
