#!/usr/bin/env python3
"""Predicted vs measured on the validation set (tests/validation/cases/*.json): public end-to-end training
measurements that no profile is derived from. Prints one row per case, the median / max error, and for each
pair of cases of the same job (model, hardware, GPUs, sequence length, precision) whose measurements differ by
10% or more, whether the prediction orders them the same way.

Usage: scripts/validate.py [--moeplan build/planner/moeplan] [--json] [--markdown] [CASE_ID ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_cases(ids):
    folder = os.path.join(ROOT, "tests", "validation", "cases")
    cases = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name)) as f:
            c = json.load(f)
        if ids and c["id"] not in ids:
            continue
        cases.append(c)
    return cases


def predict(moeplan, plan):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        with open(path, "w") as f:
            json.dump(plan, f)
        run = subprocess.run([moeplan, "simulate", path, "--json"], capture_output=True, text=True)
        # Exit 3 with a report: the plan does not fit (the report says so); other failures have no report.
        if run.returncode in (0, 3) and run.stdout.strip():
            report = json.loads(run.stdout)
            if report.get("valid", True):
                return report
        return {"error": (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moeplan", default=os.path.join(ROOT, "build", "planner", "moeplan"))
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
    ap.add_argument("--check-complete", action="store_true",
                    help="exit 1 when a case is refused (the errors themselves are reported, not checked)")
    ap.add_argument("ids", nargs="*")
    args = ap.parse_args()
    if not os.access(args.moeplan, os.X_OK):
        print(f"validate: {args.moeplan} not found (build first: scripts/build.sh)", file=sys.stderr)
        return 2

    rows = []
    for c in load_cases(set(args.ids)):
        m = c["measured"].get("tokens_per_s_per_gpu")
        p = predict(args.moeplan, c["plan"])
        plan = c["plan"]
        job = (plan["model"], plan["hardware"], plan["gpus"], plan["seq_len"], plan.get("precision", "bf16"))
        row = {"id": c["id"], "stack": plan.get("stack", "moerun"), "precision": plan.get("precision", "bf16"),
               "measured": m, "job": job}
        if "error" in p:
            row["error"] = " ".join(p["error"])
        else:
            pred = p["tokens_per_s_per_gpu"]
            lo, hi = p["tokens_per_s_range"]
            gpus = c["plan"]["gpus"]
            # The range over the stack's unmeasured numbers (each at the ends of its stated range).
            alo, ahi = p.get("assumptions", {}).get("tokens_per_s_per_gpu_range", [pred, pred])
            row.update(
                assumed_low=alo,
                assumed_high=ahi,
                in_assumed=alo <= m <= ahi,
                most_sensitive=next((n["number"] for n in p.get("assumptions", {}).get("numbers", [])), None),
                predicted=pred,
                low=lo / gpus,
                high=hi / gpus,
                rel_error=pred / m - 1.0,
                in_range=lo / gpus <= m <= hi / gpus,
                memory_GiB=p["memory"]["per_gpu_bytes"] / 2**30,
                fits=p["memory"]["fits"],
                hypothetical=p.get("provenance", {}).get("hypothetical"),
            )
        rows.append(row)

    # Relative claims: of two layouts of one job measured >= 10% apart, the prediction must name the faster.
    pairs = []
    done = [r for r in rows if "rel_error" in r]
    for i, a in enumerate(done):
        for b in done[i + 1:]:
            if a["job"] != b["job"]:
                continue
            fast, slow = (a, b) if a["measured"] >= b["measured"] else (b, a)
            if fast["measured"] < 1.10 * slow["measured"]:
                continue
            pairs.append({"faster": fast["id"], "slower": slow["id"],
                          "measured_ratio": fast["measured"] / slow["measured"],
                          "predicted_ratio": fast["predicted"] / slow["predicted"],
                          "agrees": fast["predicted"] > slow["predicted"]})
    for r in rows:
        r.pop("job")

    errs = [abs(r["rel_error"]) for r in rows if "rel_error" in r]
    summary = {
        "cases": len(rows),
        "predicted": len(errs),
        "median_abs_error": statistics.median(errs) if errs else None,
        "max_abs_error": max(errs) if errs else None,
        "in_range": sum(1 for r in rows if r.get("in_range")),
        "in_assumed": sum(1 for r in rows if r.get("in_assumed")),
        "fit": sum(1 for r in rows if r.get("fits")),
        "pairs": len(pairs),
        "pairs_agree": sum(1 for q in pairs if q["agrees"]),
    }
    if args.json:
        print(json.dumps({"rows": rows, "pairs": pairs, "summary": summary}, indent=2))
        return 0
    if args.markdown:
        print("| case | stack | precision | measured tok/s/GPU | predicted (range) | error | over assumptions | fits |")
        print("|---|---|---|---:|---:|---:|---:|---|")
        for r in rows:
            if "error" in r:
                print(f"| {r['id']} | {r['stack']} | {r['precision']} | {r['measured']:.0f} | refused: {r['error']} | | | |")
                continue
            print(f"| {r['id']} | {r['stack']} | {r['precision']} | {r['measured']:.0f} | {r['predicted']:.0f} "
                  f"({r['low']:.0f}-{r['high']:.0f}) | {100 * r['rel_error']:+.1f}% | "
                  f"{r['assumed_low']:.0f}-{r['assumed_high']:.0f}{' (in)' if r['in_assumed'] else ''} | "
                  f"{'yes' if r['fits'] else 'no'} ({r['memory_GiB']:.1f} GiB) |")
    else:
        print(f"{'case':44s} {'stack':24s} {'measured':>9s} {'predicted':>9s} {'range':>15s} {'error':>8s} "
              f"{'in':>3s} {'assumed':>15s} {'in':>3s} {'mem GiB':>7s}")
        for r in rows:
            if "error" in r:
                print(f"{r['id']:44s} {r['stack']:24s} {r['measured']:9.0f}  refused: {r['error']}")
                continue
            print(f"{r['id']:44s} {r['stack']:24s} {r['measured']:9.0f} {r['predicted']:9.0f} "
                  f"{r['low']:7.0f}-{r['high']:<7.0f} {100 * r['rel_error']:+7.1f}% "
                  f"{'yes' if r['in_range'] else 'no':>3s} {r['assumed_low']:7.0f}-{r['assumed_high']:<7.0f} "
                  f"{'yes' if r['in_assumed'] else 'no':>3s} {r['memory_GiB']:7.1f}")
    if pairs:
        print("\nlayouts of one job measured >= 10% apart (faster / slower, measured and predicted ratio):")
        for q in pairs:
            print(f"  {q['faster']} / {q['slower']}: {q['measured_ratio']:.2f} vs {q['predicted_ratio']:.2f}"
                  f" {'agrees' if q['agrees'] else 'WRONG ORDER'}")
    refused = [r["id"] for r in rows if "error" in r]
    if errs:
        print(f"\n{summary['predicted']} of {summary['cases']} cases predicted: median |error| "
              f"{100 * summary['median_abs_error']:.1f}%, max {100 * summary['max_abs_error']:.1f}%; "
              f"measurement inside the printed range in {summary['in_range']}, inside the range over the "
              f"stacks' assumptions in {summary['in_assumed']}; predicted to fit in "
              f"{summary['fit']}; order right in {summary['pairs_agree']} of {summary['pairs']} pairs")
    if args.check_complete and refused:
        print(f"validate: refused: {', '.join(refused)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
