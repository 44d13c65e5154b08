#!/usr/bin/env bash
# `sextant export`: each target's text parses as its stack reads it (Megatron's arguments as a
# shell word list, TorchTitan's TOML, DeepSpeed's JSON, NeMo's path=value lines) and says the
# plan's degrees; --out writes the file; what a target cannot run or say fails with exit 2; a
# plan `sextant plan --stack X` writes exports to X. (Every name and value against the stacks'
# recorded sources: tests/interop/export_test.cpp.)
set -uo pipefail
sextant="$1"
source "$(dirname "$0")/probe_lib.sh"

plan=(--model llama3-8b --cluster dgx-h100 --gpus 16 --tp 4 --pp 2 --sp --zero 1 --global-batch 128)
"$sextant" export "${plan[@]}" --to megatron-core >"$dir/args.txt" 2>"$dir/notes.txt" ||
  fail "megatron-core: $(cat "$dir/notes.txt")"
python3 - "$dir/args.txt" <<'PY' || fail "megatron-core arguments"
import shlex, sys
words = shlex.split(open(sys.argv[1]).read().replace("\\\n", " "))  # continued lines, as a shell
args = dict(zip(words, words[1:] + [""]))
assert args["--tensor-model-parallel-size"] == "4" and args["--pipeline-model-parallel-size"] == "2"
assert "--sequence-parallel" in words and "--use-distributed-optimizer" in words, words
assert args["--global-batch-size"] == "128" and args["--num-layers"] == "32"
PY
grep -q "launch on 16 GPUs" "$dir/notes.txt" || fail "megatron-core: no launch note on stderr"

"$sextant" export --model llama3-8b --cluster dgx-h100 --gpus 8 --zero 3 --micro-batch 2 \
  --global-batch 64 --stack torchtitan --recompute selective --to torchtitan \
  --out "$dir/job.toml" >"$dir/out.txt" 2>&1 || fail "torchtitan: $(cat "$dir/out.txt")"
python3 - "$dir/job.toml" <<'PY' || fail "torchtitan TOML"
import sys, tomllib
t = tomllib.load(open(sys.argv[1], "rb"))
assert t["parallelism"]["data_parallel_shard_degree"] == 8, t
assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}, t
assert t["training"]["local_batch_size"] == 2 and t["training"]["global_batch_size"] == 64, t
PY

"$sextant" export --model llama2-7b --cluster dgx-a100 --gpus 8 --zero 3 --micro-batch 2 \
  --global-batch 64 --stack deepspeed --offload-optimizer host --to deepspeed --json \
  >"$dir/ds.json" 2>&1 || fail "deepspeed: $(cat "$dir/ds.json")"
python3 - "$dir/ds.json" <<'PY' || fail "deepspeed JSON"
import json, sys
r = json.load(open(sys.argv[1]))
c = json.loads(r["text"])
assert c["zero_optimization"]["stage"] == 3 and c["gradient_accumulation_steps"] == 4, c
assert c["zero_optimization"]["offload_optimizer"]["device"] == "cpu", c
assert {"name": "train_batch_size", "value": 64} in r["settings"], r["settings"]
PY

"$sextant" export "${plan[@]}" --to nemo >"$dir/nemo.txt" 2>/dev/null || fail "nemo"
grep -qx "trainer.strategy.tensor_model_parallel_size=4" "$dir/nemo.txt" || fail "nemo: no tp"
grep -qx "optim.config.use_distributed_optimizer=True" "$dir/nemo.txt" || fail "nemo: no ZeRO-1"

# The best plan of a search for a stack exports to that stack.
"$sextant" plan --model llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 32 --stack torchtitan \
  --top 1 --quiet --out "$dir/best.json" >/dev/null 2>&1 || fail "plan --stack torchtitan"
"$sextant" export --model llama3-8b --cluster dgx-h100 --plan "$dir/best.json" --to torchtitan \
  >/dev/null 2>"$dir/best.txt" || fail "the torchtitan plan does not export: $(cat "$dir/best.txt")"

# ... and reads back as the same plan, which simulates.
"$sextant" import "$dir/job.toml" --from torchtitan --model llama3-8b --gpus 8 \
  --out "$dir/back.json" >"$dir/import.txt" 2>&1 || fail "import: $(cat "$dir/import.txt")"
grep -q "dp8.tp1.pp1.z3.mb2.rc-sel (torchtitan stack)" "$dir/import.txt" ||
  fail "import named another plan: $(cat "$dir/import.txt")"
"$sextant" simulate --model llama3-8b --cluster dgx-h100 --plan "$dir/back.json" >/dev/null 2>&1 ||
  fail "the imported plan does not simulate"
"$sextant" export "${plan[@]}" --to megatron-core 2>/dev/null >"$dir/args.sh"
"$sextant" import "$dir/args.sh" --from megatron-core --model llama3-8b --gpus 16 --json \
  >"$dir/back.json" 2>&1 || fail "megatron import: $(cat "$dir/back.json")"
python3 - "$dir/back.json" <<'PY' || fail "megatron import"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["name"] == "dp2.tp4.pp2.z1.mb1.sp.1f1b", r["name"]
assert "--swiglu" in r["ignored"] and "--tensor-model-parallel-size" not in r["ignored"], r
assert "--num-layers" not in r["ignored"], r  # read: checked against the model
PY
expect_error "--num-layers = 32: 80 as the model llama3-70b has it" \
  "$sextant" import "$dir/args.sh" --from megatron-core --model llama3-70b --gpus 16
expect_error "--from = titan: must be one of" \
  "$sextant" import "$dir/args.sh" --from titan --model llama3-8b

expect_error "the stack torchtitan does not run ZeRO-1" \
  "$sextant" export "${plan[@]}" --to torchtitan
expect_error "activation offload: no pretrain_gpt.py flag" \
  "$sextant" export --model llama3-8b --cluster dgx-h100 --gpus 8 --zero 1 --global-batch 8 \
  --offload-activations host --to megatron-core
expect_error "--to = llama: must be one of megatron-core" \
  "$sextant" export "${plan[@]}" --to llama
expect_error "--out = /proc/nope/x.toml" \
  "$sextant" export "${plan[@]}" --to megatron-core --out /proc/nope/x.toml

[ "$failures" -eq 0 ] || exit 1
echo "export: ok"
