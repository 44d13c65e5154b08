#!/usr/bin/env bash
# AxoNN's 3D tensor parallelism on CPU ranks (issue 14): gpt-tiny on 4 ranks under Megatron-LM's
# 1D split and every grid of 4 the model divides. For each: the bytes rank 0 sends per step in
# its tensor-parallel collectives (from the measured trace; ring algorithms: an all-reduce sends
# 2(n-1)/n of its buffer, an all-gather or reduce-scatter (n-1)/n), the measured step (mean of
# steps 2-5) and the local-cpu prediction. Numbers, never pass/fail: record them with
# bench/run.sh tensor_grid_executor bench/tensor_grid_executor_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
trace=$(mktemp --suffix .json)
# local-cpu with one device per rank: the 4 ranks share this machine's cores as they do here.
cluster=$(mktemp --suffix .json)
trap 'rm -f "$trace" "$cluster"' EXIT
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["devices_per_node"] = 4
json.dump(c, open(sys.argv[2], "w"))' "$root/clusters/local-cpu.json" "$cluster"
echo "gpt-tiny (hidden 128, 4 heads, ffn 512), 128 tokens a sequence, micro-batch 4, global batch 8,"
echo "4 ranks; tensor-parallel bytes rank 0 sends in step 1 (weight gathers and gradient scatters"
echo "over z included), measured and predicted step time (local-cpu, uncalibrated)"
printf '%-12s %14s %12s %12s\n' layout "tp MiB sent" measured predicted
for layout in 1d 1x4x1 2x2x1 4x1x1 1x2x2 2x1x2 1x1x4; do
  args=(--model gpt-tiny --global-batch 8 --micro-batch 4 --tp 4)
  [[ $layout != 1d ]] && args+=(--tp-grid "$layout")
  measured=$("$sextant" run "${args[@]}" --np 4 --steps 6 --quiet --trace "$trace" \
    --log-json /dev/stdout 2>/dev/null | python3 -c '
import json, sys
steps = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
t = [s["step_time_s"] for s in steps[2:]]
print("%.1f ms" % (1e3 * sum(t) / len(t)) if t else "n/a")')
  sent=$(python3 - "$trace" <<'PYEOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
share = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n}
total = 0.0
for e in events:
    a = e.get("args", {})
    if e.get("ph") != "X" or e["pid"] != 0 or a.get("step") != 1 or a.get("op_class") not in share:
        continue
    if e["name"].startswith("dp.") or a.get("group_size", 1) < 2:
        continue
    total += a["bytes"] * share[a["op_class"]](a["group_size"])
print("%.2f" % (total / 2**20))
PYEOF
)
  predicted=$("$sextant" simulate "${args[@]}" --cluster "$cluster" --gpus 4 --json 2>/dev/null |
    python3 -c 'import json, sys; print("%.1f ms" % (1e3 * json.load(sys.stdin)["step_time_s"]))' ||
    echo "n/a")
  printf '%-12s %14s %12s %12s\n' "$layout" "$sent" "$measured" "$predicted"
done
