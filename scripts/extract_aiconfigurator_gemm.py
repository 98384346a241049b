#!/usr/bin/env python3
"""Writes one BF16 GEMM grid table (hwprofiles/sources/<gpu>/tables/gemm-NN-bf16.csv) from NVIDIA's
aiconfigurator measurements (ai-dynamo/aiconfigurator, Apache-2.0): the gemm_perf.parquet that its collector
wrote for one GPU and one framework version. Only the measured numbers are carried over, with their source.

The table keeps the training-sized part of the collector's shape grid, so that the cost model can interpolate it:
rows m in the multiples of 16 below 128 and of 128 above that it measured (decode batches 1-15, 17 and the
m = 16j + 1 rows left out), n and k up to 51200 (the 65536 column is incomplete). Every kept (m, n, k) must be present, or the
script stops: the cost model reads a table as a grid only when it is the full product of its m, n and k values.

Needs pandas and pyarrow (not a build dependency: run it by hand in a virtual environment), e.g.
  git -C /work/.mirror/ai-dynamo+aiconfigurator/repo show \\
      095f58a51:aic-core/src/aiconfigurator_core/systems/data/h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet \\
      > /tmp/trt.parquet
  python3 scripts/extract_aiconfigurator_gemm.py /tmp/trt.parquet --kernel-source torch_flow \\
      --source "..." -o hwprofiles/sources/h100-sxm/tables/gemm-08-bf16.csv
"""

import argparse
import itertools
import sys

MAX_NK = 51200


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parquet", help="aiconfigurator gemm_perf.parquet")
    ap.add_argument("--kernel-source", required=True, help="the BF16 rows' kernel_source (torch_flow, sglang_torch_linear)")
    ap.add_argument("--source", required=True, help="the table's '# source:' line: where the numbers come from")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()

    import pandas as pd  # only this script needs it

    d = pd.read_parquet(args.parquet)
    d = d[(d.kernel_source == args.kernel_source) & (d.gemm_dtype == "bfloat16")]
    if d.empty:
        print(f"{args.parquet}: no bfloat16 rows with kernel_source {args.kernel_source}", file=sys.stderr)
        return 2
    devices = sorted(d.device.unique())
    keep = d[((d.m % 128 == 0) | ((d.m < 128) & (d.m % 16 == 0))) & (d.n <= MAX_NK) & (d.k <= MAX_NK)]
    ms, ns, ks = (sorted(keep[c].unique()) for c in ("m", "n", "k"))
    have = {(int(m), int(n), int(k)): float(t) for m, n, k, t in zip(keep.m, keep.n, keep.k, keep.latency)}
    missing = [c for c in itertools.product(ms, ns, ks) if (int(c[0]), int(c[1]), int(c[2])) not in have]
    if missing:
        print(f"{args.parquet}: {len(missing)} shapes of the grid missing, e.g. {missing[:3]}", file=sys.stderr)
        return 2
    with open(args.output, "w") as f:
        f.write(f"# source: {args.source} (device {', '.join(devices)}; latency in ms over the CUDA-graph replays; "
                f"tflops = 2 m n k / latency [DERIVED]; a {len(ms)} x {len(ns)} x {len(ks)} grid)\n")
        f.write("m,n,k,dtype,tflops\n")
        for m, n, k in itertools.product(ms, ns, ks):
            t_ms = have[(int(m), int(n), int(k))]
            f.write(f"{m},{n},{k},bf16,{2.0 * m * n * k / (t_ms * 1e-3) / 1e12:.4g}\n")
    print(f"{args.output}: {len(ms) * len(ns) * len(ks)} shapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
