#!/usr/bin/env bash
# Expert parallelism (issue 14): what the simulator predicts for Mixtral 8x7B on 64 H100s with
# the experts on every rank and split over ep ranks (inside a node and across two), what the
# planner proposes with and without ep, and DeepSeek-V2-Lite's 64 experts. Numbers, never
# pass/fail: record them with bench/run.sh expert_parallel bench/expert_parallel_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
step() {
  "$sextant" simulate --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
b, m = r["breakdown_s"], r["memory"]
print("%7.2f s  MFU %4.1f%%  compute %6.2f  ep %5.2f  dp %5.2f  bubble %5.2f s  %6.1f GiB%s" % (
    r["step_time_s"], 100 * r["mfu"], b["compute"], b.get("ep_comm_exposed", 0),
    b["dp_comm_exposed"], b["bubble"], m["peak_bytes"] / 2**30,
    "" if m["fits"] else " (does not fit)"))'
}

echo "Mixtral 8x7B, 4096 tokens a sequence, 512 sequences a step, 64 x dgx-h100 (megatron-core"
echo "stack), zero 1, full recompute, 1F1B over 4 stages (NeMo's Mixtral recipe: tp 1, pp 4, ep 8)"
base=(--model mixtral-8x7b --cluster dgx-h100 --seq-len 4096 --global-batch 512 --pp 4
  --zero 1 --recompute full)
for ep in 1 2 4 8; do
  printf '%-34s %s\n' "dp 16, ep $ep" "$(step "${base[@]}" --dp 16 --ep "$ep")"
done
echo "(cp 2 puts each ep group of 8 across two nodes: rank = cp + 2 dp)"
printf '%-34s %s\n' "dp 8, cp 2 all-gather, ep 8" \
  "$(step "${base[@]}" --dp 8 --cp 2 --cp-algorithm all-gather --ep 8)"
printf '%-34s %s\n' "dp 8, tp 2, sp, ep 1" "$(step "${base[@]}" --dp 8 --tp 2 --sp)"
printf '%-34s %s\n' "dp 8, tp 2, sp, ep 8" "$(step "${base[@]}" --dp 8 --tp 2 --sp --ep 8)"

echo
echo "sextant plan, the same question, with and without ep"
"$sextant" plan --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --seq-len 4096 \
  --global-batch 512 --top 3 2>&1 | sed -n '1,7p'
"$sextant" plan --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --seq-len 4096 \
  --global-batch 512 --top 1 --constraint ep=1 2>&1 | sed -n '1,6p'

echo
echo "DeepSeek-V2-Lite (64 routed experts of 1408, 2 shared, top-6), 4096 tokens, 512 sequences,"
echo "64 x dgx-h100"
"$sextant" plan --model deepseek-v2-lite --cluster dgx-h100 --gpus 64 --seq-len 4096 \
  --global-batch 512 --top 3 2>&1 | sed -n '1,7p'

echo
echo "CPU ranks: moe-tiny (8 experts of 32, top-2) at 256 tokens a sequence, 8 sequences a step,"
echo "2 ranks; measured steps (mean of steps 2-5) and predicted on local-cpu (uncalibrated: its"
echo "absolute times are this VM's to fit, see bench/results/calibration_local.md; the ratio is the check)"
for layout in "dp 2:--dp 2" "dp 2, ep 2:--dp 2 --ep 2" "tp 2, sp (experts split over tp):--tp 2 --sp"; do
  read -r -a split <<< "${layout#*:}"
  args=(--model moe-tiny --seq-len 256 --global-batch 8 --micro-batch 1 "${split[@]}")
  measured=$("$sextant" run "${args[@]}" --np 2 --steps 6 --quiet --log-json /dev/stdout 2>/dev/null |
    python3 -c '
import json, sys
steps = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
t = [s["step_time_s"] for s in steps[2:]]
print("%.1f ms" % (1e3 * sum(t) / len(t)) if t else "n/a")')
  predicted=$("$sextant" simulate "${args[@]}" --cluster local-cpu --gpus 2 --json |
    python3 -c 'import json, sys; print("%.1f ms" % (1e3 * json.load(sys.stdin)["step_time_s"]))')
  printf '%s: measured %s, predicted %s\n' "${layout%%:*}" "$measured" "$predicted"
done
