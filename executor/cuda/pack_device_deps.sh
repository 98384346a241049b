#!/usr/bin/env bash
# Packs what a build on a lent GPU machine needs beyond CUDA, cuBLAS, cuDNN, NCCL and OpenMPI (which it has)
# into one archive that travels with the working tree (the machine reaches no package registry): the headers
# of Eigen, fmt, doctest, nlohmann_json, CLI11 and the Boost headers the simulator's engine includes (found
# with the compiler's dependency list) from this machine's Debian packages, and of CUTLASS and the cuDNN
# frontend (from PyPI, unpacked into .deps/ by scripts/install_deps.sh). Writes .devdeps/prefix.tar.gz
# (ignored by git); device_check.sh unpacks it.
# Usage: executor/cuda/pack_device_deps.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[[ -f $root/.deps/cutlass/include/cutlass/cutlass.h ]] || "$root/scripts/install_deps.sh"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
p="$stage/prefix"
mkdir -p "$p/include/eigen3" "$p/cmake" "$p/deps"
cp -r /usr/include/eigen3/Eigen "$p/include/eigen3/"
cp -r /usr/include/fmt /usr/include/doctest /usr/include/nlohmann /usr/include/CLI "$p/include/"
# Boost: only the headers engine.cpp and topology.cpp include, transitively (about 1,500 of Boost's files).
g++ -std=c++20 -I"$root" -M "$root/simulator/engine/engine.cpp" "$root/simulator/engine/topology.cpp" |
  tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
  while read -r f; do mkdir -p "$p/include/$(dirname "${f#/usr/include/}")" && cp "$f" "$p/include/${f#/usr/include/}"; done
cp /usr/lib/cmake/doctest/doctest.cmake /usr/lib/cmake/doctest/doctestAddTests.cmake "$p/cmake/"
cp -r "$root/.deps/cutlass" "$root/.deps/cudnn_frontend" "$p/deps/"

mkdir -p "$root/.devdeps"
tar czf "$root/.devdeps/prefix.tar.gz.tmp" -C "$stage" prefix
mv "$root/.devdeps/prefix.tar.gz.tmp" "$root/.devdeps/prefix.tar.gz"
echo "pack_device_deps: $(du -h "$root/.devdeps/prefix.tar.gz" | cut -f1) in .devdeps/prefix.tar.gz"
