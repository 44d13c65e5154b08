#!/usr/bin/env bash
# SUPER's branch split (Jain et al., IPDPS 2021; issue 61) on Inception-v3 and AmoebaNet-D: the
# best plan the search finds with it against the best without (--constraint tp=1; a channel split
# is refused for multi-branch units), on 8 to 64 A100s and global batches from one image a GPU up,
# the sextant stack (the one that runs it). Simulated steps of the ranked plans and the estimate
# of the best; predictions only. Record with
# bench/run.sh branch_parallel bash bench/branch_parallel_bench.sh.
set -euo pipefail
sextant="${1:-build/release/cli/sextant}"
best() {
  # shellcheck disable=SC2068
  "$sextant" plan --cluster dgx-a100 --stack sextant --top 1 --json $@ |
    python3 -c '
import json, sys
r = json.load(sys.stdin)["ranked"][0]
print(r["name"], 1000 * r["report"]["step_time_s"], 1000 * r["estimate_s"])'
}
for model in inception-v3 amoebanet-d; do
  batches="32 64 256"
  [ "$model" = amoebanet-d ] && batches="8 32 128"
  echo "$model"
  printf "%-5s %-6s %-34s %9s %9s  %-34s %9s  %s\n" gpus batch "best with SUPER" ms estimate \
    "best without" ms speedup
  for gpus in 8 32 64; do
    for batch in $batches; do
      common=(--model "$model" --gpus "$gpus" --global-batch "$batch")
      read -r with t_with e_with <<<"$(best "${common[@]}")"
      read -r without t_without _ <<<"$(best "${common[@]}" --constraint tp=1)"
      python3 -c "import sys; g,b,w,tw,ew,o,to=sys.argv[1:]; print(f'{g:<5} {b:<6} {w:<34} {float(tw):9.2f} {float(ew):9.2f}  {o:<34} {float(to):9.2f}  {float(to)/float(tw):.2f}x')" \
        "$gpus" "$batch" "$with" "$t_with" "$e_with" "$without" "$t_without"
    done
  done
  echo
done
