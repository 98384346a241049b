#!/usr/bin/env bash
# All tests from a fresh clone: installs dependencies, builds (warnings are errors), runs ctest on both cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
