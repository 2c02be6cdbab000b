#!/usr/bin/env bash
# Fetches, on this machine, the Debian packages that scripts/gpu-check.sh needs on a lent GPU
# machine, which reaches no package registry: the build dependencies and the libraries they
# load (ldd of the binaries, less libc, libstdc++ and zlib), and Fashion-MNIST. They land in
# .gpu-debs/ (ignored by git; carry it to the GPU machine), about 60 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  # build: headers, CMake configs, static GoogleTest, protoc, pkg-config
  libzmq3-dev cppzmq-dev libsodium-dev libprotobuf-dev protobuf-compiler libprotoc32
  libboost-dev libboost1.74-dev libboost-program-options-dev libboost-program-options1.74-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0 zlib1g-dev
  libgtest-dev libgmock-dev googletest pkgconf pkgconf-bin libpkgconf3 pkg-config
  # run: what the binaries load
  libzmq5 libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
  libprotobuf32 libboost-program-options1.74.0 libopenblas0-pthread libgfortran5 libquadmath0
  # data: Fashion-MNIST for the CPU experiments that need the GPU machine's cores (30 MB)
  dataset-fashion-mnist
)
mkdir -p .gpu-debs
cd .gpu-debs
missing=()
for p in "${packages[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  # apt-get download runs as _apt where it can; a root-owned folder is fine either way.
  apt-get download "${missing[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
fi
echo "gpu-bundle: $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .gpu-debs/"
