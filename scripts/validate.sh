#!/usr/bin/env bash
# Predicted vs measured on the validation set (tests/validation/cases): one row per case, then the median and
# maximum error. Builds first when build/planner/moeplan is missing. Usage: scripts/validate.sh [--json|--markdown] [CASE_ID ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/planner/moeplan ]] || scripts/build.sh >/dev/null
exec python3 scripts/validate.py --moeplan build/planner/moeplan "$@"
