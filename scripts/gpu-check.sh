#!/usr/bin/env bash
# Everything that needs a GPU, in one command, for the GPU machine (../shared/DEVICE.md): builds
# the CUDA backend for sm_90, then
#   1. every CUDA kernel against the CPU backend (exec_test CudaVsCpu.*),
#   2. the layout-equivalence suite on the CUDA backend with 2 and 4 ranks sharing the GPU,
#   3. `sextant run --backend cuda --precision fp32` against the PyTorch reference on the GPU
#      (gpt-tiny, and three steps of gpt2-124m),
#   4. bench compute on the GPU (bf16 and fp32 GEMMs, memory-bound ops) with traces,
#   5. bench comm over NCCL at world size 1 (the plumbing), and GPT-2 124M (micro-batch 32 x 1024)
#      tokens/s: Sextant (bf16 GEMMs) next to PyTorch (bf16 autocast; explicit attention, fused
#      SDPA, and torch.compile),
#   6. calibration of the h100-1gpu cluster from the measured traces, and the prediction error,
#   7. the calibration loop on the GPU (scripts/calibrate-local.sh --gpu: fit, held-out plans).
# Logs and result files go to $OUT (the device tool's output folder) or ./out/gpu.
# Usage (build machine): scripts/device-deps.sh, then run `scripts/gpu-check.sh` through the
# device tool with carry [".device"].
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/out/gpu}"
mkdir -p "$out"
cd "$root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe)
status=0
step() { echo; echo "== $*" | tee -a "$out/summary.txt"; }
# On the GPU machine a skipped GPU test is a failure: it means the GPU was not seen.
no_skips() { if grep -q "SKIPPED \]" "$1"; then echo "   tests skipped: no GPU seen" | tee -a "$out/summary.txt"; return 1; fi; }
record() { if [[ $1 -ne 0 ]]; then status=1; echo "   FAILED ($1)" | tee -a "$out/summary.txt"; else echo "   ok" | tee -a "$out/summary.txt"; fi; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; git rev-parse HEAD 2>/dev/null; date -u; } \
  >"$out/machine.txt" 2>&1

step "build (CUDA, sm_90)"
prefix=()
[[ -d .device/cli11/usr ]] && prefix=(-DCMAKE_PREFIX_PATH="$root/.device/cli11/usr")
cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEXTANT_ENABLE_CUDA=REQUIRE \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DSEXTANT_BUILD_BENCH=OFF "${prefix[@]}" >"$out/configure.log" 2>&1 &&
  cmake --build build/cuda -j "$(nproc)" --target sextant exec_test exec_mpi_test >"$out/build.log" 2>&1
rc=$?; record $rc
if [[ $rc -ne 0 ]]; then tail -40 "$out/configure.log" "$out/build.log"; exit 1; fi
sextant=build/cuda/cli/sextant

step "CUDA kernels vs CPU backend"
build/cuda/tests/exec_test --gtest_filter='CudaVsCpu.*:CudaAvailability.*' >"$out/kernels.txt" 2>&1 &&
  no_skips "$out/kernels.txt"
record $?; tail -5 "$out/kernels.txt"

for np in 2 4; do
  step "layout equivalence on the CUDA backend, $np ranks"
  SEXTANT_TEST_BACKEND=cuda "${mpirun[@]}" -np $np build/cuda/tests/exec_mpi_test \
    --gtest_filter='LayoutTest.*' >"$out/layouts_np$np.txt" 2>&1 && no_skips "$out/layouts_np$np.txt"
  record $?; tail -3 "$out/layouts_np$np.txt"
done

for m in gpt-tiny gpt2-124m; do
  step "sextant run --backend cuda --precision fp32 vs the PyTorch reference on the GPU: $m"
  SEXTANT_PYTHON=python3 tests/cli/pytorch_reference.sh "$sextant" "$root" cuda $m \
    >"$out/pytorch_reference_$m.txt" 2>&1
  record $?; cat "$out/pytorch_reference_$m.txt"
done

for p in bf16 fp32; do
  step "bench compute --backend cuda --precision $p"
  "$sextant" bench compute --backend cuda --precision $p --trace "$out/compute_$p.trace.json" \
    >"$out/compute_$p.txt" 2>&1
  record $?; cat "$out/compute_$p.txt"
done

step "bench comm --backend nccl at world size 1 (plumbing)"
"$sextant" bench comm --backend cuda --comm nccl --sizes 4K,1M,64M --nccl-tests "$out/nccl_ws1_" \
  >"$out/comm_nccl_ws1.txt" 2>&1
record $?; cat "$out/comm_nccl_ws1.txt"

step "GPT-2 124M throughput, micro-batch 32 x 1024 tokens, bf16"
model=models/zoo/gpt2-124m.json
"$sextant" run --model gpt2-124m --global-batch 32 --micro-batch 32 --steps 13 --backend cuda \
  --precision bf16 --quiet --log-json "$out/sextant_gpt2.jsonl" --trace "$out/sextant_gpt2.trace.json" \
  >"$out/sextant_gpt2.txt" 2>&1
record $?
python3 - "$out/sextant_gpt2.jsonl" <<'PY' | tee -a "$out/throughput.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
print(json.dumps({"impl": "sextant cuda bf16 (explicit attention)",
                  "tokens_per_s": sum(r["tokens_per_s"] for r in rows) / len(rows),
                  "step_time_s": sum(r["step_time_s"] for r in rows) / len(rows)}))
PY
for variant in "--attention explicit" "--attention sdpa" "--attention sdpa --compile"; do
  # shellcheck disable=SC2086
  python3 bench/pytorch_gpt_cuda.py --model-json $model --micro-batch 32 --steps 10 --precision bf16 $variant \
    2>>"$out/pytorch_gpt2.err" | tee -a "$out/throughput.txt"
done

step "calibrate h100-1gpu from the measured traces; predicted vs measured"
# The executor's bf16 mode runs bf16 GEMMs on fp32 tensors: GEMM rates fit as bf16.
"$sextant" calibrate --cluster h100-1gpu --trace "$out/sextant_gpt2.trace.json" \
  --trace "$out/compute_bf16.trace.json" --dtype bf16 --out "$out/h100-1gpu.calibrated.json" \
  >"$out/calibrate.txt" 2>&1
record $?; tail -20 "$out/calibrate.txt"
for c in h100-1gpu "$out/h100-1gpu.calibrated.json"; do
  tag=$([[ "$c" == h100-1gpu ]] && echo default || echo calibrated)
  "$sextant" simulate --model gpt2-124m --cluster "$c" --gpus 1 --global-batch 32 --micro-batch 32 \
    --dtype bf16 --trace "$out/gpt2.$tag.predicted.json" --json >"$out/gpt2.$tag.report.json" 2>&1 &&
    "$sextant" compare --measured "$out/sextant_gpt2.trace.json" --predicted "$out/gpt2.$tag.predicted.json" \
      >"$out/compare.$tag.txt" 2>&1
  record $?; echo "-- $tag cluster"; tail -25 "$out/compare.$tag.txt"
done

step "the calibration loop on the GPU: scripts/calibrate-local.sh --gpu"
SEXTANT="$root/$sextant" scripts/calibrate-local.sh --gpu --out "$out/calibrate-gpu" \
  >"$out/calibrate_loop.txt" 2>&1
record $?; tail -15 "$out/calibrate_loop.txt"

echo; cat "$out/summary.txt"
exit $status
