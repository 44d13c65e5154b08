#!/usr/bin/env bash
# The calibration loop as a benchmark (issue 18): scripts/calibrate-local.sh three times in a row,
# each a fresh measurement, fit and prediction; prints the figures the loop is judged by for each
# run (with how many kept runs a core was disturbed in, and how long the loop waited for quiet
# cores: scripts/calibrate-local.sh) and whether it met the bars (fit plans within 5%, held-out
# mean <= 10% and none above 20%, Kendall tau >= 0.8, regret <= 5% or within the two plans'
# noise), the co-run slowdown and how often the predicted best is the fastest when each plan's
# runs are resampled, with tau's spread over those resamplings and tau over the pairs the rounds
# resolve (not a bar). Record with: bench/run.sh calibration_local bench/calibration_loop_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-3}"
printf '%-4s %9s %12s %11s %6s %7s %10s %9s %9s %6s  %s\n' run fit_worst heldout_mean heldout_max tau regret noise_max fit_check disturbed waited bars
for i in $(seq 1 "$runs"); do
  json=$("$root/scripts/calibrate-local.sh" --json --out "$root/out/calibration-bench/run$i" 2>/dev/null)
  python3 - "$i" "$json" <<'PY'
import json, sys
i, r = sys.argv[1], json.loads(sys.argv[2])
ok = (r["fit_plans_max_abs_error"] <= 0.05 and r["heldout_mean_abs_error"] <= 0.10 and
      r["heldout_max_abs_error"] <= 0.20 and r["kendall_tau"] >= 0.8 and
      (r["regret"] <= 0.05 or not r["regret_beyond_noise"]))
print(f"{i:<4} {100*r['fit_plans_max_abs_error']:8.1f}% {100*r['heldout_mean_abs_error']:11.1f}% "
      f"{100*r['heldout_max_abs_error']:10.1f}% {r['kendall_tau']:6.2f} {100*r['regret']:6.1f}% "
      f"{100*r['max_noise']:9.1f}% {100*(r['fitted_runs']['mean_abs_error'] or 0):8.1f}% "
      f"{r['disturbed_runs']:9d} {r['quiet_wait_s']:5.0f}s  {'met' if ok else 'missed'}")
co = r.get("co_run")
print(f"     predicted best {r['predicted_best']} (fastest in {100*r['predicted_best_share']:.0f}% of "
      f"resamplings), measured best {r['measured_best']}; regret "
      f"{'beyond' if r['regret_beyond_noise'] else 'within'} the noise; extra rounds: "
      f"{', '.join(r['rerun']) or 'none'}; co-run "
      + (f"GEMM {co['matrix']:.2f}x, memory {co['memory']:.2f}x" if co else "not measured"))
print(f"     tau over resamplings {r['kendall_tau_p10']:.2f} to {r['kendall_tau_p90']:.2f}; over the "
      f"{r['resolved_pairs']} of {r['pairs']} pairs measured apart beyond their noise "
      f"{r['kendall_tau_resolved']:.2f}")
for p in r["plans"]:
    print(f"     {p['name']:<14} {'held out' if p['heldout'] else 'fit':<8} predicted {1e3*p['predicted_s']:6.1f} ms"
          f"  measured {1e3*p['measured_s']:6.1f} ± {1e3*p['noise_s']:4.1f} ms"
          f"  {100*p['error']:+6.1f}%" + (f"  ({p['disturbed_runs']} disturbed)" if p['disturbed_runs'] else ""))
PY
done
