#!/usr/bin/env bash
# KARMA's split (Wahib et al., SC'20; issue 61), with the double buffer's reloads and with its
# swap schedule's (the swapped blocks reloaded as the backward begins), against recompute alone
# and activation offload alone, on a model whose activations do not fit: Llama-2 7B on 8 A100-80GB (dgx-a100, its host
# memory and PCIe), ZeRO-3, micro-batch 2 of 4096 tokens, one stage. For each family the
# simulated step and peak device memory of each split point; `sextant plan` then searches all of
# them. Predictions only; numbers, never pass/fail. Record with bench/run.sh karma.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
cluster=dgx-a100
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The same nodes with faster host links than PCIe 4.0's 28.8 GB/s: 64 and 128 GB/s (PCIe 5.0 and
# 6.0 x16 class) and a GH200-class NVLink-C2C (450 GB/s each way: NVIDIA GH200 datasheet), where
# copies to host memory start to hide behind compute.
python3 - "$tmp" "$(dirname "$0")/../clusters/dgx-a100.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
for bw in (64, 128, 450):
    c["name"] = f"dgx-a100-host{bw}"
    c["host"]["pcie_bandwidth_GBps"] = bw
    json.dump(c, open(f"{sys.argv[1]}/host{bw}.json", "w"))
PY
base() {
  echo --model llama2-7b --cluster "$cluster" --gpus 8 --dp 8 --zero 3 --micro-batch 2 \
    --global-batch 64 --stack sextant
}
row() {
  local label="$1"
  shift
  # shellcheck disable=SC2046
  "$sextant" simulate $(base) "$@" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
m = r["memory"]
step, peak = 1000 * r["step_time_s"], m["peak_bytes"] / 2**30
verdict = "fits" if m["fits"] else "does not fit"
print(f"{sys.argv[1]:<34} {step:9.1f} ms {peak:7.1f} GiB  {verdict}")
' "$label"
}
for cluster in dgx-a100 "$tmp/host64.json" "$tmp/host128.json" "$tmp/host450.json"; do
  echo "llama2-7b dp8 zero3 mb2 x 4096 on $(basename "$cluster" .json) (32 blocks): step, peak memory"
  row "nothing saved"
  row "recompute every block" --recompute full
  for r in 8 16 24; do row "recompute the first $r" --recompute full --recompute-layers "$r"; done
  row "offload 31 blocks" --offload-activations host --offload-activation-layers 31
  for a in 8 16 24; do
    row "offload the first $a" --offload-activations host --offload-activation-layers "$a"
  done
  for a in 4 8 16 24 28; do
    row "KARMA: offload $a, recompute $((32 - a))" --offload-activations host \
      --offload-activation-layers "$a" --recompute full --recompute-layers $((32 - a))
    row "  reloads $((32 - a)) ahead" --offload-activations host \
      --offload-activation-layers "$a" --recompute full --recompute-layers $((32 - a)) \
      --offload-prefetch-layers $((32 - a))
  done
  echo
  echo "sextant plan (stack sextant, pp=1 tp=1 zero=3 mb=2), its best three:"
  "$sextant" plan --model llama2-7b --cluster "$cluster" --gpus 8 --global-batch 64 \
    --stack sextant --constraint pp=1 --constraint tp=1 --constraint zero=3 --constraint mb=2 \
    --top 3 --quiet | grep -E '^ *[0-9] |# plan'
  echo
done
