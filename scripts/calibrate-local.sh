#!/usr/bin/env bash
# The loop on this machine: measure (bench comm, training runs of a few plans of gpt-tiny), fit the
# local-cpu cluster to the measurements, then predict plans with the calibrated cluster and run
# them for real -- including plans not used for the fit -- and report predicted against measured.
#
# Every plan is measured in --repeats rounds, interleaved (round 1 runs every plan once, then round
# 2, ...), so that a slow spell of the machine touches all plans alike, and each run between two
# checks that every core runs at its undisturbed speed (below). A run's time is its mean step (two
# warm-up steps left out); a plan's time is the median of its undisturbed runs, and the fit takes
# that median run of each fit plan. (The fastest run, used while disturbed runs could not be told
# apart, picks lucky outliers instead once they can: dp1.mb8 measured 135.9 ms in one of three runs
# against 144-152 in the others.) The report gives the half-range of the runs as the plan's noise.
# `sextant calibrate` checks the fit on the fitted runs' own steps and refuses a fit that predicts
# them worse (the loop then stops: nothing it predicted after would mean anything).
#
# Usage: scripts/calibrate-local.sh [--json] [--steps N] [--repeats R] [--force] [--out DIR] [--gpu] [--refit]
#                                   [--quiet-wait S]
#   --force  go on with a fit that predicts its own plans worse (sextant calibrate --force); the
#            report then says "fit_worse": true. For checks of the loop's plumbing (ctest).
#   --json   end with one JSON object: plans (name, predicted_s, measured_s, noise, heldout, ...),
#            heldout_mean_abs_error, heldout_max_abs_error (fractions), kendall_tau, regret,
#            fitted_step_errors
#   --quiet-wait S  seconds the loop may wait in all for undisturbed cores (default 120; below)
#   --refit  measure nothing: fit and predict again from the runs already in --out (the same
#            --repeats), e.g. after a change to the calibration
#   --gpu    the same loop on one GPU for the h100-1gpu cluster ($SEXTANT_GPU_CLUSTER names another): GPT-2 models and micro-batch
#            sizes with the cuda backend (bf16 mixed precision), fitted from `bench compute --backend cuda`
#            and two runs. (Several ranks sharing the GPU are not a cluster the simulator can
#            describe, so the GPU loop is single-rank.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
json=0
gpu=0
steps=8
repeats=3
force=()
refit=0
quiet_wait=120
out="$root/out/calibrate-local"
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --steps) steps="$2"; shift ;;
    --repeats) repeats="$2"; shift ;;
    --force) force=(--force) ;;
    --out) out="$2"; shift ;;
    --gpu) gpu=1 ;;
    --refit) refit=1 ;;
    --quiet-wait) quiet_wait="$2"; shift ;;
    *) echo "usage: $0 [--json] [--steps N] [--repeats R] [--force] [--out DIR] [--gpu] [--refit] [--quiet-wait S]" >&2; exit 2 ;;
  esac
  shift
done
source scripts/env.sh
if [ "$gpu" -eq 1 ]; then
  sextant="${SEXTANT:-$root/build/cuda/cli/sextant}"  # scripts/gpu-check.sh builds it
else
  scripts/build.sh >/dev/null
  sextant="$root/build/release/cli/sextant"
fi
mkdir -p "$out"
say() { [ "$json" -eq 1 ] && echo "$@" >&2 || echo "$@"; }

# name | ranks | model | plan flags (with the global batch) | used for the fit?
if [ "$gpu" -eq 1 ]; then
  cluster="${SEXTANT_GPU_CLUSTER:-h100-1gpu}"
  run_flags=(--backend cuda --precision bf16)
  # The executor runs its own kernels: predict them (a GPU cluster's default is megatron-core).
  sim_flags=(--dtype bf16 --stack sextant)
  calibrate_flags=(--dtype bf16)
  plans=(
    "gpt2-124m.mb8|1|gpt2-124m|--global-batch 16 --micro-batch 8|fit"
    "gpt2-350m.mb4|1|gpt2-350m|--global-batch 8 --micro-batch 4|fit"
    "gpt2-124m.mb4|1|gpt2-124m|--global-batch 8 --micro-batch 4|heldout"
    "gpt2-124m.mb16|1|gpt2-124m|--global-batch 16 --micro-batch 16|heldout"
    "gpt2-124m.mb8.rc-full|1|gpt2-124m|--global-batch 16 --micro-batch 8 --recompute full|heldout"
    "gpt2-350m.mb8|1|gpt2-350m|--global-batch 8 --micro-batch 8|heldout"
    "gpt2-774m.mb4|1|gpt2-774m|--global-batch 8 --micro-batch 4|heldout"
  )
  compare_plan=gpt2-350m.mb8
else
  cluster=local-cpu
  run_flags=()
  sim_flags=(--stack sextant)
  calibrate_flags=()
  # The fit plans span what is predicted: one and two ranks, each layout family (dp, tp, pp) and
  # micro-batches 2, 4 and 8.
  plans=(
    "dp1.mb4|1|gpt-tiny|--global-batch 16 --dp 1 --micro-batch 4|fit"
    "dp2.mb8|2|gpt-tiny|--global-batch 16 --dp 2 --micro-batch 8|fit"
    "tp2.mb2|2|gpt-tiny|--global-batch 16 --tp 2 --micro-batch 2|fit"
    "pp2.1f1b.mb2|2|gpt-tiny|--global-batch 16 --pp 2 --micro-batch 2|fit"
    "dp1.mb8|1|gpt-tiny|--global-batch 16 --dp 1 --micro-batch 8|heldout"
    "dp1.mb2|1|gpt-tiny|--global-batch 16 --dp 1 --micro-batch 2|heldout"
    "dp2.mb2|2|gpt-tiny|--global-batch 16 --dp 2 --micro-batch 2|heldout"
    "dp2.mb4|2|gpt-tiny|--global-batch 16 --dp 2 --micro-batch 4|heldout"
    "tp2.mb4|2|gpt-tiny|--global-batch 16 --tp 2 --micro-batch 4|heldout"
    "tp2.sp.mb4|2|gpt-tiny|--global-batch 16 --tp 2 --sp --micro-batch 4|heldout"
    "pp2.gpipe.mb4|2|gpt-tiny|--global-batch 16 --pp 2 --schedule gpipe --micro-batch 4|heldout"
    "dp2.z1.mb8|2|gpt-tiny|--global-batch 16 --dp 2 --zero 1 --micro-batch 8|heldout"
  )
  compare_plan=pp2.gpipe.mb4
fi

# Undisturbed runs only, where the machine allows: `sextant bench cores` times each core alone
# before and after every run against the fastest times seen (out/cores.json); a run with a core
# more than 8% slow on either side is marked disturbed (NAME.rN.disturbed says how) and run again,
# after waiting for the machine to be quiet, at most twice. Waiting stops once --quiet-wait
# seconds have been spent in all; runs are then taken as they come, still marked. (On the shared
# CI VM one core at a time runs 10-100% slow for tens of seconds; a two-rank run then is as slow as
# that core and the loop fitted and judged it as the machine.)
waited=0
probe_cores() { "$sextant" bench cores --repeats 2 --reference "$out/cores.json" >>"$out/cores.log" 2>&1; }
wait_for_quiet() {  # 0 once the cores are quiet, 1 if the waiting budget ran out first
  until probe_cores; do
    [ "$waited" -ge "$quiet_wait" ] && return 1
    sleep 1
    waited=$((waited + 1))
  done
}
measure() {  # measure <name> <round> <ranks> <model> <flags...>: one run, its trace and steps
  local name="$1" round="$2" ranks="$3" model="$4" try quiet_before
  shift 4
  for try in 1 2 3; do
    quiet_before=1
    wait_for_quiet || quiet_before=0
    "$sextant" run --model "$model" --np "$ranks" "$@" "${run_flags[@]}" --steps "$steps" \
      --quiet --log-json "$out/$name.r$round.steps.jsonl" --trace "$out/$name.r$round.measured.json" >/dev/null
    if [ "$quiet_before" -eq 1 ] && probe_cores; then
      rm -f "$out/$name.r$round.disturbed"
      return
    fi
    tail -n 1 "$out/cores.log" >"$out/$name.r$round.disturbed"
    say "   $name round $round (try $try): $(cat "$out/$name.r$round.disturbed")"
    if [ "$waited" -ge "$quiet_wait" ]; then break; fi
  done
  return 0
}

if [ "$refit" -eq 1 ]; then
  for p in "${plans[@]}"; do
    IFS='|' read -r name ranks model flags role <<<"$p"
    for round in $(seq 1 "$repeats"); do
      [ -f "$out/$name.r$round.measured.json" ] ||
        { echo "--refit: $out/$name.r$round.measured.json is missing (measure first, same --repeats)" >&2; exit 2; }
    done
  done
  say "== refitting the runs in $out"
else
  rm -f "$out/cores.json" "$out/cores.log" "$out"/*.disturbed
  if [ "$gpu" -eq 1 ]; then
    say "== measuring GEMMs and memory-bound ops (sextant bench compute --backend cuda)"
    "$sextant" bench compute --backend cuda --precision bf16 --trace "$out/bench.json" >/dev/null
  else
    say "== measuring collectives (sextant bench comm, 2 ranks)"
    "$sextant" bench comm --np 2 --sizes 4K,64K,512K,1M,2M,4M --iterations 10 --trace "$out/bench.json" >/dev/null
  fi

  # The machine's first runs after a build or an idle spell are slower (caches, clocks): one
  # discarded run before the first round.
  say "== warming up (one run, discarded)"
  IFS='|' read -r name ranks model flags role <<<"${plans[0]}"
  measure warmup 0 "$ranks" "$model" $flags
  for round in $(seq 1 "$repeats"); do
    say "== round $round of $repeats: measuring ${#plans[@]} plans"
    for p in "${plans[@]}"; do
      IFS='|' read -r name ranks model flags role <<<"$p"
      measure "$name" "$round" "$ranks" "$model" $flags
    done
  done
fi
median_run() {  # median_run <name>: the round of the median undisturbed run (lower middle if even)
  python3 - "$out" "$1" "$repeats" <<'PY'
import json, os, sys
out, name, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
def mean(r):
    rows = [json.loads(l)['step_time_s'] for l in open(f"{out}/{name}.r{r}.steps.jsonl")][2:]
    return sum(rows) / len(rows)
rounds = range(1, repeats + 1)
quiet = sorted([r for r in rounds if not os.path.exists(f"{out}/{name}.r{r}.disturbed")] or rounds, key=mean)
print(quiet[(len(quiet) - 1) // 2])
PY
}
fit_traces=()
for p in "${plans[@]}"; do
  IFS='|' read -r name ranks model flags role <<<"$p"
  [ "$role" = fit ] && fit_traces+=(--trace "$out/$name.r$(median_run "$name").measured.json")
done

say "== calibrating $cluster"
calibrated="$out/$cluster-calibrated.json"
"$sextant" calibrate --cluster "$cluster" --trace "$out/bench.json" "${fit_traces[@]}" \
  "${calibrate_flags[@]}" "${force[@]}" --out "$calibrated" | sed 's/^/   /' >&2

rows="$out/rows.jsonl"
: >"$rows"
for p in "${plans[@]}"; do
  IFS='|' read -r name ranks model flags role <<<"$p"
  predict() {
    "$sextant" simulate --model "$model" --cluster "$1" $flags "${sim_flags[@]}" --json |
      python3 -c "import json,sys; print(json.load(sys.stdin)['step_time_s'])"
  }
  before=$(predict "$cluster")
  after=$(predict "$calibrated")
  # The median undisturbed run's mean step (two warm-up steps left out; all runs where none was
  # quiet) and the half-range of those runs as the plan's noise.
  read -r measured noise disturbed < <(python3 - "$out" "$name" "$repeats" <<'PY'
import json, os, sys
out, name, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs, disturbed = [], 0
for r in range(1, repeats + 1):
    rows = [json.loads(l)['step_time_s'] for l in open(f"{out}/{name}.r{r}.steps.jsonl")][2:]
    quiet = not os.path.exists(f"{out}/{name}.r{r}.disturbed")
    disturbed += not quiet
    runs.append((not quiet, sum(rows) / len(rows)))
runs = sorted([t for d, t in runs if not d] or [t for d, t in runs])
print(runs[(len(runs) - 1) // 2], (runs[-1] - runs[0]) / 2, disturbed)
PY
)
  echo "{\"name\": \"$name\", \"model\": \"$model\", \"ranks\": $ranks, \"heldout\": $([ "$role" = heldout ] && echo true || echo false), \"predicted_s\": $after, \"predicted_uncalibrated_s\": $before, \"measured_s\": $measured, \"noise_s\": $noise, \"disturbed_runs\": $disturbed}" >>"$rows"
done

# One held-out plan op by op.
for p in "${plans[@]}"; do
  IFS='|' read -r name ranks model flags role <<<"$p"
  [ "$name" = "$compare_plan" ] || continue
  "$sextant" simulate --model "$model" --cluster "$calibrated" $flags "${sim_flags[@]}" \
    --trace "$out/$name.predicted.json" >/dev/null
  "$sextant" compare --measured "$out/$name.r$(median_run "$name").measured.json" --predicted "$out/$name.predicted.json" \
    --json >"$out/$name.compare.json"
done

python3 - "$rows" "$out/$compare_plan.compare.json" "$json" "$cluster" "$compare_plan" "$calibrated" "$waited" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
compare = json.load(open(sys.argv[2]))
as_json = sys.argv[3] == "1"
cluster, compare_plan = sys.argv[4], sys.argv[5]
fitted = json.load(open(sys.argv[6]))["calibrated_from"].get("fitted_steps", {})
# A prediction's uncertainty: the fit's RMS error on the plans it was fitted on (their medians).
fit_plans = [r for r in rows if not r["heldout"]]
fit_rms = (sum(((r["predicted_s"] - r["measured_s"]) / r["measured_s"]) ** 2 for r in fit_plans)
           / len(fit_plans)) ** 0.5 if fit_plans else 0.0
for r in rows:
    r["error"] = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    r["uncalibrated_error"] = (r["predicted_uncalibrated_s"] - r["measured_s"]) / r["measured_s"]
    r["uncertainty_s"] = fit_rms * r["predicted_s"]
held = [r for r in rows if r["heldout"]]
errs = [abs(r["error"]) for r in held]

def kendall(a, b):  # tau-b
    c = d = ta = tb = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            x, y = a[i] - a[j], b[i] - b[j]
            if x == 0 and y == 0: continue
            if x == 0: ta += 1
            elif y == 0: tb += 1
            elif (x > 0) == (y > 0): c += 1
            else: d += 1
    den = ((c + d + ta) * (c + d + tb)) ** 0.5
    return (c - d) / den if den else 1.0

pred = [r["predicted_s"] for r in rows]
meas = [r["measured_s"] for r in rows]
pick = min(range(len(rows)), key=lambda i: pred[i])
summary = {
    "models": sorted({r["model"] for r in rows}), "cluster": cluster, "plans": rows,
    "heldout_mean_abs_error": sum(errs) / len(errs), "heldout_max_abs_error": max(errs),
    "uncalibrated_heldout_mean_abs_error": sum(abs(r["uncalibrated_error"]) for r in held) / len(held),
    "kendall_tau": kendall(pred, meas), "regret": meas[pick] / min(meas) - 1,
    "predicted_best": rows[pick]["name"], "measured_best": rows[meas.index(min(meas))]["name"],
    "op_class_errors": {"plan": compare_plan, "by_class": compare["by_class"]},
    "fit_plans_max_abs_error": max((abs(r["error"]) for r in rows if not r["heldout"]), default=0),
    "fit_plans_rms_error": fit_rms,
    "fit_worse": bool(fitted) and fitted["mean_abs_error_after"] > fitted["mean_abs_error_before"],
    "fitted_runs": {"mean_abs_error": fitted.get("mean_abs_error_after"),
                    "max_abs_error": fitted.get("max_abs_error_after")},
    "max_noise": max(r["noise_s"] / r["measured_s"] for r in rows),
    "disturbed_runs": sum(r["disturbed_runs"] for r in rows),
    "quiet_wait_s": int(sys.argv[7]),
}
if as_json:
    print(json.dumps(summary, indent=2))
else:
    print(f"{'plan':<16} {'ranks':>5} {'role':<8} {'predicted':>17} {'measured±noise':>16} {'error':>8}  {'uncalibrated':>12}")
    for r in rows:
        print(f"{r['name']:<16} {r['ranks']:>5} {'held out' if r['heldout'] else 'fit':<8} "
              f"{r['predicted_s']*1e3:>8.1f}±{r['uncertainty_s']*1e3:4.1f}ms "
              f"{r['measured_s']*1e3:>9.1f}±{r['noise_s']*1e3:4.1f}ms "
              f"{100*r['error']:>7.1f}%  "
              f"{100*r['uncalibrated_error']:>11.1f}%")
    print(f"fit plans: worst |error| {100*summary['fit_plans_max_abs_error']:.1f}% "
          f"(RMS {100*fit_rms:.1f}%: the ± of the predictions; each fitted run re-simulated: "
          f"mean {100*(fitted.get('mean_abs_error_after') or 0):.1f}%); "
          f"measurement noise up to ±{100*summary['max_noise']:.1f}% (half-range of the rounds)")
    print(f"held-out plans: mean |error| {100*summary['heldout_mean_abs_error']:.1f}%, "
          f"worst {100*summary['heldout_max_abs_error']:.1f}% "
          f"(uncalibrated mean {100*summary['uncalibrated_heldout_mean_abs_error']:.1f}%)")
    print(f"runs: {summary['disturbed_runs']} of the kept ones measured with a core disturbed "
          f"(more than 8% slow before or after; waited {summary['quiet_wait_s']} s for quiet cores)")
    print(f"ranking: Kendall tau {summary['kendall_tau']:.2f}; the predicted best ({summary['predicted_best']}) "
          f"is {100*summary['regret']:.1f}% slower than the measured best ({summary['measured_best']})")
PY
