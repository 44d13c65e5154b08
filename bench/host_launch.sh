#!/usr/bin/env bash
# Host time per launch and per kernel the lowering counts, in the project's PyTorch-profiler
# traces (bench/host_launch_rates.py), for the stack presets' host_launch_us. The lowering's
# kernels of a pass are read from the simulator itself: with the host taking 1 s a kernel of that
# pass, the step takes that many seconds and a fraction (its GPU work is milliseconds).
# Usage: bench/host_launch.sh [SEXTANT]   (prints markdown; bench/results/host_launch.md)
set -euo pipefail
cd "$(dirname "$0")/.."
sextant=${1:-build/release/cli/sextant}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# lowered_kernels MODEL CLUSTER PLAN_JSON: prints "forward backward"
lowered_kernels() {
  local model=$1 cluster=$2 plan=$3 out=""
  for pass in forward backward; do
    python3 - "$plan" "$pass" > "$tmp/plan.json" <<'PYEOF'
import json, sys
plan = json.loads(sys.argv[1])
plan["stack"]["host_launch_us"] = {"forward": 0, "backward": 0, sys.argv[2]: 1e6}
print(json.dumps(plan))
PYEOF
    step=$("$sextant" simulate --model "$model" --cluster "$cluster" --plan "$tmp/plan.json" --json |
      python3 -c 'import json, sys; print(int(json.load(sys.stdin)["step_time_s"]))')
    out="$out $step"
  done
  echo $out
}

# zoo_variant ZOO_NAME NEW_NAME FIELD VALUE: the zoo model with one transformer field changed.
zoo_variant() {
  python3 -c 'import json, sys
m = json.load(open("models/zoo/%s.json" % sys.argv[1]))
m["name"], m["transformer"][sys.argv[3]] = sys.argv[2], int(sys.argv[4])
print(json.dumps(m))' "$@"
}

# As `sextant validate` takes K2/K3's model, and K1's: the zoo's GPT-2 (Hugging Face's tanh GELU,
# eight eager kernels, as the trace ran it) with the vocabulary padded to 50304.
zoo_variant llama3-8b llama3-8b-8-layers layers 8 > "$tmp/llama8.json"
zoo_variant gpt2-124m gpt2-124m-v50304 vocab 50304 > "$tmp/gpt2.json"
llama='{"schema": "sextant.plan/1", "dp": 1, "tp": 1, "pp": 1, "zero": 0, "micro_batch": 1, "global_batch": 1, "seq_len": 8192, "stack": {"preset": "PRESET", "autocast": true, "cross_entropy": "eager"}}'
gpt2=$(cat traces/samples/kineto-gpt2-124m-h100-b8.plan.json)

echo "Lowering's kernels a step (forward backward):"
echo "- gpt2-124m b8 (K1, pytorch-fsdp + autocast): $(lowered_kernels "$tmp/gpt2.json" h100-1gpu "$gpt2")"
echo "- llama3-8b 8 layers eager (K2, torchtitan + autocast): $(lowered_kernels "$tmp/llama8.json" h200-1gpu "${llama/PRESET/torchtitan}")"
echo "- llama3-8b 8 layers compiled (K3, torchtitan-compiled + autocast): $(lowered_kernels "$tmp/llama8.json" h200-1gpu "${llama/PRESET/torchtitan-compiled}")"
echo
python3 bench/host_launch_rates.py traces/samples/kineto-*.json.gz
