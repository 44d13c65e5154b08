#!/usr/bin/env bash
# Installs Sextant's build, test and notebook dependencies from Debian's packages when missing.
# Idempotent and quiet when everything is already there. Needs root (or sudo) only when installing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev nlohmann-json3-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  libopenmpi-dev openmpi-bin
  zlib1g-dev  # gzip-compressed traces (ours and PyTorch's)
  libtomlplusplus-dev  # TorchTitan's TOML job configs (sextant import)
  clang  # the sanitizer build and the libFuzzer targets (scripts/fuzz.sh; libFuzzer comes with it)
  python3-matplotlib python3-pandas python3-nbconvert python3-nbclient python3-ipykernel jupyter-nbconvert
  python3-torch  # the independent reference the executor's losses are checked against
  munge slurmctld slurmd slurm-client  # the one-node Slurm of the launch test (tests/slurm)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq >/dev/null
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
