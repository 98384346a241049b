#!/usr/bin/env bash
# The main job from a fresh clone: installs dependencies, builds, and plans the built-in default job
# (Mixtral-8x22B on 128 H100s, seq 4096, global batch 256): the top plans ranked by simulated tokens/s.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh >/dev/null
build/planner/moeplan plan "$@"
