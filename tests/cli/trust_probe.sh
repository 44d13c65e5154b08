#!/usr/bin/env bash
# The trust probe of issue 59, kept: what sits past the readers. Calibration inputs that are not
# measurements (exit 2 naming the line or event, or left out with a warning), sizes past any real
# input, a gzip bomb and a two-member gzip, and output that fits 100 columns (plan, simulate,
# scale, run and every --help). tests/cli/bad_inputs.sh holds the reader and flag cases,
# tests/cli/run_failures.sh the faults on MPI ranks.
set -u
sextant="$1"
source_dir="$2"
source "$(dirname "${BASH_SOURCE[0]}")/probe_lib.sh"

# -- Calibration: nccl-tests rows that are not measurements are refused by line.
header='#  Rank  0 Group  0 Pid 1 on h device 0
#  Rank  1 Group  0 Pid 2 on h device 1
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong'
row() { echo "  $1  256 float sum -1  $2 0.2 0.3  $3  5.1 0.2 0.3  0"; }
calibrate_nccl=("$sextant" calibrate --cluster local-cpu --out "$dir/c.json" --nccl-tests)
{ echo "$header"; row 1024 nan 0; row 4096 9.0 0; } >"$dir/nan_all_reduce_perf.txt"
expect_error "line 4 = nan: expected the time in microseconds" "${calibrate_nccl[@]}" "$dir/nan_all_reduce_perf.txt"
{ echo "$header"; row 1024 5.0 3; row 4096 9.0 0; } >"$dir/wrong_all_reduce_perf.txt"
expect_error "line 4 = 3: #wrong must be 0" "${calibrate_nccl[@]}" "$dir/wrong_all_reduce_perf.txt"
{ echo "$header"; row 1024 5.0 0; row 4096 9.0 0; row 4096 90.0 0; } >"$dir/dup_all_reduce_perf.txt"
expect_error "line 6 = 4096: sizes must grow down the table" "${calibrate_nccl[@]}" "$dir/dup_all_reduce_perf.txt"
{ echo "$header"; row 1024 0 0; row 4096 9.0 0; } >"$dir/zero_all_reduce_perf.txt"
expect_error "line 4 = 0: expected the time" "${calibrate_nccl[@]}" "$dir/zero_all_reduce_perf.txt"
# One row: alpha and beta cannot be told apart; said, and the file keeps its own.
{ echo "$header"; row 1024 5.0 0; } >"$dir/one_all_reduce_perf.txt"
out=$("${calibrate_nccl[@]}" "$dir/one_all_reduce_perf.txt" 2>&1)
grep -q "measured at one size only" <<<"$out" || fail "one nccl-tests row: $out"
# A good file writes a cluster that reads back.
"${calibrate_nccl[@]}" "$source_dir/traces/samples/mpi-2ranks-all_reduce_perf.txt" >/dev/null 2>&1 &&
  "$sextant" clusters show "$dir/c.json" >/dev/null 2>&1 || fail "calibrated cluster does not read back"

# -- Calibration: a CPU-only profile for a GPU cluster is refused; damaged events by pointer.
expect_error "its ops ran on the CPU (the profile has no GPU kernels) and h100-1gpu describes GPUs" \
  "$sextant" calibrate --cluster h100-1gpu --out "$dir/c.json" \
  --kineto "$source_dir/traces/samples/pytorch-cpu-kineto.json"
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
ok = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 10,
      "args": {"Input Dims": [[64, 64], [64, 64]], "External id": 1}}
kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 2, "dur": 5, "args": {"External id": 1}}
for name, patch in {"negts": {"ts": -4}, "bigdur": {"dur": 1e300}, "strdur": {"dur": "9"}}.items():
    json.dump({"traceEvents": [dict(kernel, **patch), ok]}, open(f"{d}/{name}.json", "w"))
PY
for bad in negts bigdur strdur; do
  expect_error "$dir/$bad.json: /traceEvents/0/" "$sextant" calibrate --cluster h100-1gpu \
    --out "$dir/c.json" --kineto "$dir/$bad.json"
done

# -- Sizes past any real input, before any work.
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def cnn(inp, layer):
    return {"schema": "sextant.model/1", "name": "c", "kind": "cnn",
            "cnn": {"input": inp, "layers": [layer, {"type": "fc", "out_features": 2, "bias": True}]}}
json.dump(cnn({"channels": 3, "height": 2**32, "width": 8},
              {"type": "conv", "out_channels": 4, "kernel": 3, "bias": False}), open(f"{d}/wide.json", "w"))
json.dump(cnn({"channels": 3, "height": 1, "width": 1}, {"type": "max_pool", "kernel": 2}),
          open(f"{d}/pool.json", "w"))
PY
expect_error "/cnn/input/height = 4294967296: must be in [1, 65536]" "$sextant" models show "$dir/wide.json"
expect_error "/cnn/layers/0: the feature map shrinks to 0x0" "$sextant" models show "$dir/pool.json"
# A gzip bomb (64 MiB of spaces, ~1000x) is refused at 100x; a file of two members reads whole.
python3 -c 'import gzip, sys; open(sys.argv[1], "wb").write(gzip.compress(b" " * (64 << 20)))' "$dir/bomb.json.gz"
expect_error "decompresses to more than 100x" "$sextant" compare --measured "$dir/bomb.json.gz" \
  --predicted "$dir/bomb.json.gz"
"$sextant" simulate --model gpt-tiny --cluster local-cpu --gpus 1 --global-batch 2 \
  --trace "$dir/t.json" >/dev/null 2>&1 || fail "simulate --trace"
python3 - "$dir" <<'PY'
import gzip, sys
d = sys.argv[1]
text = open(f"{d}/t.json", "rb").read()
half = len(text) // 2
open(f"{d}/two.json.gz", "wb").write(gzip.compress(text[:half]) + gzip.compress(text[half:]))
PY
"$sextant" compare --measured "$dir/two.json.gz" --predicted "$dir/t.json" >/dev/null 2>&1 ||
  fail "a two-member gzip trace does not read"

# -- Output that fits 100 columns.
too_wide() {  # too_wide <label> <command...>: fails on any stdout line past 100 columns
  local label="$1"
  shift
  local widest
  widest=$("$@" 2>/dev/null | awk '{ if (length($0) > w) w = length($0) } END { print w + 0 }')
  [ "$widest" -le 100 ] || fail "$label: a line of $widest columns"
}
too_wide "--help" "$sextant" --help
for c in models clusters stacks simulate plan scale run bench validate calibrate compare loop; do
  too_wide "$c --help" "$sextant" "$c" --help
done
too_wide "plan" "$sextant" plan --model gpt2-350m --cluster dgx-a100 --gpus 16 --global-batch 64 \
  --top 5 --explain
too_wide "simulate" "$sextant" simulate --model llama3-8b --cluster dgx-h100 --gpus 8 \
  --global-batch 64 --explain-memory
too_wide "scale" "$sextant" scale --model gpt2-350m --cluster dgx-a100 --gpus 8,16 \
  --global-batch 64 --tokens 3e10 --price 2.5 --leaders 4
too_wide "run" "$sextant" run --model gpt-tiny --global-batch 4 --steps 2
too_wide "lists" "$sextant" clusters list
# --wide leaves it unwrapped: the same table, longer lines.
widest=$("$sextant" stacks list --wide | awk '{ if (length($0) > w) w = length($0) } END { print w }')
[ "$widest" -gt 100 ] || fail "--wide still wraps (widest $widest)"

# -- The binary names the commit it was built from (written at every build, not at configure).
if head=$(git -C "$source_dir" rev-parse --short=12 HEAD 2>/dev/null); then
  version=$("$sextant" --version 2>&1)
  grep -q "($head" <<<"$version" || fail "--version names another commit than HEAD $head: $version"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "trust probe: every case handled"
