#!/usr/bin/env bash
# Where compressed gradient exchanges start to pay (issue 13): the crossover bandwidth `sextant
# plan --compression` finds on the best DDP plan of each case (planner/compression_crossover.hpp:
# the links the replicas cross swept from 1/1000x to 10x the cluster file's, the highest bandwidth
# at which the compressed step stops or starts being the faster one). Predictions only. Numbers,
# never pass/fail; record them with bench/run.sh compression_crossover.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
kinds=(qsgd:bits=8 qsgd:bits=4 qsgd:bits=2 onebit topk:ratio=0.01 topk:ratio=0.001
  powersgd:rank=1 powersgd:rank=4)
flags=()
for k in "${kinds[@]}"; do flags+=(--compression "$k"); done
crossovers() {
  "$sextant" plan "$@" "${flags[@]}" --stack sextant --constraint zero=0 --constraint tp=1 --constraint pp=1 \
    --top 1 --quiet | sed -n '/when compression pays/,$p'
}
echo "GPT-2 350M on 16 and 64 A100s (dgx-a100: 8 per node, InfiniBand), 256 sequences a step"
for gpus in 16 64; do
  crossovers --model gpt2-350m --cluster dgx-a100 --gpus "$gpus" --global-batch 256
done
echo
echo "ResNet-50 on 16 and 64 V100s (lassen-v100: 4 per node, dual-rail EDR), 512 images, fp16"
for gpus in 16 64; do
  crossovers --model resnet50 --cluster lassen-v100 --gpus "$gpus" --global-batch 512 --dtype fp16
done
