#!/usr/bin/env bash
# The loop on this machine: builds Sextant and runs `sextant loop` (loop/closed_loop.hpp): measure
# (bench comm, or with --gpu bench compute; training runs of a fixed set of plans in interleaved
# rounds between core checks), fit the cluster file to the fit plans, predict every plan -- the
# held-out ones too -- with the fitted file, and report predicted against measured, Kendall's tau
# and the regret of the predicted best. `sextant loop --help` lists the flags; docs/CALIBRATION.md
# says what the figures mean.
#
# Usage: scripts/calibrate-local.sh [--json] [--steps N] [--repeats R] [--force] [--out DIR] [--gpu] [--refit]
#                                   [--quiet-wait S]
#   --gpu  uses build/cuda/cli/sextant (scripts/gpu-check.sh builds it; $SEXTANT names another) and
#          calibrates h100-1gpu ($SEXTANT_GPU_CLUSTER names another)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
gpu=0
for a in "$@"; do [ "$a" = --gpu ] && gpu=1; done
source scripts/env.sh
if [ "$gpu" -eq 1 ]; then
  exec "${SEXTANT:-$root/build/cuda/cli/sextant}" loop --cluster "${SEXTANT_GPU_CLUSTER:-h100-1gpu}" "$@"
fi
scripts/build.sh >/dev/null
exec "$root/build/release/cli/sextant" loop "$@"
