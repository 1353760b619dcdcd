#!/usr/bin/env bash
# Installs ppbench's build and test dependencies from Debian (as root), only what is missing.
# Usage: scripts/install_deps.sh [--python]   (--python also pip-installs tools/requirements.txt)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libopenblas-dev
          nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev
          hdf5-tools)   # h5dump/h5ls: inspect results files (results/README.md), Slurm e2e checks
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install] apt-get install ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "${1:-}" = "--python" ]; then
  if ! python3 -c 'import h5py, matplotlib, numpy' 2>/dev/null; then
    echo "[install] pip install -r tools/requirements.txt"
    python3 -m pip install -q -r tools/requirements.txt || echo "[install] warning: pip install failed; the plot test will be skipped"
  fi
fi
