#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each reader's
# target. A crash, a sanitizer report or an exception other than the documented InputError fails.
#
# Usage: scripts/fuzz.sh [--seconds N | --runs N] [--record] [TARGET...]
#   --seconds N  search for N seconds per target (default 60), growing out/fuzz/corpus/TARGET
#   --runs N     exactly N executions per target from the committed seeds only, with a fixed
#                random seed: the regression check CI runs (same inputs every time)
#   --record     append the executions per target to bench/results/fuzz.md (date, machine, commit)
#   TARGET       model cluster plan stack trace kineto nccl_tests checkpoint_manifest report
#                calibrate (default: all)
# Crashing inputs are kept in out/fuzz/artifacts/TARGET/; reproduce with
#   build/fuzz/fuzz/fuzz_TARGET out/fuzz/artifacts/TARGET/crash-...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

all_targets=(model cluster plan stack trace kineto nccl_tests checkpoint_manifest report calibrate
  training_log stack_config)
seconds=60
runs=""
record=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --record) record=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [[ " ${all_targets[*]} " != *" $1 "* ]]; then
        echo "fuzz.sh: unknown target '$1' (one of: ${all_targets[*]})" >&2; exit 2
      fi
      targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")

# The commit the targets are built from (recorded with --record; HEAD may move during a long run).
built_from="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo '+changes')"

scripts/setup.sh
if [ ! -f build/fuzz/CMakeCache.txt ]; then
  cmake --preset fuzz >/dev/null
fi
fuzz_bins=()
for t in "${targets[@]}"; do fuzz_bins+=("fuzz_$t"); done
cmake --build --preset fuzz -j "$(nproc)" --target "${fuzz_bins[@]}" |
  { grep -v -E '^\[[0-9]+/[0-9]+\] ' || true; }

# Seeds: the committed ones (fuzz/seeds/TARGET) and the repository's own files of that kind.
seed_dirs() {
  local t="$1"
  echo "fuzz/seeds/$t"
  case "$t" in
    model) echo models/zoo; echo tests/data/hf ;;
    cluster) echo clusters ;;
    stack) echo stacks ;;
    training_log) echo tests/data/logs ;;
  esac
}
failed=()
summary=()
for t in "${targets[@]}"; do
  artifacts="out/fuzz/artifacts/$t"
  log="out/fuzz/logs/$t.log"
  mkdir -p "$artifacts" "$(dirname "$log")"
  dirs=()
  for d in $(seed_dirs "$t"); do [ -d "$d" ] && dirs+=("$d"); done
  dict=fuzz/dicts/json.dict
  [ -f "fuzz/dicts/$t.dict" ] && dict="fuzz/dicts/$t.dict"
  args=(-max_len=65536 -timeout=20 -rss_limit_mb=4096 -print_final_stats=1
        "-artifact_prefix=$artifacts/" "-dict=$dict")
  if [ -n "$runs" ]; then
    # Regression: the seeds only, the same random seed every time. libFuzzer writes what it finds
    # into the first corpus directory: an empty one of its own, never the seed folders.
    scratch="out/fuzz/regression/$t"
    rm -rf "$scratch" && mkdir -p "$scratch"
    args+=(-runs="$runs" -seed=1)
    corpus=("$scratch" "${dirs[@]}")
  else
    corpus_dir="out/fuzz/corpus/$t"  # first: where libFuzzer adds what it finds
    mkdir -p "$corpus_dir"
    args+=(-max_total_time="$seconds")
    corpus=("$corpus_dir" "${dirs[@]}")
  fi
  start=$(date +%s)
  if "build/fuzz/fuzz/fuzz_$t" "${args[@]}" "${corpus[@]}" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$t")
  fi
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  elapsed=$(( $(date +%s) - start ))
  line=$(printf '%-20s %-7s %12s executions %6ss' "$t" "$status" "${execs:-?}" "$elapsed")
  echo "fuzz: $line"
  summary+=("$line")
  if [ "$status" = FAILED ]; then
    grep -E 'ERROR|fuzz: escaped|runtime error|SUMMARY|Test unit written' "$log" | head -8 | sed 's/^/  /'
  fi
done

if [ "$record" = 1 ]; then
  out=bench/results/fuzz.md
  # The header before the block: its redirection creates the file.
  [ -f "$out" ] || printf '# Fuzzing: executions per reader with 0 crashes (scripts/fuzz.sh --record)\n' >"$out"
  {
    printf '\n## %s, %s, built from commit %s\n\n' "$(date -u +%Y-%m-%dT%H:%MZ)" \
      "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
      "$built_from"
    if [ -n "$runs" ]; then printf 'Mode: --runs %s (seeds only).\n\n' "$runs"
    else printf 'Mode: --seconds %s per target (corpus grown under out/fuzz/corpus).\n\n' "$seconds"; fi
    printf '```\n'
    printf '%s\n' "${summary[@]}"
    printf '```\n'
  } >>"$out"
  echo "fuzz: recorded in $out"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (logs in out/fuzz/logs, inputs in out/fuzz/artifacts)" >&2
  exit 1
fi
