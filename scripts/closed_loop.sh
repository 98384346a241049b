#!/usr/bin/env bash
# closed_loop.sh: predict -> run -> compare on a new machine with moerun's CPU backend, so the simulator's
# predictions are checked against real steps of the same op graphs. Usage (after scripts/build.sh):
#   scripts/closed_loop.sh [RESULTS_DIR]        (default results/closed-loop-<host>; nothing here is committed)
#   env: MOEPLAN_BUILD (build folder, default build), RANKS (default 2; one core per rank, never more ranks
#        than cores when timing), MPIEXEC (default "mpiexec -n $RANKS", --allow-run-as-root added for root),
#        MODEL (default tests/closed_loop/small-moe.json), STEPS (7), WARMUP (2).
#
# Step 1. Hardware profile from microbenchmarks only: `moerun bench` (full, not --quick) measures GEMM,
#   grouped GEMM, attention (moerun's CPU kernel), STREAM and the collectives with every rank running, and
#   `moeplan calibrate --sources` fits RESULTS/hwprofiles/cpu-<host>.json from it and prints the fit report.
# Step 2. Stack profile of moerun on this CPU: the default `moerun` stack describes GPU kernels (launch costs,
#   DeepGEMM's grouped-GEMM curve, a comm SM fraction, overlaps). A calibration run (plan cal-dp2-ep2, which
#   is none of the validation plans: other sequence length and batch) is traced, and
#   `moeplan calibrate --trace` fits RESULTS/moerun-cpu.json (based on moerun's stack with the grouped GEMM as
#   the CPU replay runs it: one GEMM per expert) from its per-op times (grouped-GEMM efficiency,
#   memory-bound efficiency, host gaps, overlap). The calibration run's step time is never a target.
# Step 3. Validation: for each plan below (2 ranks), predict with `moeplan simulate PLAN --json` on the
#   calibrated profile and fitted stack, measure with `moerun run PLAN --steps STEPS --warmup WARMUP` (the
#   median of the measured steps), and join them with `moeplan compare`. Prints one row per plan (predicted,
#   measured median, relative error, the largest contributor to the error) and the median and max |error|.
#   Nothing is adjusted to make a prediction match a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${MOEPLAN_BUILD:-build}
RANKS=${RANKS:-2}
STEPS=${STEPS:-7}
WARMUP=${WARMUP:-2}
MODEL=${MODEL:-$ROOT/tests/closed_loop/small-moe.json}
HOST=$(hostname -s)
RESULTS=$(realpath -m "${1:-results/closed-loop-$HOST}")
if [[ -z "${MPIEXEC:-}" ]]; then
  MPIEXEC="mpiexec -n $RANKS"
  [[ $(id -u) == 0 ]] && MPIEXEC="mpiexec --allow-run-as-root -n $RANKS"
fi
MOEPLAN="$ROOT/$BUILD/planner/moeplan"
MOERUN="$ROOT/$BUILD/executor/moerun/moerun"
for bin in "$MOEPLAN" "$MOERUN"; do
  [[ -x $bin ]] || { echo "closed_loop.sh: $bin missing (build first, or set MOEPLAN_BUILD)" >&2; exit 2; }
done
mkdir -p "$RESULTS/hwprofiles" "$RESULTS/plans" "$RESULTS/predicted" "$RESULTS/measured"
echo "closed loop on $HOST, $RANKS ranks, results in $RESULTS; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- Step 1: microbenchmarks -> hardware profile ----
PROFILE="$RESULTS/hwprofiles/cpu-$HOST.json"
echo "== step 1: moerun bench (full) and moeplan calibrate --sources"
$MPIEXEC "$MOERUN" bench --out "$RESULTS/bench" --name "cpu-$HOST"
"$MOEPLAN" calibrate --sources "$RESULTS/bench" -o "$PROFILE" --report

# A plan file of MODEL on RANKS ranks, on the calibrated profile and (when given) the fitted stack.
#   plan NAME SEQ BATCH STACK PARALLELISM-FIELDS
plan() {
  local name=$1 seq=$2 batch=$3 stack=$4 fields=$5
  local stack_field=""
  [[ -n $stack ]] && stack_field="\"stack\": \"$stack\", "
  cat >"$RESULTS/plans/$name.json" <<EOF
{"model": "$MODEL", "hardware": "$PROFILE", $stack_field"gpus": $RANKS, "seq_len": $seq,
 "global_batch": $batch, "micro_batch": 1, $fields}
EOF
}

# ---- Step 2: a traced calibration run -> stack profile (its step time is never a target) ----
STACK="$RESULTS/moerun-cpu.json"
echo "== step 2: calibration run cal-dp2-ep2 (not a validation plan) and moeplan calibrate --trace"
plan cal-dp2-ep2 384 6 "" '"experts": {"ep": 2, "etp": 1, "dispatch": "all_to_all"}'
# --routing lowered: every rank runs the graph's rows, so the trace's op shapes are the graph's (drawn routing
# would give rank 0's own rows, which the trace does not carry).
$MPIEXEC "$MOERUN" run "$RESULTS/plans/cal-dp2-ep2.json" --steps 3 --warmup 1 --routing lowered \
  --out "$RESULTS/cal"
# The base of the fit: moerun's stack with the grouped GEMM as the CPU replay runs it (one Eigen GEMM per
# local expert, in a loop), a fact of the code, so the fit measures that loop's rate and does not price it as
# a tiled GPU grouped kernel.
python3 - "$ROOT/hwprofiles/stacks/moerun.json" "$STACK" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["name"] = "moerun-cpu"
src = ("this repository: executor/runtime/replay_runner.cpp (ReplayRunner::gemm): moerun's CPU replay runs "
       "a layer's experts as one Eigen GEMM per local expert, in a loop on its lane's thread")
s["grouped_gemm"]["implementation"] = {"value": "per_expert_streams", "basis": "derived", "source": src}
s["grouped_gemm"]["streams"] = {"value": 1, "basis": "derived", "source": src}
json.dump(s, open(sys.argv[2], "w"), indent=2)
EOF
read -r EXPERTS HIDDEN EFFN < <(python3 -c "
import json, sys; m = json.load(open('$MODEL'))
print(m['moe']['num_experts'] // 2, m['hidden_size'], m['moe']['expert_ffn_size'])")
"$MOEPLAN" calibrate --trace "$RESULTS/cal/trace.json" --hardware "$PROFILE" --stack "$STACK" \
  --moerun-experts "$EXPERTS" "$HIDDEN" "$EFFN" -o "$STACK" --report
echo "(the calibration run's step time was not used by the fit and is not a target)"

# ---- Step 3: validation plans: predict, measure, compare ----
echo "== step 3: validation plans"
NO_OVERLAP='"overlap": {"inter_op": false, "intra_op": false, "dp_comm": false, "pp_comm": false}'
WITH_OVERLAP='"overlap": {"inter_op": true, "intra_op": false, "dp_comm": true, "pp_comm": true}'
plan dp2-zero1 256 8 "$STACK" "\"data\": {\"zero\": 1}, $WITH_OVERLAP"
plan dp2-zero3 256 8 "$STACK" "\"data\": {\"zero\": 3}, $WITH_OVERLAP"
plan ep2-a2a 256 8 "$STACK" "\"experts\": {\"ep\": 2, \"etp\": 1, \"dispatch\": \"all_to_all\"}, $WITH_OVERLAP"
# Routing drawn from a skewed distribution (zipf:1.2): each step every rank runs the expert rows its experts
# drew, so the step is set by the busier rank, which the prediction prices by the routing model's expected
# busiest rank.
plan ep2-a2a-zipf 256 8 "$STACK" \
  "\"experts\": {\"ep\": 2, \"etp\": 1, \"dispatch\": \"all_to_all\"}, \"routing\": {\"distribution\": \"zipf:1.2\"}, $WITH_OVERLAP"
plan ep2-a2a-no-overlap 256 8 "$STACK" \
  "\"experts\": {\"ep\": 2, \"etp\": 1, \"dispatch\": \"all_to_all\"}, $NO_OVERLAP"
plan ep2-ag 256 8 "$STACK" "\"experts\": {\"ep\": 2, \"etp\": 1, \"dispatch\": \"all_gather\"}, $WITH_OVERLAP"
plan tp2 256 8 "$STACK" "\"attention\": {\"tp\": 2, \"sp\": 1, \"cp\": 1}, $NO_OVERLAP"
plan sp2 256 8 "$STACK" "\"attention\": {\"tp\": 1, \"sp\": 2, \"cp\": 1}, $WITH_OVERLAP"
plan pp2-1f1b 256 8 "$STACK" "\"pipeline\": {\"pp\": 2, \"vpp\": 1, \"schedule\": \"1f1b\"}, $WITH_OVERLAP"
# Context parallelism: each rank's attention is a local part (its own keys) and a remote part (the other
# rank's, after the K/V all-gather), run as the calls that do each op's FLOPs (workload::attention_calls).
plan cp2 512 8 "$STACK" "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 2}, $WITH_OVERLAP"
PLANS=(dp2-zero1 dp2-zero3 ep2-a2a ep2-a2a-zipf ep2-a2a-no-overlap ep2-ag tp2 sp2 pp2-1f1b cp2)
for p in "${PLANS[@]}"; do
  echo "-- $p (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  "$MOEPLAN" simulate "$RESULTS/plans/$p.json" --json >"$RESULTS/predicted/$p.json"
  $MPIEXEC "$MOERUN" run "$RESULTS/plans/$p.json" --steps "$STEPS" --warmup "$WARMUP" \
    --out "$RESULTS/measured/$p" >"$RESULTS/measured/$p.log" 2>&1 || {
    echo "moerun run $p failed:" >&2
    tail -5 "$RESULTS/measured/$p.log" >&2
    exit 1
  }
  "$MOEPLAN" compare "$RESULTS/predicted/$p.json" "$RESULTS/measured/$p/report.json" --json \
    >"$RESULTS/compare-$p.json"
  "$MOEPLAN" compare "$RESULTS/predicted/$p.json" "$RESULTS/measured/$p/report.json" --top 5 \
    >"$RESULTS/compare-$p.txt"
done

python3 - "$RESULTS" "${PLANS[@]}" <<'EOF'
import json, statistics, sys
results, plans = sys.argv[1], sys.argv[2:]
rows = []
print()
print("predicted = moeplan simulate on the calibrated CPU profile and fitted stack; measured = median of the")
print("measured steps of moerun run; error = (predicted - measured) / measured; the calibration run's step")
print("time is never a target")
print(f"{'plan':<20} {'predicted s':>12} {'measured s':>11} {'error':>8}  top error contributor")
for p in plans:
    c = json.load(open(f"{results}/compare-{p}.json"))
    top = c["contributors"][0]
    rows.append(c["end_to_end_error"])
    print(f"{p:<20} {c['predicted']['step_time_s']:12.4f} {c['measured']['step_time_s']:11.4f} "
          f"{100 * c['end_to_end_error']:+7.1f}%  {top['contributor']} ({top['delta_s']:+.4f} s)")
abs_err = [abs(e) for e in rows]
print(f"median |error| {100 * statistics.median(abs_err):.1f}%, max |error| {100 * max(abs_err):.1f}% "
      f"(target: median <= 10%, none above 20%)")
EOF
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
