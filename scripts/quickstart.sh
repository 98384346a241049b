#!/usr/bin/env bash
# The main job from a fresh clone: installs dependencies, builds, and runs moeplan on its built-in default.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh >/dev/null
build/planner/moeplan inspect "$@"
