#!/usr/bin/env bash
# The loop on this machine: measure (bench comm, training runs of a few plans of gpt-tiny), fit the
# local-cpu cluster to the measurements, then predict plans with the calibrated cluster and run
# them for real -- including plans not used for the fit -- and report predicted against measured.
#
# Usage: scripts/calibrate-local.sh [--json] [--steps N] [--out DIR]
#   --json   end with one JSON object: plans (name, predicted_s, measured_s, heldout, ...),
#            heldout_mean_abs_error, heldout_max_abs_error (fractions), kendall_tau, regret
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
json=0
steps=8
out="$root/out/calibrate-local"
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=1 ;;
    --steps) steps="$2"; shift ;;
    --out) out="$2"; shift ;;
    *) echo "usage: $0 [--json] [--steps N] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
source scripts/env.sh
scripts/build.sh >/dev/null
sextant="$root/build/release/cli/sextant"
mkdir -p "$out"
say() { [ "$json" -eq 1 ] && echo "$@" >&2 || echo "$@"; }

model=gpt-tiny
batch=16
# name | ranks | plan flags | used for the fit?
plans=(
  "dp1.mb4|1|--dp 1 --micro-batch 4|fit"
  "dp2.mb4|2|--dp 2 --micro-batch 4|fit"
  "tp2.mb4|2|--tp 2 --micro-batch 4|fit"
  "dp1.mb8|1|--dp 1 --micro-batch 8|heldout"
  "dp1.mb2|1|--dp 1 --micro-batch 2|heldout"
  "dp2.mb2|2|--dp 2 --micro-batch 2|heldout"
  "pp2.1f1b.mb2|2|--pp 2 --micro-batch 2|heldout"
  "pp2.gpipe.mb4|2|--pp 2 --schedule gpipe --micro-batch 4|heldout"
  "tp2.sp.mb4|2|--tp 2 --sp --micro-batch 4|heldout"
  "dp2.z1.mb8|2|--dp 2 --zero 1 --micro-batch 8|heldout"
)

measure() {  # measure <name> <ranks> <flags...>: mean step time after two warm-up steps
  local name="$1" ranks="$2"
  shift 2
  "$sextant" run --model "$model" --np "$ranks" --global-batch "$batch" "$@" --steps "$steps" \
    --quiet --log-json "$out/$name.steps.jsonl" --trace "$out/$name.measured.json" >/dev/null
  python3 -c "
import json, sys
rows = [json.loads(l)['step_time_s'] for l in open('$out/$name.steps.jsonl')][2:]
print(sum(rows) / len(rows))"
}

say "== measuring collectives (sextant bench comm, 2 ranks)"
"$sextant" bench comm --np 2 --sizes 4K,64K,512K,4M --iterations 10 --trace "$out/comm.json" >/dev/null

declare -A measured
fit_traces=()
for p in "${plans[@]}"; do
  IFS='|' read -r name ranks flags role <<<"$p"
  if [ "$role" = fit ]; then
    say "== measuring $name (for the fit)"
    measured[$name]=$(measure "$name" "$ranks" $flags)
    fit_traces+=(--trace "$out/$name.measured.json")
  fi
done

say "== calibrating local-cpu"
"$sextant" calibrate --cluster local-cpu --trace "$out/comm.json" "${fit_traces[@]}" \
  --out "$out/local-cpu-calibrated.json" | sed 's/^/   /' >&2

rows="$out/rows.jsonl"
: >"$rows"
for p in "${plans[@]}"; do
  IFS='|' read -r name ranks flags role <<<"$p"
  predict() {
    "$sextant" simulate --model "$model" --cluster "$1" --global-batch "$batch" $flags --json |
      python3 -c "import json,sys; print(json.load(sys.stdin)['step_time_s'])"
  }
  before=$(predict local-cpu)
  after=$(predict "$out/local-cpu-calibrated.json")
  if [ "$role" = heldout ]; then
    say "== measuring $name (held out)"
    measured[$name]=$(measure "$name" "$ranks" $flags)
  fi
  echo "{\"name\": \"$name\", \"ranks\": $ranks, \"heldout\": $([ "$role" = heldout ] && echo true || echo false), \"predicted_s\": $after, \"predicted_uncalibrated_s\": $before, \"measured_s\": ${measured[$name]}}" >>"$rows"
done

# One held-out plan op by op.
"$sextant" simulate --model "$model" --cluster "$out/local-cpu-calibrated.json" --global-batch "$batch" \
  --pp 2 --micro-batch 2 --trace "$out/pp2.1f1b.mb2.predicted.json" >/dev/null
"$sextant" compare --measured "$out/pp2.1f1b.mb2.measured.json" \
  --predicted "$out/pp2.1f1b.mb2.predicted.json" --json >"$out/pp2.1f1b.mb2.compare.json"

python3 - "$rows" "$out/pp2.1f1b.mb2.compare.json" "$json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
compare = json.load(open(sys.argv[2]))
as_json = sys.argv[3] == "1"
for r in rows:
    r["error"] = (r["predicted_s"] - r["measured_s"]) / r["measured_s"]
    r["uncalibrated_error"] = (r["predicted_uncalibrated_s"] - r["measured_s"]) / r["measured_s"]
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
    "model": "gpt-tiny", "cluster": "local-cpu", "global_batch": 16, "plans": rows,
    "heldout_mean_abs_error": sum(errs) / len(errs), "heldout_max_abs_error": max(errs),
    "uncalibrated_heldout_mean_abs_error": sum(abs(r["uncalibrated_error"]) for r in held) / len(held),
    "kendall_tau": kendall(pred, meas), "regret": meas[pick] / min(meas) - 1,
    "predicted_best": rows[pick]["name"], "measured_best": rows[meas.index(min(meas))]["name"],
    "op_class_errors": {"plan": "pp2.1f1b.mb2", "by_class": compare["by_class"]},
}
if as_json:
    print(json.dumps(summary, indent=2))
else:
    print(f"{'plan':<16} {'ranks':>5} {'role':<8} {'predicted':>10} {'measured':>10} {'error':>8}  {'uncalibrated':>12}")
    for r in rows:
        print(f"{r['name']:<16} {r['ranks']:>5} {'held out' if r['heldout'] else 'fit':<8} "
              f"{r['predicted_s']*1e3:>8.1f}ms {r['measured_s']*1e3:>8.1f}ms {100*r['error']:>7.1f}%  "
              f"{100*r['uncalibrated_error']:>11.1f}%")
    print(f"held-out plans: mean |error| {100*summary['heldout_mean_abs_error']:.1f}%, "
          f"worst {100*summary['heldout_max_abs_error']:.1f}% "
          f"(uncalibrated mean {100*summary['uncalibrated_heldout_mean_abs_error']:.1f}%)")
    print(f"ranking: Kendall tau {summary['kendall_tau']:.2f}; the predicted best ({summary['predicted_best']}) "
          f"is {100*summary['regret']:.1f}% slower than the measured best ({summary['measured_best']})")
PY
