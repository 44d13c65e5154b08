#!/usr/bin/env bash
# Issue 56's device measurements, for the GPU machine (../shared/DEVICE.md), in about 6 minutes:
#   1. GEMM rates at training shapes (bf16, fp8 with and without fast accumulation) with the SM
#      clock beside each, then 60 s of bf16 and 60 s of fp8 GEMM loops with clock and power every
#      100 ms (bench/gpu_power_clock.py), nvidia-smi logging the same counters throughout;
#   2. Llama-3 8B width (8 layers, micro-batch 1 x 8192) trained for 60 s eager with clock and power,
#      and a Kineto trace of two steps; the same compiled (per block) with a trace;
#   3. a GPT-3 175B tensor-parallel-8 shard (2 layers, 1 x 2048) eager and compiled, with traces.
#   4. the same 8 Llama layers under TorchTitan's own precision path, FSDP2 at world size 1 with
#      bf16 parameters and fp32 reduction (no autocast), eager for 30 s with clock and power, and
#      compiled, each with a trace.
#   5. (fp8, only when named) Llama-2 7B width (8 layers, 1 x 4096, NeMo's T9 row on one GPU) with
#      its linears in FP8 as Transformer Engine runs them (bench/fp8_linear.py), compiled per block,
#      60 s with clock and power and a trace; the same in bf16 for 30 s beside it (about 3 minutes).
# Everything goes to ./out/fidelity and, when $OUT is set, into $OUT/fidelity.tgz and a summary.
# PyTorch only: nothing to build. Usage: scripts/gpu-fidelity.sh [gemm] [llama] [gpt3] [fsdp] [fp8]
# (default: the first four, about 7 minutes).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/out/fidelity"
mkdir -p "$out"
pack() {
  [[ -n "${OUT:-}" ]] || return 0
  gzip -f "$out"/*.trace.json 2>/dev/null
  tar -czf "$OUT/fidelity.tgz" -C "$out" . && cp "$out/summary.jsonl" "$OUT/" 2>/dev/null
}
trap pack EXIT
cd "$root/bench"
export PYTHONUNBUFFERED=1
{ nvidia-smi; git -C "$root" rev-parse HEAD; date -u; } >"$out/machine.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 >"$out/nvidia-smi.csv" 2>&1 &
smi=$!
run() {  # run LIMIT_S NAME COMMAND...: one part, its JSON lines kept in summary.jsonl
  local limit=$1 name=$2; shift 2
  echo "== $name $(date -u +%T)"
  timeout "$limit" "$@" 2>"$out/$name.err" | tee -a "$out/summary.jsonl"
  echo "   rc ${PIPESTATUS[0]}"; tail -3 "$out/$name.err"
}
zoo="$root/models/zoo"
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(gemm llama gpt3 fsdp)
want() { [[ " ${parts[*]} " == *" $1 "* ]]; }
want gemm && run 200 gemm python3 gpu_power_clock.py --table --loop-s 60 --samples "$out/gemm_samples.json"
want llama && run 100 llama8l_eager python3 pytorch_llama_layers.py --model-json "$zoo/llama3-8b.json" --layers 8 \
  --seconds 60 --power --profile "$out/llama3-8b-8l-h200-eager.trace.json"
want llama && run 150 llama8l_compile python3 pytorch_llama_layers.py --model-json "$zoo/llama3-8b.json" --layers 8 \
  --compile --steps 10 --profile "$out/llama3-8b-8l-h200-compile.trace.json"
want gpt3 && for c in "" "--compile"; do
  run 80 "gpt3tp8${c:+_compile}" python3 pytorch_llama_layers.py --model-json "$zoo/gpt3-175b.json" \
    --family gpt3-shard --tp 8 --layers 2 --seq 2048 --steps 20 $c \
    --profile "$out/gpt3-175b-tp8-2l-h200${c:+-compile}.trace.json"
done
want fsdp && run 100 llama8l_fsdp2_eager python3 pytorch_llama_layers.py --model-json "$zoo/llama3-8b.json" \
  --layers 8 --fsdp --seconds 30 --power --profile "$out/llama3-8b-8l-h200-fsdp2-eager.trace.json"
want fsdp && run 150 llama8l_fsdp2_compile python3 pytorch_llama_layers.py --model-json "$zoo/llama3-8b.json" \
  --layers 8 --fsdp --compile --steps 10 --profile "$out/llama3-8b-8l-h200-fsdp2-compile.trace.json"
want fp8 && run 200 llama2_7b_8l_fp8_compile python3 pytorch_llama_layers.py \
  --model-json "$zoo/llama2-7b.json" --layers 8 --seq 4096 --fp8 --compile --seconds 60 --power \
  --profile "$out/llama2-7b-8l-h200-fp8-compile.trace.json"
want fp8 && run 150 llama2_7b_8l_bf16_compile python3 pytorch_llama_layers.py \
  --model-json "$zoo/llama2-7b.json" --layers 8 --seq 4096 --compile --seconds 30 --power
kill $smi
ls -la "$out"
