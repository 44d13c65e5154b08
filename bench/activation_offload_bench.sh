#!/usr/bin/env bash
# Activation offload (issue 14; Megatron-LM --cpu-offloading): what the simulator predicts for a
# 13B model on 8 A100s with its activations on the host, over the DGX A100's PCIe 4 and over a
# 450 GB/s host link (NVLink-C2C's per direction on a Grace Hopper superchip, NVIDIA GH200
# datasheet: 900 GB/s bidirectional), what the planner proposes on each, and what offloading
# costs a CPU run here. Numbers, never pass/fail: record them with
# bench/run.sh activation_offload bash bench/activation_offload_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
fast=$(mktemp --suffix=.json)
trap 'rm -f "$fast"' EXIT
python3 - "$fast" <<'EOF'
import json, sys
with open("clusters/dgx-a100.json") as f:
    c = json.load(f)
c["name"] = "dgx-a100-c2c"
c["host"]["pcie_bandwidth_GBps"] = 450
c["host"]["source"] += "; pcie_bandwidth_GBps 450: NVLink-C2C per direction (GH200 datasheet)"
with open(sys.argv[1], "w") as f:
    json.dump(c, f)
EOF
step() {
  "$sextant" simulate --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
b, m = r["breakdown_s"], r["memory"]
print("%7.2f s  offload exposed %5.2f s  device %6.2f GiB (activations %6.2f)  host %6.2f GiB%s" % (
    r["step_time_s"], b.get("offload_exposed", 0), m["peak_bytes"] / 2**30,
    m["activations"] / 2**30, m.get("host_bytes", 0) / 2**30,
    "" if m["fits"] else " (does not fit)"))'
}

echo "Llama-2 13B, 4096 tokens, 64 sequences a step, 8 x A100-80GB, dp 8, zero 3, micro-batch 2"
base=(--model llama2-13b --gpus 8 --dp 8 --zero 3 --micro-batch 2 --global-batch 64)
for link in "PCIe 4 (28.8 GB/s):dgx-a100" "450 GB/s:$fast"; do
  cluster="${link#*:}"
  echo "${link%%:*}"
  printf '  %-36s %s\n' "activations on the device" "$(step "${base[@]}" --cluster "$cluster")"
  printf '  %-36s %s\n' "full recompute" \
    "$(step "${base[@]}" --cluster "$cluster" --recompute full)"
  printf '  %-36s %s\n' "39 of 40 blocks offloaded" \
    "$(step "${base[@]}" --cluster "$cluster" --offload-activations host \
      --offload-activation-layers 39)"
  printf '  %-36s %s\n' "every block offloaded" \
    "$(step "${base[@]}" --cluster "$cluster" --offload-activations host)"
done

echo
echo "sextant plan, Llama-2 13B on 8 A100s, 64 sequences: over PCIe 4, over 450 GB/s, and over"
echo "450 GB/s without activation offload"
"$sextant" plan --model llama2-13b --cluster dgx-a100 --gpus 8 --global-batch 64 --top 1 2>&1 |
  sed -n '1,6p'
"$sextant" plan --model llama2-13b --cluster "$fast" --gpus 8 --global-batch 64 --top 1 2>&1 |
  sed -n '1,6p'
"$sextant" plan --model llama2-13b --cluster "$fast" --gpus 8 --global-batch 64 --top 1 \
  --constraint act_offload=0 2>&1 | sed -n '1,6p'

echo
echo "CPU ranks: gpt-tiny, 8 sequences a step, dp 2; measured steps (mean of steps 2-5). local-cpu"
echo "has no host section (its device memory is the host's), so there is no prediction: the"
echo "difference is what the copies cost here"
for layout in "activations kept:" "activations offloaded:--offload-activations host"; do
  read -r -a extra <<< "${layout#*:}"
  "$sextant" run --model gpt-tiny --np 2 --dp 2 --global-batch 8 --steps 6 --quiet \
    --log-json /dev/stdout "${extra[@]}" 2>/dev/null | python3 -c '
import json, sys
steps = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
t = [s["step_time_s"] for s in steps[2:]]
print("%s: %.1f ms, final loss %.6f" % (sys.argv[1], 1e3 * sum(t) / len(t), steps[-1]["loss"]))' \
    "${layout%%:*}"
done
