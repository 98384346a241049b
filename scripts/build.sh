#!/usr/bin/env bash
# Configures and builds moeplan into build/ (CUDA backend on when nvcc is found). Usage: scripts/build.sh [cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >build.configure.log 2>&1 || {
  cat build.configure.log
  exit 1
}
mv build.configure.log build/configure.log
cmake --build build -j "$jobs"
