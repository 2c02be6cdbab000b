#!/usr/bin/env bash
# Installs every Debian package gradsync needs. Idempotent: when everything is there it only
# checks and prints one line. Run as root (or with sudo) on Debian 12.
#   scripts/setup.sh           build, test and run dependencies
#   scripts/setup.sh --bench   also the baselines bench/ compares against: Gloo, OpenMPI
set -euo pipefail

packages=(
  # toolchain
  cmake g++ make pkg-config git
  # scripts/fuzz.sh: clang, and its libFuzzer and sanitizer runtimes (clang only recommends them)
  clang libclang-rt-14-dev
  # libraries (ARCHITECTURE.md: ZeroMQ + cppzmq, Protocol Buffers, Boost, OpenBLAS, GoogleTest)
  libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler
  libboost-dev libboost-program-options-dev
  libopenblas-dev zlib1g-dev
  # the all-reduce ring's authentication and encryption (libzmq links libsodium too)
  libsodium-dev
  libgtest-dev libgmock-dev
  # data: Fashion-MNIST IDX files under /usr/share/datasets/fashion-mnist
  dataset-fashion-mnist
  # network namespaces and link shaping for multi-process tests and slow-link experiments
  iproute2
  # cluster launchers, for tests/cluster/ (a single-host Slurm, mpirun across namespace hosts)
  slurm-wlm munge openmpi-bin
  # the experiments' PNG plots
  gnuplot-nox
  # the Python frontend (python/): pybind11 for the binding, PyTorch 1.13 (CPU) and pytest
  python3-dev python3-pybind11 python3-numpy python3-torch python3-pytest
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(libgloo-dev libopenmpi-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
