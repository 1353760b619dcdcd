#!/usr/bin/env bash
# Installs ppbench's build and test dependencies from Debian (as root), only what is missing.
# Usage: scripts/install_deps.sh [--python] [--torch]
#   --python also installs the analysis tools' modules (tools/*.py: h5py, matplotlib, numpy;
#   pandas for the CSV check of the tests) as Debian packages for Debian's /usr/bin/python3,
#   never with pip into a system interpreter. Elsewhere: a virtual environment with
#   `pip install -r tools/requirements.txt`.
#   --torch also installs Debian's python3-torch, the PyTorch eager baseline of
#   build/ppb_cpu_bench and scripts/torch_layer.py (no test needs it).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev libopenblas-dev
          libdnnl-dev   # oneDNN: the CPU backend's GEMM where it beats OpenBLAS (src/backend/cpu/cpu_gemm.h)
          nlohmann-json3-dev libcli11-dev libgtest-dev libbenchmark-dev
          libboost-dev  # Boost.Math, header-only: t and normal quantiles of the gains' CIs
          hdf5-tools    # h5dump/h5ls: inspect results files (results/README.md), Slurm e2e checks
          xz-utils)     # the GPU bundle (scripts/gpu_check.sh --pack, test e2e_gpu_bundle)
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
for arg in "$@"; do
  case "$arg" in
    --python) install_missing " (for /usr/bin/python3)" python3 python3-h5py python3-matplotlib python3-numpy python3-pandas ;;
    --torch) install_missing " (PyTorch for /usr/bin/python3)" python3 python3-torch ;;
    *) echo "install_deps.sh: unknown option '$arg' (valid: --python, --torch)" >&2; exit 2 ;;
  esac
done
