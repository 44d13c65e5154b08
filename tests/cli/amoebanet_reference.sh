#!/usr/bin/env bash
# AmoebaNet-D's lowering against an independent PyTorch build of the same model file
# (tests/pytorch/amoebanet_reference.py): parameters exactly, forward FLOPs per sample to 1e-9.
# Usage: amoebanet_reference.sh SEXTANT SOURCE_DIR [MODEL]
set -euo pipefail
sextant="$1"
source_dir="$2"
model="${3:-amoebanet-d}"
python="${SEXTANT_PYTHON:-/usr/bin/python3}"
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "python3-torch is missing: scripts/setup.sh installs it"
  exit 1
fi
model_json="$source_dir/models/zoo/$model.json"
reference=$("$python" "$source_dir/tests/pytorch/amoebanet_reference.py" "$model_json")
ours=$("$sextant" models show "$model" --json)
"$python" - "$reference" "$ours" <<'PY'
import json, sys
ref, ours = json.loads(sys.argv[1]), json.loads(sys.argv[2])
params, flops = ours["active_parameters"], ours["forward_flops_per_token"]
print(f"parameters: pytorch {ref['parameters']}, sextant {params}")
print(f"forward FLOPs per sample: pytorch {ref['forward_flops']}, sextant {flops:.0f}")
assert params == ref["parameters"], "parameter counts differ"
assert abs(flops - ref["forward_flops"]) <= 1e-9 * ref["forward_flops"], "forward FLOPs differ"
PY
