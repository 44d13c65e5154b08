#!/usr/bin/env bash
# Configures and builds Sextant (release preset) after installing missing dependencies.
# Usage: scripts/build.sh [extra cmake --build args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
if [ ! -f build/release/CMakeCache.txt ]; then
  cmake --preset release >/dev/null
fi
# Progress lines filtered; the build's own status decides (pipefail), not the filter's.
cmake --build --preset release -j "$(nproc)" "$@" | { grep -v -E '^\[[0-9]+/[0-9]+\] ' || true; }
test -x build/release/cli/sextant
