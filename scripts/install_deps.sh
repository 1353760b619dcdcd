#!/usr/bin/env bash
# Installs ppbench's build and test dependencies from Debian (as root), only what is missing.
# Usage: scripts/install_deps.sh [--python]
#   --python also installs the analysis tools' modules (tools/*.py: h5py, matplotlib, numpy;
#   pandas for the CSV check of the tests) as Debian packages for Debian's /usr/bin/python3,
#   never with pip into a system interpreter. Elsewhere: a virtual environment with
#   `pip install -r tools/requirements.txt`.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libopenblas-dev
          nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev
          hdf5-tools)   # h5dump/h5ls: inspect results files (results/README.md), Slurm e2e checks
# apt-get install of those of the given Debian packages that are not installed yet; $1 labels
# the message.
install_missing() {
  local label=$1 p
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "[install] apt-get install ${missing[*]}$label"
  local sudo=
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_missing "" "${packages[@]}"
if [ "${1:-}" = "--python" ]; then
  install_missing " (for /usr/bin/python3)" python3 python3-h5py python3-matplotlib python3-numpy python3-pandas
fi
