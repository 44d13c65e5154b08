#!/usr/bin/env bash
# SparCML's sparse all-reduces (recursive doubling and split all-gather) against the dense
# all-reduce and top-k's all-gather (issue 61), over a sparsity sweep: (a) what the simulator
# predicts for GPT-2 350M on 16 and 64 GPUs of 10 GbE-class links (1.25 GB/s every level); (b) what
# 4 CPU ranks of this machine send for gpt-tiny (dp4) against what the simulator expects for the
# same plan: the model prices unions of independent selections (models::sparse_all_reduce_rounds,
# sparse_split_allgather), real gradients' top-k indices overlap more. Bytes, not times, in (b):
# 4 ranks on 2 cores time nothing. Numbers, never pass/fail; record with bench/run.sh sparcml.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ratios=(0.001 0.01 0.05 0.2)

python3 "$(dirname "$0")/slow_links_cluster.py" "$tmp/slow.json" \
  "$(dirname "$0")/../clusters/dgx-a100.json" 1.25 dgx-a100-10gbe
# This machine's cores as 4 ranks for the simulator (the executor oversubscribes 2 cores).
python3 - "$tmp/cpu4.json" "$(dirname "$0")/../clusters/local-cpu.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
c["devices_per_node"] = 4
json.dump(c, open(sys.argv[1], "w"))
PY

step_ms() {
  "$sextant" simulate --model gpt2-350m --cluster "$tmp/slow.json" --dp "$1" \
    --global-batch $((16 * $1)) --micro-batch 4 --stack sextant "${@:2}" --json |
    python3 -c 'import json,sys; print("%.1f" % (1000 * json.load(sys.stdin)["step_time_s"]))'
}
split=",algorithm=split_allgather"
echo "predicted: gpt2-350m dp N, mb4, 16 sequences per replica, 10 GbE-class links (ms a step);"
echo "sparcml: recursive doubling, split: split all-gather"
printf '%-8s %10s %10s %10s %10s %10s %10s\n' ratio topk-dp16 sparcml-dp16 split-dp16 \
  topk-dp64 sparcml-dp64 split-dp64
printf '%-8s %10s %10s %10s %10s %10s %10s\n' none "$(step_ms 16)" "" "" "$(step_ms 64)" "" ""
for r in "${ratios[@]}"; do
  row=("$r")
  for n in 16 64; do
    row+=("$(step_ms "$n" --compression "topk:ratio=$r")"
      "$(step_ms "$n" --compression "sparcml:ratio=$r")"
      "$(step_ms "$n" --compression "sparcml:ratio=$r$split")")
  done
  printf '%-8s %10s %10s %10s %10s %10s %10s\n' "${row[@]}"
done

echo
echo "measured against predicted: gpt-tiny dp4 on 4 CPU ranks, global batch 16, step 1 of 3,"
echo "rank 0's dp.sparse_exchange bytes a round (summed over buckets)"
printf '%-8s %-10s %14s %14s %8s\n' ratio round measured predicted ratio
for r in "${ratios[@]}"; do
  "$sextant" run --model gpt-tiny --np 4 --dp 4 --global-batch 16 --steps 3 \
    --compression "sparcml:ratio=$r" --trace "$tmp/m.json" >"$tmp/log" 2>&1
  "$sextant" simulate --model gpt-tiny --cluster "$tmp/cpu4.json" --gpus 4 --dp 4 --global-batch 16 \
    --compression "sparcml:ratio=$r" --trace "$tmp/p.json" >/dev/null
  python3 - "$tmp/m.json" "$tmp/p.json" "$r" <<'PY'
import json, sys
def rounds(path, step):
    events = json.load(open(path))["traceEvents"]
    mine = [e for e in events if e.get("pid") == 0 and e["name"] == "dp.sparse_exchange"
            and (step is None or e.get("args", {}).get("step") == step)]
    mine.sort(key=lambda e: e["ts"])
    out = [0, 0]
    for i, e in enumerate(mine):
        out[i % 2] += e["args"].get("bytes", 0)
    return out
m, p = rounds(sys.argv[1], 1), rounds(sys.argv[2], None)
for k in range(2):
    print(f"{sys.argv[3]:<8} {k:<10} {m[k]:14d} {p[k]:14d} {m[k] / p[k]:8.3f}")
PY
done

echo
echo "split all-gather, measured against predicted: the same runs, rank 0's dp.sparse_gather bytes"
echo "(summed over buckets; dense ranges 4 bytes an element)"
printf '%-8s %14s %14s %8s\n' ratio measured predicted ratio
for r in "${ratios[@]}"; do
  "$sextant" run --model gpt-tiny --np 4 --dp 4 --global-batch 16 --steps 3 \
    --compression "sparcml:ratio=$r$split" --trace "$tmp/m.json" >"$tmp/log" 2>&1
  "$sextant" simulate --model gpt-tiny --cluster "$tmp/cpu4.json" --gpus 4 --dp 4 --global-batch 16 \
    --compression "sparcml:ratio=$r$split" --trace "$tmp/p.json" >/dev/null
  python3 - "$tmp/m.json" "$tmp/p.json" "$r" <<'PY'
import json, sys
def gathered(path, step):
    events = json.load(open(path))["traceEvents"]
    return sum(e["args"].get("bytes", 0) for e in events
               if e.get("pid") == 0 and e["name"] == "dp.sparse_gather"
               and (step is None or e.get("args", {}).get("step") == step))
m, p = gathered(sys.argv[1], 1), gathered(sys.argv[2], None)
print(f"{sys.argv[3]:<8} {m:14d} {p:14d} {m / p:8.3f}")
PY
done
