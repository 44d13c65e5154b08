#!/usr/bin/env bash
# `sextant tune` against a grid (issue 58): gpt-tiny on this machine's 2 CPU ranks, 12 candidates,
# every trial a job of the one-node test Slurm (tests/slurm/test_cluster.sh). The grid runs every
# candidate in 5 interleaved rounds (`tune --grid 5`): each candidate's time is the median round and
# its noise the rounds' half-range (3 rounds let two slow ones make an outlier the median). Then three tunes from scratch. A tune meets the bar when its
# chosen plan's grid time is within the two plans' grid noise (plus the 2% the loop resolves) of
# the grid's best, with at most a third of the grid's trials.
# Record with: bench/run.sh tune_local bench/tune_bench.sh (with the core check:
# bench/run.sh tune_core_check env TUNE_FLAGS="--core-check --quiet-wait 20" bench/tune_bench.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sextant="$root/build/release/cli/sextant"
work=$(mktemp -d)
source "$root/tests/slurm/test_cluster.sh"
# TUNE_KEEP=DIR: the grid's and tunes' JSON reports are copied there.
trap 'slurm_test_cluster_stop "$work/slurm"; [ -n "${TUNE_KEEP:-}" ] && mkdir -p "$TUNE_KEEP" &&
  cp "$work"/*.json "$TUNE_KEEP"/; rm -rf "$work"' EXIT
slurm_test_cluster_start "$work/slurm"
args=(--model gpt-tiny --cluster local-cpu --gpus 2 --global-batch 16 --candidates 12 --steps 8
  --noise 0.05 --slurm --time 10 --json)
# TUNE_FLAGS: more tune flags for every run, e.g. "--core-check --quiet-wait 20" (the cores'
# check inside each trial's job).
read -r -a extra <<<"${TUNE_FLAGS:-}"
args+=("${extra[@]}")
"$sextant" tune "${args[@]}" --grid 5 --dir "$work/grid" >"$work/grid.json" 2>/dev/null
for i in 1 2 3; do
  "$sextant" tune "${args[@]}" --dir "$work/tune$i" >"$work/tune$i.json" 2>/dev/null
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
grid = {g["name"]: g for g in json.load(open(f"{work}/grid.json"))["grid"]}
best = min(grid.values(), key=lambda g: g["measured_s"])
print(f"grid: 12 candidates x 5 rounds; measured best {best['name']} "
      f"{1e3*best['measured_s']:.1f} ± {1e3*best['noise_s']:.1f} ms")
for g in sorted(grid.values(), key=lambda g: g["measured_s"]):
    print(f"  {g['name']:<34} {1e3*g['measured_s']:7.1f} ± {1e3*g['noise_s']:4.1f} ms"
          f"  (median of {len(g['kept_s'])} runs, {g['quiet_runs']} quiet)")
met = 0
for i in (1, 2, 3):
    r = json.load(open(f"{work}/tune{i}.json"))
    c = grid[r["chosen"]]
    gap = c["measured_s"] / best["measured_s"] - 1
    within = c["measured_s"] - best["measured_s"] <= c["noise_s"] + best["noise_s"] + 0.02 * best["measured_s"]
    ok = within and len(r["trials"]) <= 4
    met += ok
    tried = ', '.join(f"{t['name']} {1e3*t['measured_s']:.1f}" if t['measured_s'] else t['name']
                      for t in r['trials'])
    print(f"tune {i}: {len(r['trials'])} trials ({tried} ms); "
          f"chose {r['chosen']}: grid {1e3*c['measured_s']:.1f} ms, {100*gap:+.1f}% of the best "
          f"({'within' if within else 'beyond'} the noise); {r['device_hours']:.4f} device-hours "
          f"against a grid's ~{r['grid_device_hours']:.4f}: {'met' if ok else 'missed'}")
print(f"{met} of 3 tunes met the bar")
PY
