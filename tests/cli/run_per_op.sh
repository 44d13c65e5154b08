#!/usr/bin/env bash
# `sextant run` trains a per-op plan (issue 60) on 4 CPU ranks: llama-tiny on dp 2 x tp 2 with
# attention batch-split over d x t and the MLP sequence-split over t, three steps whose loss
# falls, and a trace holding the gathers that join the ops' layouts; the same plan with sequence
# parallelism; in bf16 a refusal naming the field; the same plan with the logits' vocabulary
# split over d x t; and resnet-tiny's classifier split by op on 2 ranks.
set -euo pipefail
sextant="$1"
out="$2"
rm -rf "$out"
mkdir -p "$out"
cat >"$out/plan.json" <<'JSON'
{"schema": "sextant.plan/1", "dp": 2, "tp": 2, "pp": 1, "zero": 0, "micro_batch": 2,
 "global_batch": 8,
 "per_op": {"qkv": {"b": ["d", "t"]}, "attention": {"b": ["d", "t"]}, "proj": {"b": ["d", "t"]},
            "fc1": {"b": ["d"], "s": ["t"]}, "activation": {"b": ["d"], "s": ["t"]},
            "fc2": {"b": ["d"], "s": ["t"]}}}
JSON
"$sextant" run --model llama-tiny --plan "$out/plan.json" --np 4 --steps 3 \
  --log-json "$out/steps.jsonl" --trace "$out/trace.json" >"$out/run.txt" 2>&1 ||
  { cat "$out/run.txt"; echo "FAIL: the per-op plan did not run"; exit 1; }
[ "$(wc -l <"$out/steps.jsonl")" -eq 3 ] || { echo "FAIL: not 3 steps"; exit 1; }
python3 - "$out/steps.jsonl" "$out/trace.json" <<'PY'
import gzip, json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
assert steps[-1]["loss"] < steps[0]["loss"], f"loss did not fall: {steps}"
raw = open(sys.argv[2], "rb").read()
trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
events = trace["traceEvents"] if isinstance(trace, dict) else trace
names = {e.get("name", "") for e in events}
# Attention's and the MLP's outputs gathered over t into the residual stream (forward), their
# inputs' gradients into the norms' (backward); no Megatron all-reduce left.
for want in ("residual1.reshard_all_gather", "residual2.reshard_all_gather",
             "norm1.reshard_all_gather", "norm2.reshard_all_gather"):
    hits = [n for n in names if n == want]
    assert hits, f"no {want} in the trace; reshard ops: {sorted(n for n in names if 'reshard' in n)}"
assert not any(n.endswith("all_reduce") and n.startswith(("attn.", "mlp.")) for n in names), names
print("per-op run: loss", steps[0]["loss"], "->", steps[-1]["loss"])
PY
# With sequence parallelism over the same two sequences a micro-batch it trains too (each
# sequence's positions split over t); in emulated bf16 it is refused, naming the field.
sed 's/"micro_batch": 2/"micro_batch": 2, "sequence_parallel": true/' "$out/plan.json" >"$out/sp.json"
"$sextant" run --model llama-tiny --plan "$out/sp.json" --np 4 --steps 2 --quiet >"$out/sp.txt" 2>&1 ||
  { cat "$out/sp.txt"; echo "FAIL: the sequence-parallel per-op plan did not run"; exit 1; }
if "$sextant" run --model llama-tiny --plan "$out/plan.json" --np 4 --steps 1 --precision bf16 \
  >"$out/bf16.txt" 2>&1; then
  echo "FAIL: a per-op plan ran in bf16"; exit 1
fi
grep -q "/per_op" "$out/bf16.txt" || { cat "$out/bf16.txt"; echo "FAIL: refusal names no field"; exit 1; }
# Fails unless the trace FILE holds an event of each NAME given after it.
trace_has() {
  python3 - "$@" <<'PY'
import gzip, json, sys
raw = open(sys.argv[1], "rb").read()
trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
events = trace["traceEvents"] if isinstance(trace, dict) else trace
names = {e.get("name", "") for e in events}
for want in sys.argv[2:]:
    assert want in names, f"no {want}; reshard ops: {sorted(n for n in names if 'reshard' in n)}"
PY
}
# A CNN's classifier split by op: resnet-tiny's fc (layer6, 32 -> 10) with its contracted
# features over the 2 replicas, its logits reduce-scattered back onto the batch.
cat >"$out/cnn.json" <<'JSON'
{"schema": "sextant.plan/1", "dp": 2, "tp": 1, "pp": 1, "zero": 0, "micro_batch": 2,
 "global_batch": 8, "per_op": {"layer6": {"f0": ["d"]}}}
JSON
"$sextant" run --model resnet-tiny --plan "$out/cnn.json" --np 2 --steps 2 \
  --trace "$out/cnn-trace.json" >"$out/cnn.txt" 2>&1 ||
  { cat "$out/cnn.txt"; echo "FAIL: the CNN's per-op plan did not run"; exit 1; }
trace_has "$out/cnn-trace.json" layer6.reshard_all_gather logits.reshard_reduce_scatter
# A decoder's logits split by op: llama-tiny's 256-token vocabulary over the 2 replicas and the 2
# tp ranks (each rank 64 rows of the output weights for every replica's tokens).
sed 's/"fc2": {"b": \["d"\], "s": \["t"\]}}}/"fc2": {"b": ["d"], "s": ["t"]}, "logits": {"V": ["d", "t"]}}}/' \
  "$out/plan.json" >"$out/logits.json"
grep -q '"logits"' "$out/logits.json" || { echo "FAIL: no logits split in the plan"; exit 1; }
"$sextant" run --model llama-tiny --plan "$out/logits.json" --np 4 --steps 2 \
  --trace "$out/logits-trace.json" >"$out/logits.txt" 2>&1 ||
  { cat "$out/logits.txt"; echo "FAIL: the logits' per-op plan did not run"; exit 1; }
trace_has "$out/logits-trace.json" logits.reshard_all_gather head.loss_all_reduce
echo "run: per-op plans trained (a transformer's blocks, with and without sequence parallelism,"
echo "its logits, and a CNN's classifier); bf16 refused"
