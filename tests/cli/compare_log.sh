#!/usr/bin/env bash
# `sextant compare --log`: a stack's own training log (tests/data/logs, written to each documented
# format) against the plan's simulated step: the measured time is the median of the logged steps
# after the first (by hand below); a malformed line fails with exit 2 naming it.
set -uo pipefail
sextant="$1"
data="$(dirname "$0")/../data/logs"
source "$(dirname "$0")/probe_lib.sh"

plan=(--model llama3-8b --cluster dgx-h100 --gpus 64 --tp 4 --pp 2 --sp --zero 1 --global-batch 512)
"$sextant" compare --log "$data/megatron.log" "${plan[@]}" --json >"$dir/m.json" 2>&1 ||
  fail "megatron log: $(cat "$dir/m.json")"
python3 - "$dir/m.json" <<'PY' || fail "megatron comparison"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["format"] == "megatron" and r["logged_steps"] == 3, r
# 6801.2 and 6815.0 ms after the first interval: their mean is the median of two.
assert abs(r["measured_step_s"] - (6.8012 + 6.815) / 2) < 1e-9, r
assert r["predicted_step_s"] > 0
assert abs(r["step_error"] - (r["predicted_step_s"] / r["measured_step_s"] - 1)) < 1e-12, r
PY
# TorchTitan prints tokens/s per device: 64 x 8192 tokens over 8 devices at 6,830 and 6,850.
"$sextant" compare --log "$data/torchtitan.log" --model llama3-8b --cluster dgx-h100 --gpus 8 \
  --zero 3 --global-batch 64 --stack torchtitan --json >"$dir/t.json" 2>&1 ||
  fail "torchtitan log: $(cat "$dir/t.json")"
python3 - "$dir/t.json" <<'PY' || fail "torchtitan comparison"
import json, sys
r = json.load(open(sys.argv[1]))
a, b = 524288 / (6830 * 8), 524288 / (6850 * 8)
assert abs(r["measured_step_s"] - (a + b) / 2) < 1e-9, r
PY
"$sextant" compare --log "$data/nemo.log" "${plan[@]}" >"$dir/n.txt" 2>&1 || fail "nemo log"
grep -q "step time: measured 3.50 s (median)" "$dir/n.txt" || fail "nemo text: $(cat "$dir/n.txt")"

{ cat "$data/megatron.log"
  echo " [2025-10-08 14:35:46] iteration      400/    5000 | elapsed time per iteration (ms): n/a |"
} >"$dir/bad.log"
expect_error "bad.log: line 6" "$sextant" compare --log "$dir/bad.log" "${plan[@]}"
echo "a log without step lines" >"$dir/none.log"
expect_error "none.log: no step line of Megatron-LM, NeMo, TorchTitan or DeepSpeed" \
  "$sextant" compare --log "$dir/none.log" "${plan[@]}"
expect_error "--model: missing: --log needs it" \
  "$sextant" compare --log "$data/megatron.log" --cluster dgx-h100 --gpus 8 --global-batch 8
expect_error "not with --measured and --predicted" \
  "$sextant" compare --log "$data/megatron.log" --measured a.json "${plan[@]}"
expect_error "--measured: missing" "$sextant" compare --predicted p.json

[ "$failures" -eq 0 ] || exit 1
echo "compare --log: ok"
