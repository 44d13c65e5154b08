#!/usr/bin/env bash
# The collective algorithm the cost model picks per size and network (issue 61): NCCL's tuner
# model inside a DGX A100 and across 8 of them, the cheapest formula under an unfitted MPI, and
# this machine's CPU ranks fitted from the recorded 2-rank collective bench
# (traces/samples/bench-comm-2ranks.json), with the named algorithm `sextant plan` would keep
# there. Numbers, never pass/fail; record with bench/run.sh collective_choice.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sextant="${1:-$root/build/release/cli/sextant}"
bench="${2:-$root/build/release/bench/collective_choice_bench}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/mpi-a100.json" "$root/clusters/dgx-a100.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
c["name"] = "dgx-a100-mpi"
c["network"]["library"] = "mpi"
json.dump(c, open(sys.argv[1], "w"))
PY
"$sextant" calibrate --cluster local-cpu --trace "$root/traces/samples/bench-comm-2ranks.json" \
  --out "$tmp/cpu-fitted.json" >/dev/null
python3 - "$tmp/cpu-fitted.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["devices_per_node"] = 8
print("fits:", ", ".join(f'{f["collective"]} a={f["alpha_us"]:.2f} us b={1e3 * f["beta_us_per_byte"]:.3f} ns/B'
                         for f in c.get("collective_fits", [])))
json.dump(c, open(sys.argv[1], "w"))
PY
"$bench" dgx-a100:8:1 dgx-a100:64:8 "$tmp/mpi-a100.json:64:8" "$tmp/cpu-fitted.json:8:1" \
  "$tmp/cpu-fitted.json:2:1"
