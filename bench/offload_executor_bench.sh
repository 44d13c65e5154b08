#!/usr/bin/env bash
# Offload on CPU ranks (issue 14): the executor's optimizer (ZeRO-1 and ZeRO-3; with "nvme" its
# states in a file between steps), ZeRO-3's parameters and the activations on its host pool
# against the same plans without, measured, and predicted on local-cpu with a host section that
# is the CPU's own DRAM (copies at half its bandwidth: read and write). Numbers, never pass/fail: record them with
# bench/run.sh offload_executor bash bench/offload_executor_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$(dirname "$0")/../clusters/local-cpu.json" "$dir/local-cpu.json"
python3 - "$dir/local-cpu.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
bw = c["device"]["memory_bandwidth_GBps"]
c["name"] = "local-cpu-host"
c["host"] = {"memory_bytes": 1 << 40, "memory_bandwidth_GBps": bw, "memory_efficiency": 1.0,
             "pcie_bandwidth_GBps": bw / 2, "nvme_bandwidth_GBps": bw / 2,
             "source": "bench: the CPU ranks' host pool is their own DRAM; a copy reads and writes it; "
                       "the NVMe states' file is written to the temporary directory, whose page cache is "
                       "that DRAM too"}
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
echo "llama-tiny at 512 tokens a sequence, 8 sequences a step, dp 2, on this machine's 2 cores;"
echo "measured steps (mean of steps 2-5) and predicted (uncalibrated local-cpu: the ratio is the"
echo "check)"
for variant in \
  '1:{"optimizer": "none"}' \
  '1:{"optimizer": "host"}' \
  '1:{"optimizer": "nvme"}' \
  '3:{"optimizer": "none"}' \
  '3:{"optimizer": "host"}' \
  '3:{"optimizer": "host", "params": "host"}' \
  '1:{"activations": "host"}'; do
  zero="${variant%%:*}"
  offload="${variant#*:}"
  cat >"$dir/plan.json" <<EOF
{"schema": "sextant.plan/1", "dp": 2, "tp": 1, "pp": 1, "zero": $zero, "micro_batch": 1,
 "global_batch": 8, "seq_len": 512, "offload": $offload}
EOF
  measured=$("$sextant" run --model llama-tiny --plan "$dir/plan.json" --np 2 --steps 6 --quiet \
    --log-json /dev/stdout 2>/dev/null | python3 -c '
import json, sys
steps = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
t = [s["step_time_s"] for s in steps[2:]]
print("%.1f ms" % (1e3 * sum(t) / len(t)) if t else "n/a")')
  predicted=$("$sextant" simulate --model llama-tiny --plan "$dir/plan.json" \
    --cluster "$dir/local-cpu.json" --gpus 2 --json |
    python3 -c 'import json, sys
r = json.load(sys.stdin)
print("%.1f ms (offload exposed %.2f ms)" % (1e3 * r["step_time_s"], 1e3 * r["breakdown_s"].get("offload_exposed", 0)))')
  printf 'zero %s %-44s measured %s, predicted %s\n' "$zero" "$offload" "$measured" "$predicted"
done
