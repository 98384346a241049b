#!/usr/bin/env python3
"""Writes nccl-tests logs (hwprofiles/sources/<gpu>/nccl/NN-<binary>-unspecified-nR.txt) from NVIDIA's
aiconfigurator measurements (ai-dynamo/aiconfigurator, Apache-2.0): the nccl_perf.parquet that its collector
wrote for one GPU and one NCCL version. Only the measured numbers are carried over, with their source.

The collector (collector/network/collect_nccl.py) runs the nccl-tests binaries on one node, one size at a time
(`<binary> -b S -e S -t R -d half -w 40 -a 1 -n 100 (60 above 16 MiB) -c 0`), and keeps the out-of-place time
of each size in ms, with the size as elements (bytes / 2 for half). This script writes that time back in
microseconds under nccl-tests' column layout, with algbw = size / time and busbw = algbw x nccl-tests' bus
factor [DERIVED]; the in-place columns and #wrong are N/A. Only half (16-bit) rows are kept: the bf16 traffic
of training. NCCL picked the algorithm (moeplan-algorithm: unspecified).

Needs pandas and pyarrow (not a build dependency: run it by hand in a virtual environment), e.g.
  git -C /work/.mirror/ai-dynamo+aiconfigurator/repo show \\
      095f58a51:aic-core/src/aiconfigurator_core/systems/data/h100_sxm/comm/nccl/2.29.2/nccl_perf.parquet \\
      > /tmp/nccl.parquet
  python3 scripts/extract_aiconfigurator_nccl.py /tmp/nccl.parquet --first 9 --source "..." \\
      -o hwprofiles/sources/h100-sxm/nccl
"""

import argparse
import os
import sys

BINARIES = {  # aiconfigurator op_name -> nccl-tests binary, bus factor for R ranks
    "all_reduce": ("all_reduce_perf", lambda r: 2.0 * (r - 1) / r),
    "all_gather": ("all_gather_perf", lambda r: (r - 1) / r),
    "reduce_scatter": ("reduce_scatter_perf", lambda r: (r - 1) / r),
    "alltoall": ("alltoall_perf", lambda r: (r - 1) / r),
}
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "all_gather": "none", "alltoall": "none"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parquet", help="aiconfigurator nccl_perf.parquet")
    ap.add_argument("--source", required=True, help="each log's '# moeplan-source:' line")
    ap.add_argument("--first", type=int, required=True, help="number of the first file written (NN-)")
    ap.add_argument("-o", "--output-dir", required=True)
    args = ap.parse_args()

    import pandas as pd  # only this script needs it

    d = pd.read_parquet(args.parquet)
    d = d[d.nccl_dtype == "half"]
    if d.empty:
        print(f"{args.parquet}: no half-precision rows", file=sys.stderr)
        return 2
    devices = sorted(d.device.unique()) if "device" in d.columns else ["unstated"]
    number = args.first
    for op in sorted(BINARIES):
        binary, factor = BINARIES[op]
        for ranks in sorted(d[d.op_name == op].num_gpus.unique()):
            rows = d[(d.op_name == op) & (d.num_gpus == ranks)].sort_values("message_size")
            if rows.message_size.duplicated().any():
                print(f"{args.parquet}: {op} over {ranks} GPUs lists a size twice", file=sys.stderr)
                return 2
            path = os.path.join(args.output_dir, f"{number:02d}-{binary}-unspecified-n{ranks}.txt")
            number += 1
            with open(path, "w") as f:
                f.write(f"# moeplan-source: {args.source} (device {', '.join(devices)}; {ranks} GPUs in one node)\n")
                f.write("# moeplan-algorithm: unspecified\n")
                f.write(f"# moeplan-ranks: {ranks}\n")
                f.write("# moeplan-nodes: 1\n")
                f.write("# Transcribed from the source above, which gives the out-of-place time per size (ms, and\n")
                f.write("# the size in 16-bit elements). time is that in us, size = elements x 2; algbw = size / time\n")
                f.write("# and busbw = algbw x nccl-tests' bus factor are derived; the in-place columns and #wrong\n")
                f.write("# are N/A.\n")
                f.write(f"# Collective test starting: {binary}\n#\n")
                f.write("#                                                              out-of-place"
                        "                       in-place\n")
                f.write("#       size         count      type   redop    root     time   algbw   busbw #wrong"
                        "     time   algbw   busbw #wrong\n")
                f.write("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
                        "            (us)  (GB/s)  (GB/s)\n")
                busbws = []
                for elements, latency_ms in zip(rows.message_size, rows.latency):
                    size = int(elements) * 2
                    time_us = float(latency_ms) * 1e3
                    algbw = size / (time_us * 1e-6) / 1e9
                    busbw = algbw * factor(int(ranks))
                    busbws.append(busbw)
                    f.write(f"{size:>12d}  {int(elements):>12d}      half  {REDOP[op]:>6s}      -1 {time_us:8.2f}"
                            f" {algbw:7.2f} {busbw:7.2f}    N/A      N/A     N/A     N/A    N/A\n")
                f.write("# Out of bounds values : N/A\n")
                f.write(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.3f}\n#\n")
            print(f"{path}: {len(rows)} sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
