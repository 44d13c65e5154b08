#!/usr/bin/env bash
# The CPU executor against an independent PyTorch implementation of the same GPT (same initial
# weights and data, regenerated in Python from Sextant's definitions; torch.optim.AdamW): the loss
# and gradient norm of every step agree (fp32, different summation orders: 1e-4 relative).
# Usage: pytorch_reference.sh SEXTANT SOURCE_DIR [cpu|cuda] [MODEL] [fp32|bf16]; cuda compares
# `sextant run --backend cuda` with the reference on the GPU (TF32 off), on the same tolerances.
# bf16 runs Sextant in mixed precision (emulated on cpu) against the same full-precision
# reference: bf16 rounds activations to 2^-9 relative, so the loss is held to 1e-2 and the
# gradient norm to 5e-2. MODEL is a zoo name (default gpt-tiny: 5 steps of 8 sequences; gpt2-124m and other
# large models: 3 steps of 4 sequences of 1024 tokens, against a float64 reference, since PyTorch's
# fp32 gradients over a 50257-entry vocabulary drift by more than the tolerance while Sextant's
# agree with float64 to 1e-8: see gpt_reference.py). llama-tiny is the Llama-style decoder
# (RMSNorm, rotary embeddings, SwiGLU, no biases, untied), 5 steps like gpt-tiny; moe-tiny its
# mixture of experts (top-2 routing, a shared expert), checked the same way. A CNN (resnet-tiny:
# convolutions, batch norm, pooling, bottleneck blocks) goes against cnn_reference.py (PyTorch on the CPU; Sextant on cpu or cuda, fp32),
# and so do tests/pytorch/unet-tiny.json (U-Net's kept map, up-convolution, cropped concat and
# per-pixel loss), unet3d-tiny.json (the same over volumes: 3D windows, a padded depth) and
# volume-classifier-tiny.json (a 3D adaptive average pool before the classifier), and
# amoebanet-tiny.json (AmoebaNet-D's normal and reduction cells: 1x7 and 7x1 windows, pools that
# leave the padding out, the factorized reduction, the cells' two inputs), and inception-tiny.json
# (Inception-v3's modules a to e: parallel branches, pools that count the padding, split outputs).
# MODEL may also be a model file's path under SOURCE_DIR (e.g. tests/pytorch/moe-tiny-capacity.json).
set -euo pipefail
sextant="$1"
source_dir="$2"
device="${3:-cpu}"
model="${4:-gpt-tiny}"
precision="${5:-fp32}"
python="${SEXTANT_PYTHON:-/usr/bin/python3}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "python3-torch is missing: scripts/setup.sh installs it"
  exit 1
fi
steps=5
args=(--global-batch 8 --micro-batch 2 --steps $steps)
reference_dtype=float32
model_json="$source_dir/models/zoo/$model.json"
if [[ "$model" == *.json ]]; then
  model_json="$source_dir/$model"
  model=$(basename "$model" .json)
fi
if [[ "$model" != *-tiny* ]]; then
  steps=3
  args=(--global-batch 4 --micro-batch 2 --steps $steps)
  reference_dtype=float64
fi
backend=(--backend "$device" --precision "$precision")
"$sextant" run --model "$model_json" "${args[@]}" "${backend[@]}" --quiet \
  --log-json "$out/sextant.jsonl"
if grep -q '"kind": "cnn"' "$model_json"; then
  "$python" "$source_dir/tests/pytorch/cnn_reference.py" --model-json "$model_json" \
    "${args[@]}" --dtype "$reference_dtype" >"$out/pytorch.jsonl"
else
  "$python" "$source_dir/tests/pytorch/gpt_reference.py" --model-json "$model_json" \
    "${args[@]}" --device "$device" --dtype "$reference_dtype" >"$out/pytorch.jsonl"
fi
"$python" - "$out/sextant.jsonl" "$out/pytorch.jsonl" "$steps" "$precision" <<'PY'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
assert len(ours) == len(ref) == int(sys.argv[3]), (len(ours), len(ref))
loss_tol, norm_tol = (1e-2, 5e-2) if sys.argv[4] == "bf16" else (1e-4, 1e-3)
for a, b in zip(ours, ref):
    assert abs(a["loss"] - b["loss"]) <= loss_tol * abs(b["loss"]), (a, b)
    assert abs(a["grad_norm"] - b["grad_norm"]) <= norm_tol * abs(b["grad_norm"]), (a, b)
    print(f"step {a['step']}: loss {a['loss']:.6f} (PyTorch {b['loss']:.6f}), grad norm {a['grad_norm']:.4f} ({b['grad_norm']:.4f})")
PY
