#!/usr/bin/env bash
# Tokens/s of the CPU executor for gpt-tiny (global batch 16 x 128 tokens, micro-batch 4) on 1, 2
# and 4 data-parallel ranks, next to the same model trained by PyTorch on CPU (Debian's
# python3-torch, DDP over gloo, one thread per rank), in one run (it installs what scripts/setup-bench.sh adds).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
# PyTorch without an optimised BLAS (Debian's reference libblas) ran 9x slower on one machine
# and made the ratio meaningless: install what the comparison needs first (a no-op when present).
bash "$root/scripts/setup-bench.sh"
sextant="${1:-$root/build/release/cli/sextant}"
steps=10
printf '%-6s %16s %16s %8s\n' ranks sextant_tokens_s pytorch_tokens_s ratio
for ranks in 1 2 4; do
  log=$(mktemp)
  "$sextant" run --model gpt-tiny --np "$ranks" --dp "$ranks" --global-batch 16 --micro-batch 4 \
    --steps $((steps + 2)) --quiet --log-json "$log"
  ours=$(/usr/bin/python3 -c "
import json
rows = [json.loads(l) for l in open('$log')][2:]  # skip two warm-up steps
print(sum(r['tokens_per_s'] for r in rows) / len(rows))")
  rm -f "$log"
  theirs=$(OMP_NUM_THREADS=1 /usr/bin/python3 "$root/bench/pytorch_gpt.py" --ranks "$ranks" \
    --global-batch 16 --micro-batch 4 --steps "$steps" | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])")
  printf '%-6s %16.0f %16.0f %8.2f\n' "$ranks" "$ours" "$theirs" "$(echo "$ours / $theirs" | bc -l)"
done
echo "(2-core machine: 4 ranks are oversubscribed for both)"
