#!/usr/bin/env bash
# Per-op splits (issue 60): `sextant plan --per-op` on dense transformers, the best uniform plan
# against the best plan once each of the best uniform plans' block ops may be split its own way
# over its dp x tp mesh (planner/op_splits.hpp), with what changed and the search's cost. Cases:
# the best plan unconstrained (where the planner's best is data-parallel the t axis has one rank
# and no split can change anything), and with tensor parallelism imposed (a constraint a user
# sets for memory or a fixed launcher), where the t axis exists. Predictions only; numbers, never
# pass/fail. Record with bench/run.sh per_op.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
row() {
  local label="$1"
  shift
  local start end
  start=$(date +%s.%N)
  "$sextant" plan "$@" --per-op --json --quiet >"$tmp/out.json"
  end=$(date +%s.%N)
  python3 - "$label" "$tmp/out.json" "$start" "$end" <<'PY'
import json, sys
label, path, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
r = json.load(open(path))
ranked = r["ranked"]
best = ranked[0]
uniform = [p for p in ranked if "per_op" not in p["plan"]]
splits = r.get("op_splits", [])
paid = [s for s in splits if s["changes"]]
est = sum(s["estimates"] for s in splits)
sims = sum(s["simulations"] for s in splits)
print(f"{label}")
# The best uniform plan: a ranked plan the search left uniform or did not apply to, or one it
# started from.
befores = [p["report"]["step_time_s"] for p in uniform] + [s["uniform_step_s"] for s in splits]
print(f"  best uniform (before --per-op) {min(befores) * 1e3:9.1f} ms"
      + ("" if splits else "  (per-op splits apply to none of the best plans)"))
print(f"  best after --per-op            {best['report']['step_time_s'] * 1e3:9.1f} ms  {best['name'][:100]}")
for s in paid[:1]:
    print(f"  best change: {s['uniform']} {s['uniform_step_s']*1e3:.1f} -> {s['chosen_step_s']*1e3:.1f} ms"
          f" ({100 * (s['chosen_step_s'] / s['uniform_step_s'] - 1):+.1f}%)")
    for c in s["changes"]:
        ops = c["ops"].split(", ")
        named = ", ".join(ops) if len(ops) <= 10 else f"{', '.join(ops[:6])}... ({len(ops)} ops)"
        print(f"    {named}: {c['from']} -> {c['to']}")
# A CNN's convolutions, bounded (models/conv_split_bound.hpp): whether splitting any could pay.
for s in splits[:1]:
    c = s.get("convolutions")
    if c:
        close = c["closest"]
        print(f"  convolutions: {len(c['could_pay'])} of {c['count']} could pay split over the replicas"
              f" (at most {c['most_net_saved_bytes'] / 2**20:.1f} MiB less moved a step); closest"
              f" {close['conv']}: {close['least_moved_bytes'] / 2**20:.1f} MiB moved,"
              f" {close['most_saved_bytes'] / 2**20:.1f} MiB saved; exposed data-parallel time"
              f" {c['exposed_dp_s'] * 1e3:.2f} ms")
print(f"  {len(paid)} of {len(splits)} plans changed; {est} estimates, {sims} simulations;"
      f" plan wall {end - start:.1f} s")
PY
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A 128-op graph (issue 60's bar: the search over 100+ ops in under 60 s on 2 cores): an MLP of
# 128 layers 2048 wide and 32,000 classes, each layer an op of its own.
python3 - "$tmp/mlp-128.json" <<'PY'
import json, sys
json.dump({"schema": "sextant.model/1", "name": "mlp-128x2k", "description": "bench: 128 layers",
           "source": "bench/per_op_bench.sh", "kind": "mlp",
           "mlp": {"widths": [2048] * 128 + [32000], "activation": "relu", "bias": True}},
          open(sys.argv[1], "w"))
PY
row "gpt3-1.3b, 8 x dgx-a100, batch 64" --model gpt3-1.3b --cluster dgx-a100 --gpus 8 \
  --global-batch 64
row "gpt3-1.3b, 8 x dgx-a100, batch 64, tp=4" --model gpt3-1.3b --cluster dgx-a100 --gpus 8 \
  --global-batch 64 --constraint tp=4
row "gpt3-13b, 64 x dgx-a100, batch 256" --model gpt3-13b --cluster dgx-a100 --gpus 64 \
  --global-batch 256
row "gpt3-13b, 64 x dgx-a100, batch 256, tp=8" --model gpt3-13b --cluster dgx-a100 --gpus 64 \
  --global-batch 256 --constraint tp=8
row "llama2-7b, 8 x dgx-h100, batch 128, tp=2" --model llama2-7b --cluster dgx-h100 --gpus 8 \
  --global-batch 128 --constraint tp=2
row "llama2-70b, 64 x dgx-h100, batch 256" --model llama2-70b --cluster dgx-h100 --gpus 64 \
  --global-batch 256
row "gpt3-175b, 128 x dgx-a100, batch 256" --model gpt3-175b --cluster dgx-a100 --gpus 128 \
  --global-batch 256
# FlexFlow's language-model case (Jia et al. SysML'19, §8: a large softmax split by its parameter
# dimension): Llama-3 8B's 128k-token output layer, few micro-batches a replica, with and without
# ZeRO (without it, every replica holds and all-reduces the whole output weights' gradient).
row "llama3-8b, 8 x dgx-h100, batch 16, zero=0, tp=1" --model llama3-8b --cluster dgx-h100 \
  --gpus 8 --global-batch 16 --seq-len 4096 --constraint zero=0 --constraint tp=1
row "llama3-8b, 64 x dgx-h100, batch 64, tp=1" --model llama3-8b --cluster dgx-h100 --gpus 64 \
  --global-batch 64 --seq-len 4096 --constraint tp=1
row "llama2-7b, 32 x dgx-a100, batch 32, zero=0, tp=2" --model llama2-7b --cluster dgx-a100 \
  --gpus 32 --global-batch 32 --constraint zero=0 --constraint tp=2
# FlexFlow's CNN cases (Jia et al. SysML'19, §7): the classifier's fc layers split by op.
row "alexnet, 16 x dgx-a100, batch 512" --model alexnet --cluster dgx-a100 --gpus 16 \
  --global-batch 512
row "alexnet, 64 x dgx-a100, batch 2048" --model alexnet --cluster dgx-a100 --gpus 64 \
  --global-batch 2048
row "vgg19, 16 x dgx-a100, batch 512" --model vgg19 --cluster dgx-a100 --gpus 16 \
  --global-batch 512
row "vgg19, 64 x dgx-a100, batch 2048" --model vgg19 --cluster dgx-a100 --gpus 64 \
  --global-batch 2048
row "resnet50, 64 x dgx-a100, batch 2048" --model resnet50 --cluster dgx-a100 --gpus 64 \
  --global-batch 2048
# FlexFlow's Inception-v3 (§7): its modules' branches are not per-op splits here (SUPER's branch
# split is their tp layout: bench/branch_parallel_bench.sh); the fc splits are what --per-op moves.
row "inception-v3, 16 x dgx-a100, batch 512" --model inception-v3 --cluster dgx-a100 --gpus 16 \
  --global-batch 512
row "inception-v3, 64 x dgx-a100, batch 2048" --model inception-v3 --cluster dgx-a100 --gpus 64 \
  --global-batch 2048
# FlexFlow's own setting (§7: P100 nodes of 4 GPUs over 100 Gb/s InfiniBand): the V100 nodes of 4
# of lassen-v100 (EDR 100 Gb/s), 4 to 64 GPUs, 32 images a GPU; and 4 A100s.
for gpus in 4 16 64; do
  for model in alexnet resnet50 inception-v3; do
    row "$model, $gpus x lassen-v100, batch $((32 * gpus))" --model "$model" \
      --cluster lassen-v100 --gpus "$gpus" --global-batch $((32 * gpus))
  done
done
for model in alexnet resnet50; do
  row "$model, 4 x dgx-a100, batch 128" --model "$model" --cluster dgx-a100 --gpus 4 \
    --global-batch 128
done
# One image a GPU (large-batch-free scaling): where the convolutions' bound stops ruling splits
# out (models/conv_split_bound.hpp).
for model in resnet50 inception-v3; do
  row "$model, 64 x dgx-a100, batch 64" --model "$model" --cluster dgx-a100 --gpus 64 \
    --global-batch 64
done
# GPipe's AmoebaNet-D (its cells' later convolutions are wide), two and one images a GPU.
row "amoebanet-d, 8 x dgx-a100, batch 16" --model amoebanet-d --cluster dgx-a100 --gpus 8 \
  --global-batch 16
row "amoebanet-d, 64 x dgx-a100, batch 64" --model amoebanet-d --cluster dgx-a100 --gpus 64 \
  --global-batch 64
# The 128-op graph: every layer's split searched (runs of 1, 2, 4... layers beyond 32 ops).
row "mlp-128x2k (128 ops), 16 x dgx-a100, batch 512" --model "$tmp/mlp-128.json" \
  --cluster dgx-a100 --gpus 16 --global-batch 512
