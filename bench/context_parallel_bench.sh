#!/usr/bin/env bash
# Context parallelism (issue 14): what the simulator predicts for Llama 3 405B at 128K tokens on
# 1024 H100s with each algorithm (ring attention, Llama 3's all-gather, Ulysses' all-to-all) and
# without a split; what the planner proposes; and the CPU executor's three algorithms on real ranks
# against the single rank, measured and predicted on this machine. Numbers, never pass/fail:
# record them with bench/run.sh context_parallel bench/context_parallel_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
step() {
  "$sextant" simulate --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
b, m = r["breakdown_s"], r["memory"]
print("%8.2f s  MFU %4.1f%%  compute %6.2f  tp %5.2f  cp %5.2f  bubble %5.2f s  %6.1f GiB%s" % (
    r["step_time_s"], 100 * r["mfu"], b["compute"], b["tp_comm_exposed"], b["cp_comm_exposed"],
    b["bubble"], m["peak_bytes"] / 2**30, "" if m["fits"] else " (does not fit)"))'
}

echo "Llama 3 405B, 131072 tokens a sequence, 64 sequences a step, 1024 x dgx-h100 (megatron-core"
echo "stack), tp 8, zero 1, full recompute, 1F1B over 8 stages"
base=(--model llama3-405b --cluster dgx-h100 --seq-len 131072 --global-batch 64 --tp 8 --pp 8
  --zero 1 --recompute full --sp)
printf '%-28s %s\n' "cp 1 (dp 16)" "$(step "${base[@]}" --dp 16)"
for algo in ring all-gather; do
  for cp in 2 4 16; do
    printf '%-28s %s\n' "cp $cp $algo (dp $((16 / cp)))" \
      "$(step "${base[@]}" --dp $((16 / cp)) --cp "$cp" --cp-algorithm "$algo")"
  done
done
echo "(all-to-all needs cp to divide each tp rank's 1 key/value head: refused for Llama 3 405B at"
echo " tp 8; Llama 3 70B's 8 key/value heads at tp 2 take cp 4:)"
printf '%-28s %s\n' "70B tp2 cp4 all-to-all" "$(step --model llama3-70b --cluster dgx-h100 \
  --seq-len 131072 --global-batch 16 --tp 2 --pp 4 --dp 2 --zero 1 --recompute full --cp 4 \
  --cp-algorithm all-to-all)"
printf '%-28s %s\n' "70B tp2 cp4 ring" "$(step --model llama3-70b --cluster dgx-h100 \
  --seq-len 131072 --global-batch 16 --tp 2 --pp 4 --dp 2 --zero 1 --recompute full --cp 4)"

echo
echo "sextant plan, the same model and sequence on 1024 H100s (global batch 128), with and without cp"
"$sextant" plan --model llama3-405b --cluster dgx-h100 --gpus 1024 --seq-len 131072 \
  --global-batch 128 --top 3 2>&1 | sed -n '1,7p'
"$sextant" plan --model llama3-405b --cluster dgx-h100 --gpus 1024 --seq-len 131072 \
  --global-batch 128 --constraint cp=1 2>&1 | head -1 || true

echo
echo "CPU ranks: llama-tiny at 1024 tokens a sequence, 4 sequences a step, each algorithm;"
echo "measured steps (mean of steps 2-5) and predicted on local-cpu (uncalibrated: its absolute"
echo "times are this VM's to fit, see bench/results/calibration_local.md; the ratio is the check;"
echo "local-cpu has no flash-kernel throughput to price ring attention's steps with)"
for run in "1 -" "2 all-gather" "2 all-to-all" "2 ring"; do
  read -r cp algo <<<"$run"
  args=(--model llama-tiny --seq-len 1024 --global-batch 4 --micro-batch 1)
  [[ $cp -gt 1 ]] && args+=(--cp "$cp" --cp-algorithm "$algo")
  # Ring attention's steps are flash attention's: the stack names a fused kernel.
  [[ $algo == ring ]] && args+=(--attention flash2)
  measured=$("$sextant" run "${args[@]}" --np "$cp" --steps 6 --quiet --log-json /dev/stdout 2>/dev/null |
    python3 -c '
import json, sys
steps = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
t = [s["step_time_s"] for s in steps[2:]]
print("%.1f ms" % (1e3 * sum(t) / len(t)) if t else "n/a")')
  predicted=$("$sextant" simulate "${args[@]}" --cluster local-cpu --gpus "$cp" --json 2>/dev/null |
    python3 -c 'import json, sys; print("%.1f ms" % (1e3 * json.load(sys.stdin)["step_time_s"]))' 2>/dev/null ||
    echo "n/a")
  printf 'cp %d %-10s on %d ranks: measured %s, predicted %s\n' "$cp" "$algo" "$cp" "$measured" \
    "$predicted"
done
