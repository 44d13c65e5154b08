#!/usr/bin/env bash
# Spatial parallelism for CNNs (issue 13): what the simulator predicts for ResNet-50 on a V100
# cluster (clusters/lassen-v100.json, the machine class of Dryden et al., IPDPS'19) when each
# image is split over a grid of GPUs, next to data parallelism at the same mini-batch; where the
# planner takes a split; and what a split buys for images too large for one GPU. Numbers, never
# pass/fail; record them in bench/results/spatial.md with the date, the machine and the commit.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step_ms() {
  "$sextant" simulate --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)
b = r["breakdown_s"]
print("%9.1f ms  compute %7.1f  dp %5.1f  spatial %5.1f  tp %5.1f ms  activations %6.2f GiB" % (
    1e3 * r["step_time_s"], 1e3 * b["compute"], 1e3 * b["dp_comm_exposed"],
    1e3 * b["spatial_comm_exposed"], 1e3 * b["tp_comm_exposed"], r["memory"]["activations"] / 2**30))'
}

echo "ResNet-50, mini-batch 8192 on lassen-v100: N GPUs of data parallelism against 4N GPUs of"
echo "data parallelism over the same N replicas, each image split 2x2 (Dryden et al.: 34.1 -> 19.9"
echo "min, 1.71x, with 4-way spatial splits)"
for dtype in fp32 fp16; do
  for mb in 32 8; do
    dp=$((8192 / mb))
    [[ $((dp * 4)) -le 3168 ]] || continue
    printf '%s mb%-3s dp%-5s %5d GPUs %s\n' "$dtype" "$mb" "$dp" "$dp" \
      "$(step_ms --model resnet50 --cluster lassen-v100 --dtype "$dtype" --dp "$dp" \
        --micro-batch "$mb" --global-batch 8192)"
    printf '%s mb%-3s dp%-5s %5d GPUs %s  (2x2)\n' "$dtype" "$mb" "$dp" "$((dp * 4))" \
      "$(step_ms --model resnet50 --cluster lassen-v100 --dtype "$dtype" --dp "$dp" \
        --micro-batch "$mb" --global-batch 8192 --spatial 2x2)"
  done
done

echo
echo "sextant scale, ResNet-50 fp32, pp=1 and zero=0 (the layouts LBANN had): the best plan per GPU"
echo "count; past the mini-batch (one image per GPU) only a split uses more GPUs"
for batch in 8192 512; do
  "$sextant" scale --model resnet50 --cluster lassen-v100 --dtype fp32 --global-batch "$batch" \
    --gpus 256,512,1024,2048 --constraint pp=1 --constraint zero=0 --quiet
done

echo
echo "Channel and filter splits (tp on a CNN, Dryden et al., SC'19): 16 replicas of 32 images,"
echo "mini-batch 512, fp32, each replica's channels split over tp GPUs (stationary-x/y/w per layer)"
for model in resnet50 wrn50-2; do
  for tp in 1 2 4; do
    printf '%-9s tp%-2s %4d GPUs %s\n' "$model" "$tp" "$((16 * tp))" \
      "$(step_ms --model "$model" --cluster lassen-v100 --dtype fp32 --dp 16 --tp "$tp" \
        --micro-batch 32 --global-batch 512)"
  done
done

echo
echo "Each convolution's algorithm by simulated time (sextant plan, the layout pinned: dp 16, mb 32,"
echo "pp 1, zero 0, the stack's default knobs) against the byte rule's: the step, and how many of"
echo "the convolutions after the stem changed (planner/channel_algorithms.hpp)"
for model in resnet50 wrn50-2; do
  for tp in 2 4; do
    byte_rule=$("$sextant" simulate --json --model "$model" --cluster lassen-v100 --dtype fp32 \
      --dp 16 --tp "$tp" --micro-batch 32 --global-batch 512 |
      python3 -c 'import json, sys; print("%.2f" % (1e3 * json.load(sys.stdin)["step_time_s"]))')
    "$sextant" plan --json --model "$model" --cluster lassen-v100 --dtype fp32 --gpus $((16 * tp)) \
      --global-batch 512 --constraint dp=16 --constraint tp="$tp" --constraint mb=32 \
      --constraint pp=1 --constraint zero=0 >"$tmp/plan.json"
    python3 - "$tmp/plan.json" "$model" "$tp" "$byte_rule" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
plans = [p for p in d["ranked"] if not p["tuned_knobs"]] or d["ranked"]
best = plans[0]
chosen = best["plan"].get("channel_algorithms", [])
counts = {a: chosen.count(a) for a in "xyw"}
print("%-9s tp%-2s byte rule %7s ms  chosen %7.2f ms  %s" % (
    sys.argv[2], sys.argv[3], sys.argv[4], 1e3 * best["report"]["step_time_s"],
    "x/y/w %d/%d/%d" % (counts["x"], counts["y"], counts["w"]) if chosen else "(the byte rule's)"))
PY
  done
done

echo
echo "Channel and spatial splits together: 16 replicas of 32 images, mini-batch 512, fp32, each"
echo "replica over 4 GPUs split by channel (tp4), by rows and columns (2x2) or both (tp2 x 2x1)"
for model in resnet50 wrn50-2; do
  for layout in "1x1 4" "2x2 1" "2x1 2"; do
    split=${layout% *}
    tp=${layout#* }
    printf '%-9s %s tp%-2s 64 GPUs %s\n' "$model" "$split" "$tp" \
      "$(step_ms --model "$model" --cluster lassen-v100 --dtype fp32 --dp 16 --tp "$tp" \
        --micro-batch 32 --global-batch 512 --spatial "$split")"
  done
done

echo "Images too large for one GPU: ResNet-50 on 4096x4096 images (a 334x larger map than 224x224),"
echo "one image per replica, fp16, the 4 GPUs of a lassen-v100 node"
python3 - "$tmp/resnet50-4k.json" "$(dirname "$0")/../models/zoo/resnet50.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[2]))
m["name"] = "resnet50-4096px"
m["cnn"]["input"]["height"] = m["cnn"]["input"]["width"] = 4096
json.dump(m, open(sys.argv[1], "w"))
PY
for layout in "1x1 1" "2x1 1" "2x2 1" "1x1 4" "2x1 2"; do
  split=${layout% *}
  tp=${layout#* }
  dp=$((4 / (${split%x*} * ${split#*x} * tp)))
  "$sextant" simulate --json --model "$tmp/resnet50-4k.json" --cluster lassen-v100 --dp "$dp" \
    --tp "$tp" --global-batch "$dp" --spatial "$split" | python3 -c '
import json, sys
r = json.load(sys.stdin)
m = r["memory"]
print("%s tp%s  %6.2f images/s  step %7.1f ms  peak %5.1f GiB of %4.1f  %s" % (sys.argv[1], sys.argv[2],
    r["samples_per_s"], 1e3 * r["step_time_s"], m["peak_bytes"] / 2**30,
    m["capacity_bytes"] / 2**30, "fits" if m["fits"] else "does not fit"))' "$split" "$tp"
done

echo
echo "U-Net (Ronneberger et al., 572x572 images, 2 classes) on dgx-a100, global batch 8: past one"
echo "image per GPU the planner splits each image to its per-pixel loss"
"$sextant" scale --model unet --cluster dgx-a100 --global-batch 8 --gpus 8,16,32 --quiet

echo
echo "3D U-Net (Cicek et al., 132x132x116 volumes) on dgx-a100, global batch 2: past one volume per"
echo "GPU the planner splits each volume's planes (slabs), then rows (pencils), then columns (cubes)"
"$sextant" scale --model unet3d --cluster dgx-a100 --global-batch 2 --gpus 2,4,8,16 --quiet
