#!/usr/bin/env bash
# Prepares, on a build machine, what the GPU machine lacks and cannot download: CLI11 and toml++
# (header-only, as Sextant uses them), extracted from Debian's packages into .device/cli11 and
# .device/tomlplusplus (git-ignored). Pass `.device` in the device
# tool's `carry` so that scripts/gpu-check.sh finds it there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$root/.device"
cd "$root/.device"
if [[ ! -d cli11/usr/share/cmake/CLI11 ]]; then
  rm -f libcli11-dev_*.deb
  apt-get download libcli11-dev
  dpkg -x libcli11-dev_*.deb cli11
fi
if [[ ! -d tomlplusplus/usr/lib/x86_64-linux-gnu/cmake/tomlplusplus ]]; then
  rm -f libtomlplusplus-dev_*.deb
  apt-get download libtomlplusplus-dev
  dpkg -x libtomlplusplus-dev_*.deb tomlplusplus
fi
echo "CLI11 ready in $root/.device/cli11, toml++ in $root/.device/tomlplusplus"
