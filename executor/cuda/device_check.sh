#!/usr/bin/env bash
# The prepared device check (issue 6). On a machine with one Hopper GPU, CUDA, cuBLAS, cuDNN, NCCL and OpenMPI
# but none of our Debian packages and no network, it:
#   1. builds the project with the header-only dependencies carried in .devdeps/prefix.tar.gz
#      (pack_device_deps.sh) - the full build when an MPI compiler is there, else the GPU-only build;
#   2. runs every GPU test binary (kernels against the CPU kernels; the fused kernels, wmma and CUTLASS push
#      and gather, with 1, 2, 4 and 8 virtual ranks; NCCL on one rank, and its symmetric memory where NCCL gives a one-rank group one:
#      2.28.7 on);
#   3. runs the four kernel benchmarks (RESULT rows with the issue's targets);
#   4. with the full build: `moerun run --backend cuda` of executor/cuda/device_plan.json on the GPU, the
#      prediction of the same plan on the matching profile (h200-sxm), and `moeplan compare`; the same plan
#      again after about 45 s of its own steps (the sustained clocks of a long run); then the same
#      for device_plan_fused.json (intra-operator overlap: the experts' GEMMs on the fused kernels, one rank),
#      with its wmma kernels and with the CUTLASS kernels (--fused-kernels cutlass), and for device_plan.json with --host-sync (the host waits for each op), with --routing lowered
#      (every expert runs the graph's rows; by default each step's routing is drawn from the plan's) and
#      with --cuda-graph (the step captured once and replayed), and device_plan_fp8.json (the same plan in
#      FP8, blockwise: dense GEMMs as e4m3 after the quantiser, weight gradients as e4m3 into fp32); then
#      `moerun bench --backend cuda` into calibration tables and `moeplan calibrate --sources` of them
#      (gpu-bench/, gpu-bench.log);
#   5. where two GPUs answer, the 2-rank NCCL tests (groups, pipeline links) and device_plan_pp2.json (two
#      pipeline stages) on the CUDA replay with its comparison (run-pp2/);
# and prints a short table last. Before the build it runs executor/cuda/torch_kernels_bench.py where PyTorch
# is installed. Logs go to $OUT (the lent machine's return folder) or ./device_check_out: 24 files
# (gpu.txt, clocks.csv, torch_kernels.csv, build.log, tests.log, cublaslt.log, bench.log, compare.txt, run/,
# run-sustained/, run-fused/, run-fused-cutlass/, run-host-sync/, run-lowered/, run-graph/ and run-fp8/ report.json and
# trace.json; with two GPUs also run-pp2/'s), more than a lent machine returns, so point OUT elsewhere and
# pack them.
# Usage (repo root): executor/cuda/pack_device_deps.sh here, then on the device (carry .devdeps):
#   OUT=/tmp/dc executor/cuda/device_check.sh | tee $OUT/summary.txt; tar czf $OUT/dc.tgz -C /tmp dc
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/device_check_out}"
mkdir -p "$out"
t0=$SECONDS
jobs=$(nproc)
log() { echo "[device_check $((SECONDS - t0))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
# The SM clock, power and temperature once a second through the whole check (clocks.csv): a GPU held at its
# power limit lowers its clocks, and the hardware profiles' gpu.sustained_rate (the tensor-core rate under a
# step's sustained load against the burst-timed tables) rests on one H200 measurement; this log says at what
# clocks every table and replay below ran.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 1000 >"$out/clocks.csv" 2>&1 &
clock_log=$!
trap 'kill $clock_log 2>/dev/null' EXIT

# PyTorch's own kernels (the Megatron stacks' evidence: host time per eager call, memory-bound kernels,
# weight-gradient GEMMs accumulating into FP32, per-expert GEMM loops), before the build loads the CPUs.
if python3 -c "import torch" 2>/dev/null; then
  log "torch_kernels_bench.py"
  PYTHONUNBUFFERED=1 timeout -k 5 150 python3 executor/cuda/torch_kernels_bench.py >"$out/torch_kernels.csv" 2>&1
fi

prefix_root="$(mktemp -d)"
tar xzf .devdeps/prefix.tar.gz -C "$prefix_root" || {
  echo "device_check: .devdeps/prefix.tar.gz missing (run executor/cuda/pack_device_deps.sh and carry .devdeps)"
  exit 2
}
prefix="$prefix_root/prefix"

build=build-device
full=OFF
command -v mpicxx >/dev/null && full=ON
mode=(-DMOEPLAN_GPU_ONLY=ON)
gpu_targets=(moeplan_gpu_tests moerun_cuda_memory_tests moerun_cuda_gemm_tests moerun_cuda_attention_tests
  moerun_cuda_fused_tests moerun_cuda_memory_bench moerun_cuda_gemm_bench moerun_cuda_attention_bench
  moerun_cuda_fused_bench)
targets=("${gpu_targets[@]}")
if [[ $full == ON ]]; then
  mode=(-DMOEPLAN_GPU_ONLY=OFF)
  targets+=(moerun moeplan moerun_nccl_mpi_tests)
fi
configure() {
  cmake -S . -B "$build" -G Ninja "$@" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DMOEPLAN_WERROR=OFF -DMOEPLAN_HEADERS_PREFIX="$prefix" -DMOEPLAN_DEPS_DIR="$prefix/deps" >>"$out/build.log" 2>&1
}
log "configure (full build: $full)"
: >"$out/build.log"
if ! configure "${mode[@]}"; then
  if [[ $full == ON ]]; then  # e.g. MPI not found by CMake: the GPU-only build still checks the kernels
    log "full configure failed; GPU-only build instead"
    grep -E "CMake Error|Could NOT" "$out/build.log" | head -5
    full=OFF
    targets=("${gpu_targets[@]}")
    rm -rf "$build"
    configure -DMOEPLAN_GPU_ONLY=ON || { tail -30 "$out/build.log"; echo "device_check: configure failed"; exit 1; }
  else
    tail -30 "$out/build.log"
    echo "device_check: configure failed"
    exit 1
  fi
fi
log "build ${targets[*]} (-j$jobs)"
if ! ninja -C "$build" -j"$jobs" -k 0 "${targets[@]}" >>"$out/build.log" 2>&1; then
  grep -E "error" "$out/build.log" | head -40
  echo "device_check: build failed (continuing with what built)"
fi
log "build done"

summary=()
: >"$out/tests.log"
# cuBLASLt says why it refuses a GEMM only in its log (errors only: level 2); one log per binary (a binary
# may truncate the file it opens), gathered into cublaslt.log.
export CUBLASLT_LOG_LEVEL=2
: >"$out/cublaslt.log"
# The last case a binary started before it crashed, hung or was killed (doctest prints "TEST CASE:  name"
# before its crash report), from its output from line $1 of tests.log on.
last_case() { tail -n +"$1" "$out/tests.log" | awk '/^TEST CASE:  /{c = substr($0, 13)} END{print c}'; }
for t in moeplan_gpu_tests moerun_cuda_memory_tests moerun_cuda_gemm_tests moerun_cuda_attention_tests \
  moerun_cuda_fused_tests; do
  # The fused kernels wait on each other's signals: a signalling bug hangs rather than fails, so they get a
  # shorter leash than the others.
  limit=150 extra=()
  [[ $t == moerun_cuda_fused_tests ]] && limit=90 extra=(-d=yes)  # -d: each finished case's duration
  exe=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
  if [[ -z $exe ]]; then summary+=("$t: not built"); continue; fi
  log "$t"
  echo "==== $t" >>"$out/tests.log"
  start=$(wc -l <"$out/tests.log")
  export CUBLASLT_LOG_FILE="$prefix_root/cublaslt-$t.log"
  timeout -k 10 "$limit" "$exe" "${extra[@]}" >>"$out/tests.log" 2>&1
  rc=$?
  ((rc == 124)) && summary+=("$t: TIMED OUT after $limit s (a hang: tests.log lists the cases that finished)")
  summary+=("$t: exit $rc, $(grep -E '^\[doctest\] test cases' "$out/tests.log" | tail -1 | sed 's/\[doctest\] //')")
  # A crashed or hung case ends the binary: run the remaining cases without it, so one hides nothing else.
  # (doctest splits filters at commas: escape them.)
  crashed=$(last_case "$start")
  if ((rc >= 128 || rc == 124)) && [[ -n $crashed ]]; then
    echo "==== $t without the case that crashed or hung: $crashed" >>"$out/tests.log"
    timeout -k 10 "$limit" "$exe" "${extra[@]}" -tce="${crashed//,/\\,}" >>"$out/tests.log" 2>&1
    summary+=("$t without '$crashed': exit $?, $(grep -E '^\[doctest\] test cases' "$out/tests.log" | tail -1 | sed 's/\[doctest\] //')")
  fi
  [[ -f $prefix_root/cublaslt-$t.log ]] && cat "$prefix_root/cublaslt-$t.log" >>"$out/cublaslt.log"
done
grep -E "ERROR|FATAL|failed" "$out/tests.log" | grep -v "0 failed" | head -20
# On the GPU machine a skipped GPU test is a failure (a driver too old for CUDA 13 makes every test skip).
skips=$(grep -c "skipped: no CUDA device" "$out/tests.log")
((skips > 0)) && summary+=("GPU tests SKIPPED ON THE GPU MACHINE: $skips (no device answered; see tests.log)")

: >"$out/bench.log"
unset CUBLASLT_LOG_LEVEL CUBLASLT_LOG_FILE
for b in moerun_cuda_memory_bench moerun_cuda_gemm_bench moerun_cuda_attention_bench moerun_cuda_fused_bench; do
  exe=$(find "$build" -name "$b" -type f -perm -u+x | head -1)
  if [[ -z $exe ]]; then summary+=("$b: not built"); continue; fi
  log "$b"
  echo "==== $b" >>"$out/bench.log"
  timeout 120 "$exe" >>"$out/bench.log" 2>&1
  summary+=("$b: exit $?")
done

compare_lines=("moerun run --backend cuda + moeplan compare: needs the full build (no MPI compiler here)")
if [[ $full == ON && -x $build/executor/moerun/moerun && -x $build/planner/moeplan ]]; then
  compare_lines=()
  mpirun=(mpirun -n 1)
  [[ $(id -u) == 0 ]] && mpirun+=(--allow-run-as-root)
  : >"$out/compare.txt"
  # The two plans as moerun runs them by default (ops enqueued, one host wait per step; the unfused plan's
  # routing drawn from its distribution, so its experts' rows differ), then the unfused plan with the host
  # waiting for each op (--host-sync) and with every expert running the graph's rows (--routing lowered).
  # The unfused plan again after about 45 s of its own steps (:sustained, --warmup 150): the step at the
  # clocks a long run holds, against the prediction at the profile's sustained rate (clocks.csv has both
  # runs' clocks). The fused plan also on the CUTLASS kernels (--fused-kernels cutlass: its grouped GEMM +
  # reduce-scatter and all-gather + grouped GEMM ops; never run before this check), against the prediction
  # that prices the wmma kernels.
  # Then the unfused plan's step captured as a CUDA graph (--cuda-graph: never run before this check). Last,
  # the unfused plan in FP8 (blockwise recipe): its dense GEMMs as e4m3 after the quantiser, their weight
  # gradients as e4m3 accumulated into fp32 (never run).
  for run in device_plan device_plan:sustained device_plan_fused device_plan_fused:cutlass device_plan:host-sync \
    device_plan:lowered device_plan:graph device_plan_fp8; do
    plan=${run%%:*} dir=run extra=()
    [[ $plan == device_plan_fused ]] && dir=run-fused
    [[ $plan == device_plan_fp8 ]] && dir=run-fp8
    [[ $run == *:host-sync ]] && dir=run-host-sync extra=(--host-sync)
    [[ $run == *:lowered ]] && dir=run-lowered extra=(--routing lowered)
    [[ $run == *:graph ]] && dir=run-graph extra=(--cuda-graph)
    [[ $run == *:cutlass ]] && dir=run-fused-cutlass extra=(--fused-kernels cutlass)
    steps=(--steps 5 --warmup 2)
    [[ $run == *:sustained ]] && dir=run-sustained steps=(--steps 20 --warmup 150)
    log "moerun run --backend cuda executor/cuda/$plan.json ${extra[*]}"
    echo "==== $run" >>"$out/compare.txt"
    if timeout -k 10 180 "${mpirun[@]}" "$build/executor/moerun/moerun" run "executor/cuda/$plan.json" --backend cuda \
        "${extra[@]}" "${steps[@]}" --out "$out/$dir" >>"$out/compare.txt" 2>&1 &&
      "$build/planner/moeplan" simulate "executor/cuda/$plan.json" --json >"$prefix_root/pred-$plan.json" \
        2>>"$out/compare.txt" &&
      "$build/planner/moeplan" compare "$prefix_root/pred-$plan.json" "$out/$dir/report.json" >"$prefix_root/cmp.txt" 2>&1; then
      cat "$prefix_root/cmp.txt" >>"$out/compare.txt"
      compare_lines+=("$run: $(grep -m1 'end-to-end error' "$prefix_root/cmp.txt")")
      compare_lines+=("$run: $(grep -m1 '^memory per GPU' "$prefix_root/cmp.txt" | cut -c1-200)")
    else
      [[ -f $prefix_root/cmp.txt ]] && cat "$prefix_root/cmp.txt" >>"$out/compare.txt"
      compare_lines+=("$run: moerun run --backend cuda + compare FAILED (see compare.txt): $(tail -3 "$out/compare.txt" | tr '\n' ' ')")
    fi
    rm -f "$prefix_root/cmp.txt"
  done
  # The GPU bench into calibration tables (never run before this check), then the profile they make, fitted
  # and reported table by table. Fields the bench cannot measure on one GPU come from h200-sxm.
  # Last in it, the sustained-rate measurement (sustained.csv, gpu.sustained_rate in profile.json): 30 s of
  # back-to-back GEMMs between two bursts, half the default, to keep the check inside its time.
  log "moerun bench --backend cuda"
  if timeout -k 10 300 "${mpirun[@]}" "$build/executor/moerun/moerun" bench --backend cuda --base h200-sxm \
      --sustain-s 30 --name gpu-bench --out "$out/gpu-bench" >"$out/gpu-bench.log" 2>&1 &&
    "$build/planner/moeplan" calibrate --sources "$out/gpu-bench" -o "$out/gpu-bench/profile-built.json" \
      --report >>"$out/gpu-bench.log" 2>&1; then
    compare_lines+=("moerun bench --backend cuda: $(grep -m1 '^moerun bench' "$out/gpu-bench.log")")
  else
    compare_lines+=("moerun bench --backend cuda + calibrate FAILED (see gpu-bench.log): $(tail -3 "$out/gpu-bench.log" | tr '\n' ' ')")
  fi
  # Where two GPUs answer (NCCL refuses two ranks on one GPU): the plan's NCCL groups and the pipeline's
  # directed links on two ranks, then the two-stage plan on the CUDA replay (its sends over their links, each
  # source stage's receives on their own stream) and its comparison (run-pp2/). Never run before this check.
  if (($(nvidia-smi -L | grep -c '^GPU') >= 2)); then
    mpirun2=(mpirun -n 2)
    [[ $(id -u) == 0 ]] && mpirun2+=(--allow-run-as-root)
    exe=$(find "$build" -name moerun_nccl_mpi_tests -type f -perm -u+x | head -1)
    if [[ -n $exe ]]; then
      log "moerun_nccl_mpi_tests on 2 ranks"
      echo "==== moerun_nccl_mpi_tests (2 ranks)" >>"$out/tests.log"
      timeout -k 10 120 "${mpirun2[@]}" "$exe" >>"$out/tests.log" 2>&1
      summary+=("moerun_nccl_mpi_tests (2 ranks): exit $?")
    fi
    log "moerun run --backend cuda executor/cuda/device_plan_pp2.json (2 ranks)"
    echo "==== device_plan_pp2" >>"$out/compare.txt"
    if timeout -k 10 180 "${mpirun2[@]}" "$build/executor/moerun/moerun" run executor/cuda/device_plan_pp2.json \
        --backend cuda --steps 5 --warmup 2 --out "$out/run-pp2" >>"$out/compare.txt" 2>&1 &&
      "$build/planner/moeplan" simulate executor/cuda/device_plan_pp2.json --json >"$prefix_root/pred-pp2.json" \
        2>>"$out/compare.txt" &&
      "$build/planner/moeplan" compare "$prefix_root/pred-pp2.json" "$out/run-pp2/report.json" >>"$out/compare.txt" 2>&1; then
      compare_lines+=("device_plan_pp2 (2 GPUs): $(grep 'end-to-end error' "$out/compare.txt" | tail -1)")
    else
      compare_lines+=("device_plan_pp2 (2 GPUs): moerun run --backend cuda + compare FAILED (see compare.txt)")
    fi
  else
    compare_lines+=("device_plan_pp2 and the 2-rank NCCL tests: not run (one GPU; NCCL needs one per rank)")
  fi
fi

echo
echo "==================== device check: $(head -1 "$out/gpu.txt") ===================="
printf '%s\n' "${summary[@]}"
printf '%s\n' "${compare_lines[@]}"
echo "| family | kernel | shape | time | rate | reference | ratio | target | verdict |"
grep '^RESULT |' "$out/bench.log" | sed 's/^RESULT //'
echo "total $((SECONDS - t0)) s"
