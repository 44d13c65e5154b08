#!/usr/bin/env bash
# The unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (clang, the `fuzz`
# preset), then every reader's fuzz target on a fixed set of inputs (scripts/fuzz.sh --runs): what
# scripts/test.sh runs after the release tests. Usage: scripts/sanitize.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
scripts/setup.sh
if [ ! -f build/fuzz/CMakeCache.txt ]; then
  cmake --preset fuzz >/dev/null
fi
cmake --build --preset fuzz -j "$(nproc)" | { grep -v -E '^\[[0-9]+/[0-9]+\] ' || true; }

# Left out: two sweeps that run the code of the other tests over every zoo model and plan (5 and
# 2 minutes under ASan on 2 cores), and the GPT-3 175B search over 64 GPUs (4 minutes, the search
# the other planner tests run on smaller requests); the release run has them.
heavy='Planner.PruningNeverDropsTheTrueBest|Simulator.AnswersForEveryZooTransformerOnEveryCluster'
heavy+='|Planner.OnlyPlansThatFitAreReturned'
# Open MPI never frees some of its own allocations, and LeakSanitizer reports them at the exit of
# every program that starts MPI; leaks are checked by the fuzz targets, which do not.
ASAN_OPTIONS=detect_leaks=0 ctest --preset fuzz -L unit -E "$heavy" -j "$(nproc)" --timeout 900

scripts/fuzz.sh --runs "${SEXTANT_FUZZ_RUNS:-20000}"
