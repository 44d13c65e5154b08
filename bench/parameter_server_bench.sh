#!/usr/bin/env bash
# Parameter servers with bounded staleness (Li et al., OSDI'14; issue 61) against the all-reduce:
# (a) what the simulator predicts for GPT-2 350M, 16 sequences of 1024 a replica, micro-batch 4,
# on dgx-a100 (NVLink and InfiniBand) and on the same nodes with 10 GbE-class links, dp 16 and 64:
# DDP's bucketed all-reduce, synchronous servers, and workers 1 and 4 steps ahead; (b) what
# staleness costs the model: gpt-tiny on 2 CPU ranks, 40 steps, the mean loss of the last 5, for
# each bound (the run equals one process reading every layer that stale). Numbers, never
# pass/fail; record with bench/run.sh parameter_server.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$(dirname "$0")/slow_links_cluster.py" "$tmp/slow.json" \
  "$(dirname "$0")/../clusters/dgx-a100.json" 1.25 dgx-a100-10gbe

step_ms() {
  "$sextant" simulate --model gpt2-350m --cluster "$1" --dp "$2" --global-batch $((16 * $2)) \
    --micro-batch 4 --stack sextant "${@:3}" --json |
    python3 -c 'import json,sys; r = json.load(sys.stdin)
print("%.1f/%.1f" % (1000 * r["step_time_s"], r["memory"]["peak_bytes"] / 2**30))'
}
echo "predicted: gpt2-350m dp N, mb4, 16 sequences a replica (ms a step / peak GiB)"
printf '%-16s %16s %16s %16s %16s\n' cluster all-reduce servers-s0 servers-s1 servers-s4
for cluster in dgx-a100 "$tmp/slow.json"; do
  for dp in 16 64; do
    label="$(basename "$cluster" .json) dp$dp"
    printf '%-22s %12s %16s %16s %16s\n' "$label" "$(step_ms "$cluster" "$dp")" \
      "$(step_ms "$cluster" "$dp" --parameter-server 0)" \
      "$(step_ms "$cluster" "$dp" --parameter-server 1)" \
      "$(step_ms "$cluster" "$dp" --parameter-server 4)"
  done
done

echo
echo "what staleness costs: gpt-tiny dp2 on 2 CPU ranks, global batch 8, 40 steps, --clip 0"
printf '%-12s %12s %12s\n' bound first-loss last-5-mean
for bound in none 0 1 2 4 8; do
  flags=()
  if [[ "$bound" != none ]]; then flags=(--parameter-server "$bound"); fi
  "$sextant" run --model gpt-tiny --np 2 --dp 2 --global-batch 8 --steps 40 --clip 0 \
    "${flags[@]}" >"$tmp/log" 2>&1
  python3 - "$tmp/log" "$bound" <<'PY'
import re, sys
losses = [float(m.group(1)) for m in re.finditer(r"loss ([0-9.]+)", open(sys.argv[1]).read())]
print("%-12s %12.4f %12.4f" % (sys.argv[2], losses[0], sum(losses[-5:]) / 5))
PY
done
