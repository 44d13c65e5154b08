#!/usr/bin/env bash
# The code that reads what users and other tools hand Sextant, under AddressSanitizer +
# UndefinedBehaviorSanitizer (clang, the `fuzz` preset): the unit tests of the readers and fits
# (spec, models, traces, interop, loop, cli flags) and every fuzz target on a fixed set of inputs
# (scripts/fuzz.sh --runs). What scripts/test.sh, and so CI, runs after the release tests:
# ~15 minutes on 2 cores.
# --all: every unit test (the executor, simulator and planner too) under the sanitizers, as before
# changes to the executor's kernels or memory handling land (~28 minutes on 2 cores).
# Usage: scripts/sanitize.sh [--all]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
all=0
case "${1:-}" in
  --all) all=1 ;;
  "") ;;
  *) echo "sanitize.sh: unknown option $1 (use --all or nothing)" >&2; exit 2 ;;
esac
scripts/setup.sh
if [ ! -f build/fuzz/CMakeCache.txt ]; then
  cmake --preset fuzz >/dev/null
fi
# Open MPI never frees some of its own allocations, and LeakSanitizer reports them at the exit of
# every program that starts MPI; leaks are checked by the fuzz targets, which do not.
export ASAN_OPTIONS=detect_leaks=0
if [ "$all" -eq 1 ]; then
  cmake --build --preset fuzz -j "$(nproc)" | { grep -v -E '^\[[0-9]+/[0-9]+\] ' || true; }
  # Left out: two sweeps that run the code of the other tests over every zoo model and plan (5
  # and 2 minutes under ASan on 2 cores), and the GPT-3 175B search over 64 GPUs (4 minutes, the
  # search the other planner tests run on smaller requests); the release run has them.
  heavy='Planner.PruningNeverDropsTheTrueBest|Simulator.AnswersForEveryZooTransformerOnEveryCluster'
  heavy+='|Planner.OnlyPlansThatFitAreReturned'
  ctest --preset fuzz -L unit -E "$heavy" -j "$(nproc)" --timeout 900
else
  # The readers' and fits' suites: what bad input reaches. (The executor's library, the largest
  # under the sanitizers, is not built: its suites run with --all.)
  suites=(spec_test models_test traces_test interop_test loop_test cli_test)
  cmake --build --preset fuzz -j "$(nproc)" --target "${suites[@]}" |
    { grep -v -E '^\[[0-9]+/[0-9]+\] ' || true; }
  for s in "${suites[@]}"; do
    echo "sanitize: $s"
    (cd build/fuzz/tests && "./$s" --gtest_brief=1)
  done
fi

scripts/fuzz.sh --runs "${SEXTANT_FUZZ_RUNS:-20000}"
