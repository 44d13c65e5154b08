#!/usr/bin/env bash
# Samples/s of the CPU executor for a CNN (resnet-tiny's layers on 64x64 images, global batch 8) on
# one rank, on 2 data-parallel ranks and on 2 ranks splitting every image (rows, then columns), next
# to the same network trained by PyTorch on one CPU thread (tests/pytorch/cnn_reference.py: its
# own conv2d, batch_norm and pools, same weights and samples, timed without the samples'
# generation), and the simulator's prediction of each layout: from this machine's cluster file
# (local-cpu) and from that file calibrated on the one-rank run's trace (`sextant calibrate`), so
# the parallel layouts are held out of the fit. The losses of every layout agree (tests:
# exec.mpi.*). Numbers, never pass/fail;
# record them in bench/results/cnn_executor.md with the date, the machine and the commit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
# PyTorch without an optimised BLAS (Debian's reference libblas) ran 9x slower on one machine
# and made the ratio meaningless: install what the comparison needs first (a no-op when present).
bash "$root/scripts/setup-bench.sh"
sextant="${1:-$root/build/release/cli/sextant}"
size="${SIZE:-64}"
steps=6
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$root/models/zoo/resnet-tiny.json" "$tmp/model.json" "$size" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["name"] = "resnet-tiny-%s" % sys.argv[3]
m["cnn"]["input"]["height"] = m["cnn"]["input"]["width"] = int(sys.argv[3])
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
mean_of() {  # mean step time of a JSON-lines log, two warm-up steps left out
  /usr/bin/python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$1')][2:]
print(sum(r['step_time_s'] for r in rows) / len(rows))"
}
predicted() {  # cluster, then the layout's flags
  local cluster="$1"
  shift
  "$sextant" simulate --model "$tmp/model.json" --cluster "$cluster" --dtype fp32 --json "$@" |
    /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['step_time_s'])"
}
echo "resnet-tiny layers on ${size}x${size} images, global batch 8, fp32, $(nproc) cores"
"$sextant" run --model "$tmp/model.json" --global-batch 8 --micro-batch 8 --steps "$steps" --quiet \
  --trace "$tmp/one_rank.json"
"$sextant" calibrate --cluster local-cpu --trace "$tmp/one_rank.json" --out "$tmp/calibrated.json" |
  sed -n '1,3p'
printf '%-22s %6s %10s %10s %14s %16s\n' layout ranks samples_s step_ms local-cpu_ms calibrated_ms
run_layout() {
  local name="$1" ranks="$2"
  shift 2
  "$sextant" run --model "$tmp/model.json" --np "$ranks" --global-batch 8 --steps "$steps" \
    --quiet --log-json "$tmp/log.jsonl" "$@"
  local t p c
  t=$(mean_of "$tmp/log.jsonl")
  p=$(predicted local-cpu --global-batch 8 "$@")
  c=$(predicted "$tmp/calibrated.json" --global-batch 8 "$@")
  printf '%-22s %6s %10.1f %10.1f %14.1f %9.1f (%+.0f%%)\n' "$name" "$ranks" "$(echo "8 / $t" | bc -l)" \
    "$(echo "1000 * $t" | bc -l)" "$(echo "1000 * $p" | bc -l)" "$(echo "1000 * $c" | bc -l)" \
    "$(echo "100 * ($c - $t) / $t" | bc -l)"
}
run_layout "1 rank (fitted)" 1 --micro-batch 8
run_layout "dp2" 2 --dp 2 --micro-batch 4
run_layout "spatial 2x1 (rows)" 2 --spatial 2x1 --micro-batch 8
run_layout "spatial 1x2 (columns)" 2 --spatial 1x2 --micro-batch 8
OMP_NUM_THREADS=1 /usr/bin/python3 "$root/tests/pytorch/cnn_reference.py" --model-json "$tmp/model.json" \
  --global-batch 8 --micro-batch 8 --steps "$steps" >"$tmp/torch.jsonl"
t=$(mean_of "$tmp/torch.jsonl")
printf '%-22s %6s %10.1f %10.1f\n' "PyTorch, 1 thread" 1 "$(echo "8 / $t" | bc -l)" \
  "$(echo "1000 * $t" | bc -l)"
