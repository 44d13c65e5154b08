#!/usr/bin/env bash
# The main job, end to end on this machine: sets up and builds, then shows what Sextant knows
# about a model and a cluster.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source scripts/env.sh
scripts/build.sh
sextant=build/release/cli/sextant
out="${SEXTANT_DEMO_OUT:-$root/out/demo}"
mkdir -p "$out"

echo "== The model: GPT-3 175B"
$sextant models show gpt3-175b
echo
echo "== The cluster: DGX A100"
$sextant clusters show dgx-a100
