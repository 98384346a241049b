#!/usr/bin/env bash
# Rebuilds the three Hopper hardware profiles from their committed calibration sources and prints each fit
# report. Usage: scripts/calibrate_hopper.sh   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
for name in h100-sxm h200-sxm h800-sxm; do
  build/planner/moeplan calibrate --sources "hwprofiles/sources/$name" -o "hwprofiles/$name.json" --report
done
