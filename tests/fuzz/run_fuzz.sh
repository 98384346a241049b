#!/usr/bin/env bash
# Builds the loader fuzzer with clang (ASan + UBSan + libFuzzer) and runs it for a bounded time on a seed corpus of
# the shipped models, profiles and the bad-input corpus. Prints the executed-input count; exits non-zero on a crash.
# Usage: tests/fuzz/run_fuzz.sh [seconds=60] [build dir=build-fuzz]
set -euo pipefail
seconds=${1:-60}
build=${2:-build-fuzz}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEPLAN_FUZZ=ON \
  -DMOEPLAN_CUDA=OFF >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" --target moeplan_fuzz_loaders >"$build/build.log" 2>&1 || { tail -40 "$build/build.log"; exit 1; }

corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp models/*.json hwprofiles/*.json "$corpus"/
find tests/bad_input -name '*.json' -exec sh -c 'cp "$1" "$2/bad_$(echo "$1" | tr / _)"' _ {} "$corpus" \;

log="$build/fuzz.log"
set +e
"$build/tests/fuzz/moeplan_fuzz_loaders" "$corpus" -max_total_time="$seconds" -print_final_stats=1 \
  -max_len=65536 -timeout=10 -rss_limit_mb=4096 -artifact_prefix="$build/" >"$log" 2>&1
rc=$?
set -e
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
crashes=$(find "$build" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
echo "fuzz: json loaders ran ${runs} inputs in ${seconds} s, ${crashes} crashes (libFuzzer exit ${rc})"
if [[ $rc -ne 0 || $crashes -ne 0 ]]; then
  tail -40 "$log"
  exit 1
fi
