#!/usr/bin/env bash
# Fails when any tracked C++/CUDA file differs from clang-format's output (.clang-format at the root).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
clang-format --dry-run --Werror "${files[@]}"
echo "check_format: ${#files[@]} files formatted"
