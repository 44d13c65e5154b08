#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest), then prints the summary. Works on a fresh machine.
# The whole run (no arguments, what CI does) then repeats the readers' and fits' unit tests under
# ASan + UBSan and runs every fuzz target on a fixed set of inputs (scripts/sanitize.sh, ~15
# minutes on 2 cores); SEXTANT_SKIP_SANITIZERS=1 leaves that out.
# Usage: scripts/test.sh [ctest args, e.g. -L unit: the release tests only]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
scripts/build.sh
# setup.sh installed Slurm; as root the launch test can start it, so a skip there is a failure.
if [ "$(id -u)" -eq 0 ]; then export SEXTANT_REQUIRE_SLURM=1; fi
ctest --test-dir build/release --output-on-failure -j "$(nproc)" --timeout 900 "$@"
if [ $# -eq 0 ] && [ "${SEXTANT_SKIP_SANITIZERS:-0}" != 1 ]; then
  scripts/sanitize.sh
fi
# What this machine is, for the record of the run: the calibration loop's figures depend on it
# (issue 63), and a shared core shows as a co-run slowdown.
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores," \
  "$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p') thread(s) per core"
build/release/cli/sextant bench cores --co-run || true
