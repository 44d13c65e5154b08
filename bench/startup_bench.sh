#!/usr/bin/env bash
# Whole-command time and memory of `sextant`: start-up alone (--version) and the simulator bench's
# GPT-3 175B step on 1024 dgx-a100 GPUs (tp 8, pp 16, dp 8, interleaved, full recompute,
# megatron-lm) in both fidelities, each command the best of N runs (default 5) of /usr/bin/time:
# wall seconds, CPU seconds (user + system) and peak resident memory. A number, never a pass/fail.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
runs="${2:-5}"
sim=(simulate --model gpt3-175b --cluster dgx-a100 --gpus 1024 --dp 8 --tp 8 --pp 16
  --global-batch 1536 --micro-batch 1 --schedule interleaved --vpp 2 --recompute full
  --stack megatron-lm)
printf '%-34s %8s %8s %10s\n' command wall_s cpu_s max_rss_mb
measure() {
  local name="$1"
  shift
  local best_wall=1e9 best_cpu=0 rss=0 line
  for _ in $(seq "$runs"); do
    line=$({ /usr/bin/time -f '%e %U %S %M' "$sextant" "$@" >/dev/null; } 2>&1 | tail -1)
    read -r wall user sys kb <<<"$line"
    if awk "BEGIN{exit !($wall < $best_wall)}"; then
      best_wall=$wall
      best_cpu=$(awk "BEGIN{print $user + $sys}")
      rss=$((kb / 1024))
    fi
  done
  printf '%-34s %8.2f %8.2f %10d\n' "$name" "$best_wall" "$best_cpu" "$rss"
}
measure "--version" --version
measure "simulate 175b/1024 analytic" "${sim[@]}"
measure "simulate 175b/1024 flow" "${sim[@]}" --network flow
