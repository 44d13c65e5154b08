#!/usr/bin/env bash
# `sextant launch --slurm` on a real one-node Slurm (test_cluster.sh: munge, slurmctld and slurmd
# from Debian's packages, configured in a temporary directory): the script for a 2-rank `sextant
# run` of gpt-tiny, submitted and waited for, trains the same losses as the same run under mpirun
# (same ranks, same reduction order: equal to the last bit); a stack's script, run with a stand-in
# torchrun that records what it was given and prints a Megatron-LM log, starts one torchrun per
# node with the rendezvous and the exported arguments, and --wait reads that log back.
# Exit 77 (skipped) when Slurm is not installed or this user cannot run slurmd, unless
# SEXTANT_REQUIRE_SLURM=1 (scripts/test.sh sets it where setup.sh installed Slurm as root).
set -uo pipefail
sextant="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../cli/probe_lib.sh"
source "$here/test_cluster.sh"
slurm_test_cluster_for_test

# 1. Sextant's executor: 2 ranks under srun --mpi=pmix, against the same plan under mpirun.
plan=(--model gpt-tiny --dp 2 --global-batch 4 --steps 4)
cd "$dir"
"$sextant" launch "${plan[@]}" --cluster local-cpu --slurm --time 5 --out "$dir/run.sbatch" \
  --submit --wait >"$dir/launch.txt" 2>&1 || fail "launch --submit --wait: $(cat "$dir/launch.txt")"
grep -q "^#SBATCH --ntasks-per-node=2$" "$dir/run.sbatch" || fail "2 tasks on the node"
grep -q "^srun --mpi=pmix " "$dir/run.sbatch" || fail "srun with PMIx"
grep -q "^step time: measured .* predicted " "$dir/launch.txt" ||
  fail "no measured-against-predicted line: $(cat "$dir/launch.txt")"
id=$(sed -n 's/^job \([0-9]*\): log .*/\1/p' "$dir/launch.txt")
[ -n "$id" ] || fail "no job id in: $(cat "$dir/launch.txt")"
"$sextant" run "${plan[@]}" --np 2 --quiet --log-json "$dir/local.jsonl" >"$dir/local.txt" 2>&1 ||
  fail "local run: $(cat "$dir/local.txt")"
python3 - "$dir/gpt-tiny-dp2.tp1.pp1.z0.mb1-$id.steps.jsonl" "$dir/local.jsonl" <<'PY' ||
import json, sys
slurm, local = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(slurm) == len(local) == 4, (len(slurm), len(local))
for a, b in zip(slurm, local):
    assert a["step"] == b["step"] and a["loss"] == b["loss"], (a, b)
    assert a["grad_norm"] == b["grad_norm"], (a, b)
PY
  fail "the Slurm run's losses differ from mpirun's"

# 2. A stack's script: torchrun is a stand-in that records its arguments and the node it ran on,
# then prints the Megatron-LM log of tests/data/logs as its run's output.
mkdir -p "$dir/bin"
cat >"$dir/bin/torchrun" <<EOF
#!/usr/bin/env bash
echo "\$(hostname -s) \$*" >>"$dir/torchrun.calls"
cat "$here/../data/logs/megatron.log"
EOF
chmod +x "$dir/bin/torchrun"
stack=(--model llama3-8b --cluster local-cpu --tp 2 --global-batch 512 --dtype fp32 --steps 3)
PATH="$dir/bin:$PATH" MEGATRON_LM=/opt/megatron "$sextant" launch "${stack[@]}" --slurm \
  --to megatron-core --out "$dir/megatron.sbatch" --submit --wait >"$dir/m.txt" 2>&1 ||
  fail "megatron launch: $(cat "$dir/m.txt")"
calls=$(cat "$dir/torchrun.calls" 2>/dev/null)
[ "$(wc -l <<<"$calls")" -eq 1 ] || fail "one torchrun per node, got: $calls"
for want in "--nnodes=1 --nproc-per-node=2" "--rdzv-backend=c10d" "--rdzv-endpoint=$(hostname -s):29500" \
  "/opt/megatron/pretrain_gpt.py" "--tensor-model-parallel-size 2" "--train-iters 3" \
  "--mock-data" "--tokenizer-type NullTokenizer"; do
  grep -qF -- "$want" <<<"$calls" || fail "torchrun was not given '$want': $calls"
done
# The log's measured step: the mean of 6801.2 and 6815.0 ms, the intervals after the first.
grep -q "step time: measured 6.81 s (median), predicted" "$dir/m.txt" ||
  fail "megatron log not read back: $(cat "$dir/m.txt")"

# 3. Refusals name the flag.
expect_error "--time" "$sextant" launch "${plan[@]}" --cluster local-cpu --slurm --time "1 day"
expect_error "--script" "$sextant" launch "${stack[@]}" --slurm --to deepspeed
expect_error "NeMo-Run" "$sextant" launch "${stack[@]}" --slurm --to nemo
expect_error "--nodes" "$sextant" launch "${plan[@]}" --cluster local-cpu --slurm --nodes 3

[ "$failures" -eq 0 ] && echo "slurm launch: all checks passed"
exit "$failures"
