#!/usr/bin/env bash
# `sextant tune --slurm` on the one-node test Slurm (test_cluster.sh): trials are sbatch jobs of
# `sextant run` whose steps and traces come back to the tune's directory; it stops with a chosen
# plan written, and a second tune over the same directory resumes every recorded trial without
# submitting a job. Exit 77 (skipped) as launch.sh.
set -uo pipefail
sextant="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../cli/probe_lib.sh"
source "$here/test_cluster.sh"
slurm_test_cluster_for_test

tune=(tune --model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 8 --candidates 4
  --steps 3 --slurm --time 5 --dir "$dir/tune" --json)
"$sextant" "${tune[@]}" --out "$dir/best.json" >"$dir/first.json" 2>"$dir/first.err" ||
  fail "tune: $(tail -5 "$dir/first.err")"
python3 - "$dir/first.json" "$dir/best.json" <<'PY' || fail "the first tune's report"
import json, sys
r = json.load(open(sys.argv[1]))
best = json.load(open(sys.argv[2]))
assert len(r["candidates"]) == 4 and r["grid_trials"] == 4, r["candidates"]
assert 1 <= len(r["trials"]) <= 4 and r["resumed_trials"] == 0, r["trials"]
assert all(t["status"] == "ok" and t["measured_s"] > 0 for t in r["trials"]), r["trials"]
chosen = [c for c in r["candidates"] if c["name"] == r["chosen"]][0]
assert best == chosen["plan"], (best, chosen["plan"])
# The chosen plan is the fastest measured; nothing left could beat it by more than the noise.
measured = [c["measured_s"] for c in r["candidates"] if c["measured_s"] is not None]
assert chosen["measured_s"] == min(measured)
def doubt(c):
    e = r["layout_guess_error"] if c["layout_guess"] else r["new_layout_error"]
    return 0.9 if e is None else min(0.9, e)
left = [c for c in r["candidates"] if c["measured_s"] is None]
assert all(c["expected_s"] * (1 - doubt(c)) >= chosen["measured_s"] * (1 - 0.03) for c in left)
assert r["converged"] or "budget" in r["stopped"], r["stopped"]
assert 0 < r["device_hours"] <= r["grid_device_hours"], r
PY
jobs_before=$(ls "$dir/tune"/*.sbatch | wc -l)
"$sextant" "${tune[@]}" >"$dir/second.json" 2>"$dir/second.err" ||
  fail "resumed tune: $(tail -5 "$dir/second.err")"
python3 - "$dir/first.json" "$dir/second.json" <<'PY' || fail "the resumed tune's report"
import json, sys
first, second = (json.load(open(f)) for f in sys.argv[1:3])
assert second["resumed_trials"] == len(first["trials"]) == len(second["trials"]), second
assert second["chosen"] == first["chosen"], (first["chosen"], second["chosen"])
PY
[ "$(ls "$dir/tune"/*.sbatch | wc -l)" -eq "$jobs_before" ] || fail "the resumed tune submitted jobs"

expect_error "--time" "$sextant" "${tune[@]}" --time "1 day"
expect_error "--partition" "$sextant" tune --model gpt-tiny --cluster local-cpu --gpus 2 \
  --global-batch 8 --partition debug

[ "$failures" -eq 0 ] && echo "slurm tune: all checks passed"
exit "$failures"
