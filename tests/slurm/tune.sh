#!/usr/bin/env bash
# `sextant tune --slurm` on the one-node test Slurm (test_cluster.sh): trials are sbatch jobs of
# `sextant run` whose steps and traces come back to the tune's directory; it stops with a chosen
# plan written, and a second tune over the same directory resumes every recorded trial without
# submitting a job; a stack's trials (tune --to) are measured from the stack's log. Exit 77
# (skipped) as launch.sh.
set -uo pipefail
sextant="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../cli/probe_lib.sh"
source "$here/test_cluster.sh"
slurm_test_cluster_for_test

tune=(tune --model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 8 --candidates 4
  --steps 3 --slurm --time 5 --dir "$dir/tune" --core-check --quiet-wait 0 --json)
"$sextant" "${tune[@]}" --out "$dir/best.json" >"$dir/first.json" 2>"$dir/first.err" ||
  fail "tune: $(tail -5 "$dir/first.err")"
# The cores' check (--core-check: off by default under Slurm) ran inside each trial's job, before
# and after its ranks, keeping its reference in the tune's directory: no job of its own.
[ -s "$dir/tune/cores.json" ] ||
  fail "no core reference: $(tail -3 "$dir"/tune/*.cores.before.log 2>&1)"
ls "$dir"/tune/*.cores >/dev/null 2>&1 || fail "no trial's job checked the cores"
[ "$(ls "$dir"/tune/*.cores.after.log | wc -l)" -eq "$(ls "$dir"/tune/*.cores | wc -l)" ] ||
  fail "a trial's job did not check the cores after its ranks"
! ls "$dir"/tune/*probe* >/dev/null 2>&1 || fail "a probe job of its own ran"
python3 - "$dir/first.json" "$dir/best.json" <<'PY' || fail "the first tune's report"
import json, sys
r = json.load(open(sys.argv[1]))
best = json.load(open(sys.argv[2]))
assert len(r["candidates"]) == 4 and r["grid_trials"] == 4, r["candidates"]
# Each candidate at most once, and a surprising best once more (confirms: a second run of it).
names = [t["name"] for t in r["trials"]]
assert 1 <= len(set(names)) <= 4 and r["resumed_trials"] == 0, r["trials"]
assert all(names[:i].count(t["name"]) == (1 if t["confirms"] else 0)
           for i, t in enumerate(r["trials"])), r["trials"]
assert all(t["status"] == "ok" and t["measured_s"] > 0 for t in r["trials"]), r["trials"]
chosen = [c for c in r["candidates"] if c["name"] == r["chosen"]][0]
assert best == chosen["plan"], (best, chosen["plan"])
# The chosen plan is the fastest measured; nothing left could beat it by more than the noise.
measured = [c["measured_s"] for c in r["candidates"] if c["measured_s"] is not None]
assert chosen["measured_s"] == min(measured)
def doubt(c):
    e = r["layout_guess_doubt"] if c["layout_guess"] else r["new_layout_doubt"]
    return 0.9 if e is None else min(0.9, e)
left = [c for c in r["candidates"] if c["measured_s"] is None]
assert all(c["expected_s"] * (1 - doubt(c)) >= chosen["measured_s"] * (1 - 0.03) for c in left)
assert r["converged"] or "budget" in r["stopped"], r["stopped"]
# The grid runs each candidate once: the tune spends no more, but for the confirming reruns of a
# surprising best (all four measured and one confirmed spent the grid plus that rerun).
confirming = sum(t["device_hours"] for t in r["trials"] if t["confirms"])
assert 0 < r["device_hours"] <= r["grid_device_hours"] + confirming + 1e-12, r
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

# A stack's trials: torchrun is a stand-in that prints Megatron-LM's step lines at a time of its
# own, 400 ms per micro-batch sequence plus 300 ms per tensor-parallel rank past the first, so
# each trial's measured step is known; tune reads it from the job's log.
mkdir -p "$dir/bin"
cat >"$dir/bin/torchrun" <<'EOF'
#!/usr/bin/env bash
mb=$(sed -n 's/.*--micro-batch-size \([0-9]*\).*/\1/p' <<<"$*")
tp=$(sed -n 's/.*--tensor-model-parallel-size \([0-9]*\).*/\1/p' <<<"$*")
ms=$((400 * mb + 300 * (${tp:-1} - 1)))
for i in 1 2 3; do
  echo " [2026-11-29 10:00:0$i] iteration        $i/       3 | consumed samples:        $((8 * i)) | elapsed time per iteration (ms): $ms.0 | learning rate: 1.0E-04 | global batch size:     8 | lm loss: 5.0E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |"
done
EOF
chmod +x "$dir/bin/torchrun"
PATH="$dir/bin:$PATH" MEGATRON_LM=/opt/megatron "$sextant" tune --model gpt-tiny \
  --cluster local-cpu --gpus 2 --global-batch 8 --candidates 4 --steps 3 --stack megatron-core \
  --dtype fp32 --attention flash2 \
  --slurm --to megatron-core --dir "$dir/stack" --json >"$dir/stack.json" 2>"$dir/stack.err" ||
  fail "tune --to megatron-core: $(tail -5 "$dir/stack.err")"
python3 - "$dir/stack.json" <<'PY' || fail "the stack tune's report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["trials"], r
for t in r["trials"]:
    c = [c for c in r["candidates"] if c["name"] == t["name"]][0]["plan"]
    want = 0.4 * c["micro_batch"] + 0.3 * (c["tp"] - 1)  # the stand-in's step, in seconds
    assert t["status"] == "ok" and abs(t["measured_s"] - want) < 1e-9, (t, want)
best = min(t["measured_s"] for t in r["trials"])
assert [c for c in r["candidates"] if c["name"] == r["chosen"]][0]["measured_s"] == best, r
# Nothing is fitted to a log, so no run is judged surprising against a fit: none runs twice.
assert not any(t["confirms"] for t in r["trials"]), r["trials"]
PY

expect_error "--time" "$sextant" "${tune[@]}" --time "1 day"
expect_error "--partition" "$sextant" tune --model gpt-tiny --cluster local-cpu --gpus 2 \
  --global-batch 8 --partition debug

[ "$failures" -eq 0 ] && echo "slurm tune: all checks passed"
exit "$failures"
