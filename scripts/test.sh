#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest), then prints the summary. Works on a fresh machine.
# Usage: scripts/test.sh [ctest args, e.g. -L unit]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
scripts/build.sh
ctest --test-dir build/release --output-on-failure -j "$(nproc)" --timeout 900 "$@"
