#!/usr/bin/env bash
# Feeds the `sextant` commands that read files truncated, mistyped and absurd inputs: each must
# exit with status 2 and one clear line naming the file, never crash (status >= 128) or succeed.
set -u
sextant="$1"
source_dir="$2"
source "$(dirname "${BASH_SOURCE[0]}")/probe_lib.sh"

"$sextant" clusters show local-cpu --json >"$dir/cluster.json"

# An objective the planner does not have is named with the ones it has.
expect_error "--objective = fastest: must be time, cost or memory" "$sextant" plan --model gpt-tiny \
  --cluster local-cpu --gpus 2 --global-batch 8 --objective fastest

# A reference of core times that bench cores did not write is named, field and all.
echo '{"multiply_add_s": "fast", "pointer_chase_s": 0.004}' >"$dir/cores.json"
expect_error "$dir/cores.json: /multiply_add_s = \"fast\": expected a positive time in seconds" \
  "$sextant" bench cores --repeats 1 --reference "$dir/cores.json"
echo '[1, 2]' >"$dir/cores-array.json"
expect_error "$dir/cores-array.json: /multiply_add_s" "$sextant" bench cores --repeats 1 \
  --reference "$dir/cores-array.json"

# One bad plan, one message: simulate, run and calibrate refuse tp 3 on gpt-tiny (4 heads, ffn 512)
# with the same words, from the one rule (spec::tensor_parallel_problem).
cat >"$dir/tp3.plan.json" <<'EOF'
{"schema": "sextant.plan/1", "dp": 1, "tp": 3, "pp": 1, "zero": 0, "micro_batch": 1,
 "global_batch": 3}
EOF
tp3="/tp = 3: must divide the 4 attention heads, the 4 key/value heads and ffn_hidden (512)"
expect_error "tp3.plan.json: $tp3" "$sextant" simulate --model gpt-tiny --cluster local-cpu \
  --gpus 3 --plan "$dir/tp3.plan.json"
expect_error "tp3.plan.json: $tp3" "$sextant" calibrate --cluster local-cpu --model gpt-tiny \
  --plan "$dir/tp3.plan.json" --out "$dir/never.json" \
  --kineto "$source_dir/traces/samples/kineto-gpt2-124m-h100-b8.json.gz"
expect_error "$tp3" "$sextant" run --model gpt-tiny --np 3 --plan "$dir/tp3.plan.json" --steps 1
expect_error "$tp3" "$sextant" simulate --model gpt-tiny --cluster local-cpu --gpus 3 --tp 3 \
  --global-batch 3

# --model-out writes a measured mixture of experts: refused when no trace has its dispatches.
expect_error "--model-out = $dir/never-model.json: a --trace of a mixture of experts run" \
  "$sextant" calibrate --cluster local-cpu --out "$dir/never.json" \
  --trace "$source_dir/traces/samples/bench-comm-2ranks.json" --model-out "$dir/never-model.json"

# Offloading: refused where the cluster has no host section (naming it), and by the executor
# beyond host memory, or for parameters without the optimizer (spec/plan.cpp,
# sim/cost/offload_cost.cpp, exec/trainer).
cat >"$dir/offload.plan.json" <<'EOF'
{"schema": "sextant.plan/1", "dp": 1, "tp": 1, "pp": 1, "zero": 2, "micro_batch": 1,
 "global_batch": 1, "offload": {"optimizer": "host"}}
EOF
expect_error "cluster h100-1gpu has no \"host\" section" "$sextant" simulate --model gpt-tiny \
  --cluster h100-1gpu --gpus 1 --plan "$dir/offload.plan.json"
cat >"$dir/offload-params.plan.json" <<'EOF'
{"schema": "sextant.plan/1", "dp": 1, "tp": 1, "pp": 1, "zero": 3, "micro_batch": 1,
 "global_batch": 1, "offload": {"params": "host"}}
EOF
expect_error "offloads the parameters with the optimizer" "$sextant" run --model gpt-tiny \
  --np 1 --plan "$dir/offload-params.plan.json" --steps 1
# The same from the flags, decoded as a plan's "offload" object.
expect_error "/offload/optimizer = \"disk\": must be one of none, host or nvme" "$sextant" \
  simulate --model gpt-tiny --cluster dgx-a100 --gpus 1 --zero 1 --offload-optimizer disk \
  --global-batch 1
expect_error "/offload/params = host: needs zero 3" "$sextant" simulate --model gpt-tiny \
  --cluster dgx-a100 --gpus 1 --zero 1 --offload-params host --global-batch 1
# Activations go to host memory only, and the executor offloads transformer blocks' only.
expect_error "/offload/activations = nvme: \"host\" or \"none\"" "$sextant" simulate \
  --model gpt-tiny --cluster dgx-a100 --gpus 1 --offload-activations nvme --global-batch 1
expect_error "/offload/activation_layers = 3: applies with offload/activations" "$sextant" \
  simulate --model gpt-tiny --cluster dgx-a100 --gpus 1 --offload-activation-layers 3 \
  --global-batch 1
expect_error "cluster local-cpu has no \"host\" section" "$sextant" simulate --model gpt-tiny \
  --cluster local-cpu --gpus 1 --offload-activations host --global-batch 1
expect_error "the executor offloads the activations of transformer blocks" "$sextant" run \
  --model mlp-small --np 1 --global-batch 2 --offload-activations host --steps 1
# Context parallelism: transformers only, 2*cp dividing the sequence, ring attention over a fused
# kernel, Ulysses over whole heads (spec/context_parallel.cpp); the executor asks the same rule of
# ring attention (its steps are flash attention's: exec/blockwise_attention.hpp).
expect_error "/cp = 2: splits a transformer's sequences" "$sextant" simulate --model resnet50 \
  --cluster dgx-a100 --dp 1 --global-batch 1 --cp 2
expect_error "/cp = 128: needs 2*cp (256) to divide the sequence length (128)" "$sextant" \
  simulate --model gpt-tiny --cluster dgx-a100 --global-batch 1 --cp 128 --cp-algorithm all-gather
expect_error "ring attention runs blockwise flash attention" "$sextant" simulate --model gpt-tiny \
  --cluster dgx-a100 --global-batch 1 --cp 2 --attention unfused
expect_error "/cp_algorithm = \"spiral\"" "$sextant" simulate --model gpt-tiny --cluster dgx-a100 \
  --global-batch 1 --cp 2 --cp-algorithm spiral
expect_error "/cp_algorithm = ring: ring attention runs blockwise flash attention" \
  "$sextant" run --model gpt-tiny --np 2 --global-batch 2 --cp 2 --steps 1
# AxoNN's 3D tensor grid: three axes whose product is tp, the axes dividing what they split
# (spec/tensor_grid.cpp); the executor runs it on CPU ranks in fp32 (exec/src/gpt/grid_linear.hpp).
expect_error "--tp-grid = 2x2: expected XxYxZ" "$sextant" simulate --model gpt-tiny \
  --cluster dgx-a100 --global-batch 2 --tp-grid 2x2
expect_error "/tp_grid = 1x1x4: z (4) must divide micro_batch (2)" "$sextant" simulate \
  --model gpt-tiny --cluster dgx-a100 --global-batch 2 --micro-batch 2 --tp-grid 1x1x4
expect_error "/tp_grid = 2x1x2: a 3D tensor grid runs on CPU ranks in fp32" \
  "$sextant" run --model gpt-tiny --np 4 --global-batch 2 --micro-batch 2 --tp-grid 2x1x2 \
  --steps 1 --precision bf16
# Gradient compression: knobs checked where they are given (flag or plan file), DDP only, and
# the CUDA executor refuses it (spec/plan.cpp, exec/src/train/runner.cpp).
expect_error "--compression: /bits = 3: must be 2, 4 or 8" "$sextant" simulate --model gpt-tiny \
  --cluster local-cpu --dp 2 --global-batch 2 --compression qsgd:bits=3
expect_error "/compression/kind = onebit: applies to the all-reduce of DDP (zero 0)" "$sextant" \
  simulate --model gpt-tiny --cluster local-cpu --dp 2 --zero 1 --global-batch 2 \
  --compression onebit
expect_error "--compression: /kind = \"gzip\": must be one of none, qsgd, topk, onebit, powersgd or sparcml" \
  "$sextant" plan --model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 4 \
  --compression gzip
expect_error "--compression = topk:ratio: expected kind[:knob=value,...]" "$sextant" simulate \
  --model gpt-tiny --cluster local-cpu --dp 2 --global-batch 2 --compression topk:ratio
expect_error "--compression: /rank = 33: must be in [1, 32]" "$sextant" simulate \
  --model gpt-tiny --cluster local-cpu --dp 2 --global-batch 2 --compression powersgd:rank=33
expect_error "--compression: /rank = 2: applies to kind \"powersgd\" only" "$sextant" simulate \
  --model gpt-tiny --cluster local-cpu --dp 2 --global-batch 2 --compression topk:rank=2
expect_error "/compression/kind = powersgd: runs without tp_grid" "$sextant" simulate \
  --model gpt-tiny --cluster local-cpu --dp 2 --tp-grid 1x2x1 --global-batch 4 \
  --compression powersgd
expect_error "/compression/kind = powersgd: runs without expert parallelism (ep 1)" "$sextant" simulate \
  --model moe-tiny --cluster local-cpu --dp 2 --ep 2 --global-batch 2 --compression powersgd
# A mixture of experts with tp routes each tp rank's own tokens: sequence parallelism
# (spec::moe_tensor_parallel_problem), in simulate and in run alike.
expect_error "/sequence_parallel = false: a mixture of experts with tp 2 needs sequence parallelism" \
  "$sextant" simulate --model moe-tiny --cluster local-cpu --tp 2 --global-batch 2
expect_error "/sequence_parallel = false: a mixture of experts with tp 2 needs sequence parallelism" \
  "$sextant" run --model moe-tiny --np 2 --tp 2 --global-batch 2 --steps 1
# AmoebaNet's cells run on whole maps: a spatial split is refused before any work.
expect_error "/spatial = 2x1: splits chains of convolutions and ResNet blocks: multi-branch units (AmoebaNet's cells" \
  "$sextant" run --model amoebanet-d --np 2 --spatial 2x1 --global-batch 2 --steps 1
cat >"$dir/unet.model.json" <<'EOF'
{"schema": "sextant.model/1", "name": "unet", "kind": "cnn",
 "cnn": {"input": {"channels": 1, "height": 12, "width": 12},
         "layers": [{"type": "conv", "out_channels": 4, "kernel": 3, "bias": false, "relu": true,
                     "skip": true},
                    {"type": "max_pool", "kernel": 2},
                    {"type": "conv", "out_channels": 4, "kernel": 1, "bias": false, "relu": true},
                    {"type": "up_conv", "out_channels": 4, "kernel": 2, "bias": false},
                    {"type": "concat"},
                    {"type": "conv", "out_channels": 2, "kernel": 1, "bias": false}]}}
EOF
# A 2D U-Net runs on one pipeline stage: its kept maps do not cross a stage boundary there.
expect_error "/pp = 2: the executor runs U-Net's skip connections on one pipeline stage" \
  "$sextant" run --model "$dir/unet.model.json" --np 2 --pp 2 --global-batch 2 --steps 1
# Channel splits (tp for CNNs): tp divides every convolution's channels, not for MLPs; sequence parallelism is a transformer's (spec/channel_split.cpp, spec/plan.cpp).
expect_error "/tp = 3: must divide the 64 channels of layer 0 (conv)" "$sextant" simulate \
  --model resnet50 --cluster dgx-a100 --dp 1 --tp 3 --global-batch 2
expect_error "/tp = 2: tensor parallelism applies to transformers (heads) and CNNs (channels)" \
  "$sextant" simulate --model mlp-small --cluster local-cpu --dp 1 --tp 2 --global-batch 2
expect_error "/sequence_parallel = true: applies to transformers" "$sextant" simulate \
  --model resnet-tiny --cluster local-cpu --dp 1 --tp 2 --sp --global-batch 2
# Spatial splits: CNNs only, a grid the model's maps can take, the rank count (spec/spatial_split.cpp).
expect_error "/spatial = 2x1: applies to CNNs only" "$sextant" simulate --model gpt-tiny \
  --cluster local-cpu --dp 1 --global-batch 2 --spatial 2
expect_error "--spatial = 2y2: expected HxW" "$sextant" simulate --model resnet50 \
  --cluster dgx-a100 --dp 1 --global-batch 2 --spatial 2y2
expect_error "/spatial = 16x16: layer 4 (bottleneck) makes a 14x14 feature map" "$sextant" \
  simulate --model resnet50 --cluster dgx-a100 --dp 1 --global-batch 1 --spatial 16x16
expect_error "/spatial = 2x1x1: d splits a volume's planes (depth)" "$sextant" simulate \
  --model resnet50 --cluster dgx-a100 --dp 1 --global-batch 1 --spatial 2x1x1
# 8 slabs of the 3D U-Net: its 11-plane map at the bottom leaves ranks 1 plane, its valid 3x3x3
# convolution reads 2 past a block.
expect_error "/spatial = 8x1x1: layer 9 (conv) makes a 9x11x11 feature map from 11x13x13" \
  "$sextant" simulate --model unet3d --cluster dgx-a100 --dp 1 --global-batch 1 --spatial 8x1x1 \
  --gpus 8
expect_error "--gpus = 2: must equal the ranks of the plan (dp2.tp1.pp1.z0.mb1.hw2x1: 4)" \
  "$sextant" simulate --model resnet50 --cluster dgx-a100 --dp 2 --global-batch 2 --spatial 2 \
  --gpus 2
sed 's/"zero": 2/"zero": 0/' "$dir/offload.plan.json" >"$dir/offload-z0.plan.json"
expect_error "/offload/optimizer = host: needs zero >= 1" "$sextant" simulate --model gpt-tiny \
  --cluster local-cpu --gpus 1 --plan "$dir/offload-z0.plan.json"

# The loop: a cluster of the other kind, and --refit of runs that are not there or are damaged.
expect_error "--cluster = dgx-a100: a CPU cluster" "$sextant" loop --cluster dgx-a100 --out "$dir/loop"
expect_error "$dir/loop-empty/dp1.mb4.r1.steps.jsonl: missing" "$sextant" loop --refit \
  --repeats 1 --out "$dir/loop-empty"
mkdir -p "$dir/loop-bad"
echo '{"step_time_s": "slow"}' >"$dir/loop-bad/dp1.mb4.r1.steps.jsonl"
expect_error "$dir/loop-bad/dp1.mb4.r1.steps.jsonl: line 1 /step_time_s" "$sextant" loop --refit \
  --repeats 1 --out "$dir/loop-bad"

# Partial recompute: beyond a chunk's layers (gpt-tiny: 4 layers, pp 2 -> chunks of 2), and
# without full recompute; simulate and run say the same words (spec/plan.cpp, one rule each).
rcl="/recompute_layers = 3: must not exceed the layers of the largest stage chunk (2)"
expect_error "$rcl" "$sextant" simulate --model gpt-tiny --cluster local-cpu --gpus 2 --pp 2 \
  --global-batch 4 --recompute full --recompute-layers 3
expect_error "$rcl" "$sextant" run --model gpt-tiny --np 2 --pp 2 --global-batch 4 \
  --recompute full --recompute-layers 3 --steps 1
expect_error "/recompute_layers = 1: applies to recompute \"full\" only" "$sextant" simulate \
  --model gpt-tiny --cluster local-cpu --gpus 1 --global-batch 4 --recompute-layers 1
expect_error "--constraint = recompute_layer=0: expected <dim><op><integer>" "$sextant" plan \
  --model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 8 --constraint recompute_layer=0

# A valid model file from the zoo, then broken in several ways.
cp "$source_dir/models/zoo/gpt-tiny.json" "$dir/valid-model.json"
"$sextant" models show "$dir/valid-model.json" >/dev/null || { echo "FAIL: valid model rejected"; failures=$((failures + 1)); }

head -c 200 "$dir/valid-model.json" >"$dir/truncated.json"
expect_error "$dir/truncated.json: invalid JSON" "$sextant" models show "$dir/truncated.json"
sed 's/"layers": 4/"layers": "four"/' "$dir/valid-model.json" >"$dir/mistyped.json"
expect_error "/transformer/layers = \"four\": expected an integer" "$sextant" models show "$dir/mistyped.json"
sed 's/"hidden": 128/"hidden": -128/' "$dir/valid-model.json" >"$dir/absurd.json"
expect_error "/transformer/hidden = -128: must be >= 1" "$sextant" models show "$dir/absurd.json"
sed 's/"vocab"/"vocab_size"/' "$dir/valid-model.json" >"$dir/typo.json"
expect_error "/transformer/vocab_size: unknown field" "$sextant" models show "$dir/typo.json"
: >"$dir/empty.json"
expect_error "empty.json: invalid JSON" "$sextant" models show "$dir/empty.json"
expect_error "cannot open" "$sextant" models show "$dir/missing.json"
expect_error "unknown model" "$sextant" models show no-such-model

head -c 300 "$dir/cluster.json" >"$dir/cluster-truncated.json"
expect_error "cluster-truncated.json: invalid JSON" "$sextant" clusters show "$dir/cluster-truncated.json"
sed 's/"bandwidth_GBps": 4.0/"bandwidth_GBps": -4.0/' "$dir/cluster.json" >"$dir/cluster-absurd.json"
expect_error "/network/levels/0/bandwidth_GBps = -4.0: must be > 0" "$sextant" clusters show "$dir/cluster-absurd.json"
sed 's/"devices_per_node": 2/"devices_per_node": true/' "$dir/cluster.json" >"$dir/cluster-mistyped.json"
expect_error "/devices_per_node = true: expected an integer" "$sextant" clusters show "$dir/cluster-mistyped.json"
expect_error "unknown cluster" "$sextant" clusters show dgx-z9000

# Limits before work (issue 17): nesting that overflowed the stack, a sequence length that aborted
# the plan search, a GPU count that printed a 310-digit range and exited 105.
python3 -c "print('[' * 100000 + ']' * 100000)" >"$dir/nested.json"
expect_error "nested.json: JSON nested deeper than 256 levels" "$sextant" models show "$dir/nested.json"
expect_error "--seq-len = 2000000000: must be <= the model's max_positions" \
  "$sextant" plan --model gpt2-124m --cluster dgx-a100 --gpus 8 --global-batch 8 --seq-len 2000000000
expect_error "--seq-len = 2000000000: must be <= 16777216" \
  "$sextant" plan --model llama2-7b --cluster dgx-a100 --gpus 8 --global-batch 8 --seq-len 2000000000
expect_error "--gpus: must be a positive number, got 0" \
  "$sextant" plan --model gpt2-124m --cluster dgx-a100 --gpus 0 --global-batch 8
expect_error "--bogus" "$sextant" plan --model gpt2-124m --cluster dgx-a100 --gpus 8 --global-batch 8 --bogus

sed 's/"layers": 4/"layers": 1000000000000/' "$dir/valid-model.json" >"$dir/deep-model.json"
expect_error "/transformer/layers = 1000000000000: must be <= 16384" \
  timeout 20 "$sextant" simulate --model "$dir/deep-model.json" --cluster dgx-a100 --dp 8 --global-batch 8
# A PyTorch-profiler trace where a Sextant trace is expected: one line that says what it is.
zcat "$source_dir/traces/samples/kineto-gpt2-124m-h100-b8.json.gz" >"$dir/kineto.json"
out=$("$sextant" compare --measured "$dir/kineto.json" --predicted "$dir/kineto.json" 2>&1)
[ "$(wc -l <<<"$out")" -eq 1 ] || { echo "FAIL: Kineto trace to compare: $(wc -l <<<"$out") lines"; failures=$((failures + 1)); }
expect_error "this is a PyTorch-profiler (Kineto) trace" \
  "$sextant" compare --measured "$dir/kineto.json" --predicted "$dir/kineto.json"
# A thousand bad GEMM points: twenty problems printed, then a count.
python3 - "$dir/cluster.json" "$dir/cluster-many.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["device"]["gemm_efficiency"] = [{"flops": -1, "efficiency": 0.5}] * 1000
json.dump(c, open(sys.argv[2], "w"))
PY
out=$("$sextant" clusters show "$dir/cluster-many.json" 2>&1)
[ "$(wc -l <<<"$out")" -le 21 ] || { echo "FAIL: 1000 bad points printed $(wc -l <<<"$out") lines"; failures=$((failures + 1)); }
expect_error "more problem(s)" "$sextant" clusters show "$dir/cluster-many.json"

# A global batch that would take forever to schedule is refused at once (it ran until killed).
expect_error "/global_batch = 1000000000: must be in [1, 16777216]" timeout 20 "$sextant" simulate --model gpt-tiny --cluster dgx-a100 --dp 1 --global-batch 1000000000
expect_error "--global-batch = 1000000000: must be in [1, 16777216]" timeout 20 "$sextant" plan --model gpt-tiny --cluster dgx-a100 --gpus 8 --global-batch 1000000000

# Trace selections: a rank outside the plan and an unknown word name the flag; an unwritable
# --trace is refused before the simulation (it can take a minute).
sim=("$sextant" simulate --model gpt-tiny --cluster dgx-h100 --dp 2 --tp 2 --pp 2 --global-batch 8)
expect_error "--trace-ranks = 8: ranks of this plan are 0-7" "${sim[@]}" --trace "$dir/t.json" --trace-ranks 0,8
expect_error "--trace-ranks = first: a rank" "${sim[@]}" --trace "$dir/t.json" --trace-ranks first
expect_error "--trace-steps = x" "${sim[@]}" --trace "$dir/t.json" --trace-steps x
expect_error "--trace = /proc/nope/t.json: directory /proc/nope does not exist" "${sim[@]}" --trace /proc/nope/t.json
# Outputs are checked before the work: the bench printed its rows and then failed on the path;
# a run's --trace naming a directory is refused before the first step.
expect_error "--out = /proc/nope/x.json: directory /proc/nope does not exist" "$sextant" bench comm --out /proc/nope/x.json
expect_error "--nccl-tests = /proc/nope/all_reduce_perf.txt" "$sextant" bench comm --nccl-tests /proc/nope/
expect_error "--trace = $dir: $dir is a directory" "$sextant" run --model gpt-tiny --steps 1 --global-batch 2 --trace "$dir"
# A mistyped flag or name gets the closest known one (a typed --modle was "--model is required").
expect_error "unknown flag --modle for \`sextant simulate\` (did you mean --model?)" "$sextant" simulate --modle gpt-tiny --cluster local-cpu
expect_error "unknown cluster (did you mean dgx-h100?)" "$sextant" simulate --model gpt-tiny --cluster dgx-h10 --gpus 1
expect_error "unknown model (did you mean gpt2-124m?)" "$sextant" simulate --model gpt2-125m --cluster dgx-h100 --gpus 1
expect_error "unknown stack preset (did you mean torchtitan?)" "$sextant" simulate --model gpt-tiny --cluster dgx-h100 --gpus 1 --global-batch 8 --stack torchtitn
# What a selection keeps: one rank per pipeline stage (ranks 0 and 4 of dp 2 x tp 2 x pp 2), gzip.
"${sim[@]}" --trace "$dir/stages.json.gz" --trace-ranks stages >/dev/null ||
  { echo "FAIL: simulate --trace-ranks stages"; failures=$((failures + 1)); }
ranks=$(python3 -c 'import gzip, json, sys; print(sorted({e["pid"] for e in json.load(gzip.open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"}))' "$dir/stages.json.gz")
[ "$ranks" = "[0, 4]" ] || { echo "FAIL: --trace-ranks stages kept ranks $ranks"; failures=$((failures + 1)); }

# PipeDream-2BW: at least pp micro-batches (m >= d), no global-norm clipping in the executor
# (each stage updates when its part of a batch ends), checkpoints (both weight versions) in fp32
# only.
expect_error "needs at least pp (4) micro-batches per replica, has 2" "$sextant" simulate \
  --model gpt-tiny --cluster dgx-a100 --gpus 4 --pp 4 --global-batch 2 --schedule pipedream-2bw
# The executor's table (spec/executor_support.hpp) names the plan, the model and the run.
expect_error "of gpt-tiny on the cpu backend in fp32: /schedule = \"pipedream-2bw\": runs \
without global gradient-norm clipping (each stage updates when its part of a batch ends): pass \
--clip 0" "$sextant" run --model gpt-tiny --np 2 --pp 2 --global-batch 4 \
  --schedule pipedream-2bw --steps 1
expect_error "the executor checkpoints it in fp32 only" "$sextant" run --model gpt-tiny --np 2 \
  --pp 2 --global-batch 4 --schedule pipedream-2bw --steps 1 --clip 0 --precision bf16 \
  --checkpoint "$dir/ckpt-2bw"
# CNNs run in fp32 (kernels/convolution.hpp): mixed precision is refused before any work, naming
# the way out (the bf16 run is emulated on CPU ranks here; the CUDA backend refuses it the same).
expect_error "of resnet-tiny on the cpu backend in bf16: model /kind = \"cnn\": CNNs run in fp32: \
use --precision fp32" \
  "$sextant" run --model resnet-tiny --global-batch 2 --micro-batch 2 --steps 1 --precision bf16

# Numbers are plain decimals that fit their type; text values are not empty (cli/strict_values).
sim=("$sextant" simulate --model gpt-tiny --cluster local-cpu --global-batch 8)
expect_error "--gpus: expected a decimal integer without leading zeros, got '010'" "${sim[@]}" \
  --gpus 010
expect_error "expected a decimal integer, got '0x10'" "${sim[@]}" --gpus 2 --dp 2 \
  --micro-batch 0x10
expect_error "expected a decimal integer, got '1e20'" "$sextant" run --model gpt-tiny --np 1 \
  --global-batch 2 --steps 1e20
expect_error "--seed: must be >= 0, got '-1'" "$sextant" run --model gpt-tiny --np 1 \
  --global-batch 2 --steps 1 --seed -1
expect_error "--clip: expected a decimal number, got 'nan'" "$sextant" run --model gpt-tiny \
  --np 1 --global-batch 2 --steps 1 --clip nan
expect_error "--max-mean-error: expected a decimal number, got 'nan'" "$sextant" validate \
  --max-mean-error nan
expect_error "--max-row-error: expected a decimal number, got 'inf'" "$sextant" validate \
  --max-row-error inf
expect_error "--stack: expected a value, got an empty string" "${sim[@]}" --gpus 2 --stack ''
expect_error "--spatial = 0x2: every degree must be at least 1" "$sextant" simulate \
  --model resnet-tiny --cluster local-cpu --gpus 2 --global-batch 4 --spatial 0x2
expect_error "--tokens: must be a positive number of at most 1e+16, got 1e300" "$sextant" scale \
  --model gpt-tiny --cluster local-cpu --gpus 1,2 --global-batch 8 --tokens 1e300
# A trace selection without a trace is a mistake, not a no-op.
expect_error "--trace-ranks requires --trace" "${sim[@]}" --gpus 2 --trace-ranks 0
# A full device loses the output: the command fails (exit 1, an output error) saying so.
out=$("${sim[@]}" --gpus 2 --dp 2 --report /dev/full 2>&1)
rc=$?
if [ "$rc" -ne 1 ] || ! grep -qF "/dev/full: write failed" <<<"$out"; then
  echo "FAIL (exit $rc, want 1 and '/dev/full: write failed'): simulate --report /dev/full"
  echo "$out" | head -5
  failures=$((failures + 1))
fi
# A JSON file that names a field twice is refused naming it.
cat >"$dir/twice.plan.json" <<'EOF'
{"schema": "sextant.plan/1", "dp": 1, "tp": 1, "pp": 1, "zero": 0, "micro_batch": 1,
 "global_batch": 2, "stack": {"preset": "sextant", "dropout": true, "dropout": false}}
EOF
expect_error "twice.plan.json: /stack/dropout: given twice in one object" "$sextant" simulate \
  --model gpt-tiny --cluster local-cpu --gpus 1 --plan "$dir/twice.plan.json"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all bad inputs rejected cleanly"
