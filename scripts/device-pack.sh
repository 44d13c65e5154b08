#!/usr/bin/env bash
# Packs the CUDA build made on this (build) machine for the GPU machine, so that a device call spends
# no device time compiling: build/cuda's sextant, exec_test, exec_mpi_test and the CUDA module,
# stripped, into .device/bin (git-ignored; pass ".device" in the device tool's carry). Build first:
#   cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEXTANT_ENABLE_CUDA=REQUIRE \
#     -DCMAKE_CUDA_ARCHITECTURES=90 -DSEXTANT_NATIVE=OFF -DSEXTANT_BUILD_BENCH=OFF
#   cmake --build build/cuda --target sextant exec_test exec_mpi_test sextant_cuda
# (SEXTANT_NATIVE=OFF: the GPU machine's CPU may lack this one's instructions.) scripts/gpu-check.sh
# installs them into build/cuda there when it has none, and links this checkout's path to the
# checkout there, since the tests carry their source folder compiled in.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
b="$root/build/cuda"
dest="$root/.device/bin"
rm -rf "$dest"
mkdir -p "$dest"
for f in cli/sextant tests/exec_test tests/exec_mpi_test lib/libsextant_cuda.so; do
  [[ -f "$b/$f" ]] || { echo "device-pack: $b/$f is missing: build it first (see this script's header)" >&2; exit 1; }
  strip -o "$dest/$(basename "$f")" "$b/$f"
done
echo "$root" >"$dest/source_dir"
git -C "$root" rev-parse HEAD >"$dest/commit"
du -sh "$dest"
