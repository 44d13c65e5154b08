#!/usr/bin/env bash
# Runs scripts/calibrate-local.sh --json and checks its report: at least 6 held-out plans, every
# figure present and finite. The loop's errors come from live timings on this machine, so they
# are not asserted here (no timing in ctest: a busy machine measured 2-3x slower micro-batches),
# nor whether the fit improved on them (--force: a noisy run may not); one round of runs keeps it
# short (one extra round for the plans near the best), and --quiet-wait 0 measures without waiting for quiet cores (ctest runs tests side by
# side; runs are still checked and marked). bench/results/calibration_local.md records the loop's
# real figures.
set -euo pipefail
root="$1"
out="$2"
# (Progress goes to stderr; kept, and shown when the loop fails, so a failure says why.)
if ! json=$("$root/scripts/calibrate-local.sh" --json --steps 6 --repeats 1 --extra-rounds 1 --force \
    --quiet-wait 0 --out "$out" 2>"$out-stderr.txt"); then
  echo "calibrate-local.sh failed:" >&2
  tail -n 30 "$out-stderr.txt" >&2
  exit 1
fi
# The report, for the calibration notebook's test to plot (tests/CMakeLists.txt).
printf '%s\n' "$json" > "$out.json"
python3 - "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
held = [p for p in r["plans"] if p["heldout"]]
assert len(held) >= 6, f"only {len(held)} held-out plans"
for p in r["plans"]:
    # One round, two for the plans the loop reran (within the noise of the best).
    assert p["predicted_s"] > 0 and p["measured_s"] > 0, p
    assert p["noise_s"] == 0 or p["name"] in r["rerun"], p
assert len(r["rerun"]) != 1, r["rerun"]  # none, or the best and what is close to it
assert 0 <= r["predicted_best_share"] <= 1 and 0 <= r["measured_best_share"] <= 1
for key in ("heldout_mean_abs_error", "heldout_max_abs_error", "kendall_tau", "regret",
            "fit_worse", "fit_plans_rms_error", "max_noise", "disturbed_runs", "quiet_wait_s"):
    assert key in r, key
import math
for key in ("heldout_mean_abs_error", "heldout_max_abs_error", "uncalibrated_heldout_mean_abs_error"):
    assert math.isfinite(r[key]) and r[key] >= 0, (key, r[key])
assert -1 <= r["kendall_tau"] <= 1, r["kendall_tau"]
runs = len(r["plans"]) + len(r["rerun"])  # one round, one extra for the reran plans
assert r["quiet_wait_s"] == 0 and 0 <= r["disturbed_runs"] <= runs, r["disturbed_runs"]
assert r["heldout_max_abs_error"] >= r["heldout_mean_abs_error"]
print(f"held-out mean |error| {r['heldout_mean_abs_error']:.3f}, max {r['heldout_max_abs_error']:.3f}, "
      f"tau {r['kendall_tau']:.2f}")
PY
