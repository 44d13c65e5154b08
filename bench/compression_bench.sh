#!/usr/bin/env bash
# Compressed gradient exchanges (issue 13): what the simulator predicts for GPT-2 350M on 16 A100s
# with their InfiniBand and with 10 GbE-class links (1.25 GB/s every level), and on 64 of the
# latter, and what 2 CPU ranks of this machine measure for gpt-tiny (mean step after the first,
# the exchange's bytes per step on rank 0, the loss of the last step). Numbers, never pass/fail;
# record them in bench/results/compression.md with the date, the machine and the commit.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
steps="${2:-12}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kinds=(none qsgd:bits=8 qsgd:bits=4 qsgd:bits=2 onebit topk:ratio=0.01 topk:ratio=0.001
  powersgd:rank=1 powersgd:rank=4)
flag() { [[ "$1" == none ]] || echo "--compression $1"; }

python3 "$(dirname "$0")/slow_links_cluster.py" "$tmp/slow.json" \
  "$(dirname "$0")/../clusters/dgx-a100.json" 1.25 dgx-a100-10gbe

echo "predicted: gpt2-350m, mb4, 16 sequences per replica (sextant simulate)"
printf '%-18s %14s %14s %14s\n' compression a100-dp16 10gbe-dp16 10gbe-dp64
for k in "${kinds[@]}"; do
  row=()
  for case in "dgx-a100 16" "$tmp/slow.json 16" "$tmp/slow.json 64"; do
    read -r cluster dp <<<"$case"
    # shellcheck disable=SC2046
    t=$("$sextant" simulate --model gpt2-350m --cluster "$cluster" --dp "$dp" \
      --global-batch $((16 * dp)) --micro-batch 4 $(flag "$k") --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["step_time_s"])')
    row+=("$(printf '%.1f ms' "$(echo "$t * 1000" | bc -l)")")
  done
  printf '%-18s %14s %14s %14s\n' "$k" "${row[0]}" "${row[1]}" "${row[2]}"
done

echo
echo "measured: gpt-tiny on 2 CPU ranks of this machine, dp2, global batch 8, $steps steps"
printf '%-18s %12s %16s %10s\n' compression step_ms exchange_bytes last_loss
for k in "${kinds[@]}"; do
  # shellcheck disable=SC2046
  "$sextant" run --model gpt-tiny --np 2 --dp 2 --global-batch 8 --steps "$steps" $(flag "$k") \
    --trace "$tmp/t.json" >"$tmp/log" 2>&1
  python3 - "$tmp/t.json" "$tmp/log" "$k" <<'PY'
import json, re, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
steps = [float(m.group(1)) for m in re.finditer(r"step\s+\d+\s+loss \S+\s+step ([0-9.]+) s", open(sys.argv[2]).read())]
losses = re.findall(r"loss (\S+)", open(sys.argv[2]).read())
ex = sum(e["args"].get("bytes", 0) for e in events
         if e.get("pid") == 0 and e.get("args", {}).get("step") == 1
         and e["name"] in ("dp.all_reduce", "dp.compressed_all_gather",
                           "dp.powersgd_p_all_reduce", "dp.powersgd_q_all_reduce"))
print(f"{sys.argv[3]:<18} {1000 * sum(steps[1:]) / max(1, len(steps) - 1):12.1f} {ex:16d} {float(losses[-1]):10.4f}")
PY
done
