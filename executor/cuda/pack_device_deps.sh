#!/usr/bin/env bash
# Packs what a GPU-only build needs beyond CUDA, cuBLAS, cuDNN and NCCL into one archive that travels with the
# working tree to a lent GPU machine (which has no package registry): the headers of Eigen, fmt and doctest
# (from this machine's Debian packages) and of CUTLASS and the cuDNN frontend (from PyPI, unpacked into .deps/
# by scripts/install_deps.sh). Writes .devdeps/prefix.tar.gz (ignored by git); device_check.sh unpacks it.
# Usage: executor/cuda/pack_device_deps.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[[ -f $root/.deps/cutlass/include/cutlass/cutlass.h ]] || "$root/scripts/install_deps.sh"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
p="$stage/prefix"
mkdir -p "$p/include/eigen3" "$p/cmake" "$p/deps"
cp -r /usr/include/eigen3/Eigen "$p/include/eigen3/"
cp -r /usr/include/fmt /usr/include/doctest "$p/include/"
cp /usr/lib/cmake/doctest/doctest.cmake /usr/lib/cmake/doctest/doctestAddTests.cmake "$p/cmake/"
cp -r "$root/.deps/cutlass" "$root/.deps/cudnn_frontend" "$p/deps/"

mkdir -p "$root/.devdeps"
tar czf "$root/.devdeps/prefix.tar.gz.tmp" -C "$stage" prefix
mv "$root/.devdeps/prefix.tar.gz.tmp" "$root/.devdeps/prefix.tar.gz"
echo "pack_device_deps: $(du -h "$root/.devdeps/prefix.tar.gz" | cut -f1) in .devdeps/prefix.tar.gz"
