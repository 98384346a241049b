"""Shared plumbing of the notebooks: find the built CLIs, run them, parse their JSON/CSV, read Chrome traces and
save figures. No model logic lives here: every number the notebooks plot comes from moeplan or moerun output.

Environment:
  MOEPLAN_BUILD    build folder, absolute or relative to the repository root (default: build)
  MOEPLAN_FIGURES  folder for the PNG copy of every figure (default: notebooks/figures)
  MOEPLAN_WORK     scratch folder for plan files, reports and traces, kept (default: a temporary folder,
                   removed when the kernel exits)
"""

import atexit
import io
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
BUILD = (REPO / os.environ.get("MOEPLAN_BUILD", "build")).resolve()
MOEPLAN = BUILD / "planner" / "moeplan"
MOERUN = BUILD / "executor" / "moerun" / "moerun"
FIGURES = (REPO / os.environ.get("MOEPLAN_FIGURES", "notebooks/figures")).resolve()
if os.environ.get("MOEPLAN_WORK"):
    WORK = Path(os.environ["MOEPLAN_WORK"]).resolve()
    WORK.mkdir(parents=True, exist_ok=True)
else:
    # Traces of large plans run to tens of MB each: a folder of our own making goes when the kernel exits.
    WORK = Path(tempfile.mkdtemp(prefix="moeplan-nb-")).resolve()
    atexit.register(shutil.rmtree, WORK, ignore_errors=True)

# Chrome-trace categories (the op kinds of the op graph) split into work that occupies the GPU's SMs and
# communication; the Gantt charts colour and the exposure analysis group by these.
COMPUTE_KINDS = ("gemm", "grouped_gemm", "attention", "memory_bound", "optimizer")
COMM_KINDS = ("collective", "send_recv")


def _run(cmd, ok_codes=(0,), cwd=REPO):
    """Runs cmd; on an exit code outside ok_codes raises with the command line and its stderr."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    if proc.returncode not in ok_codes:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stderr.strip()}")
    return proc.stdout


def _require(binary):
    if not binary.exists():
        raise FileNotFoundError(f"{binary} not found: build first (scripts/build.sh) or set MOEPLAN_BUILD")


def moeplan_json(*args, ok_codes=(0,)):
    """`moeplan ARGS --json`, parsed. Pass ok_codes=(0, 3) to read the report of a plan that cannot run (exit 3:
    illegal or does not fit), which `simulate` still prints."""
    _require(MOEPLAN)
    return json.loads(_run([MOEPLAN, *args, "--json"], ok_codes))


def moeplan_csv(*args):
    """`moeplan ARGS --csv` as a DataFrame."""
    _require(MOEPLAN)
    return pd.read_csv(io.StringIO(_run([MOEPLAN, *args, "--csv"])))


def moerun(*args, ranks):
    """`mpiexec -n RANKS moerun ARGS` (one CPU process per rank); returns its stdout."""
    _require(MOERUN)
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        raise FileNotFoundError("mpiexec not found: install OpenMPI (scripts/install_deps.sh)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return _run([mpiexec, *root, "-n", str(ranks), MOERUN, *args])


def write_plan(plan, name):
    """Writes a plan dict as WORK/NAME.json; relative model/hardware/stack paths stay repository-relative."""
    plan = dict(plan)
    for key in ("model", "hardware", "stack"):
        value = plan.get(key)
        if isinstance(value, str) and (REPO / value).exists():
            plan[key] = str(REPO / value)
    path = WORK / f"{name}.json"
    path.write_text(json.dumps(plan, indent=1))
    return path


def read_trace(path):
    """Complete events ("X") of a moeplan/moerun Chrome trace as a DataFrame, times in seconds.

    Columns: stage (trace pid), stream (thread name), name, kind (the op kind), phase, micro_batch, group,
    start_s, end_s, dur_s.
    """
    events = json.loads(Path(path).read_text())["traceEvents"]
    streams = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    rows = [
        (
            e["pid"],
            streams.get((e["pid"], e["tid"]), str(e["tid"])),
            e["tid"],
            e["name"],
            e["cat"],
            e["args"].get("phase", ""),
            e["args"].get("micro_batch", -1),
            e["args"].get("group", ""),
            e["ts"] * 1e-6,
            e["dur"] * 1e-6,
        )
        for e in events
        if e["ph"] == "X"
    ]
    df = pd.DataFrame(
        rows,
        columns=["stage", "stream", "tid", "name", "kind", "phase", "micro_batch", "group", "start_s", "dur_s"],
    )
    df["end_s"] = df["start_s"] + df["dur_s"]
    return df


def save_figure(fig, name):
    """Saves fig as FIGURES/NAME.png (the copy CI keeps and reviewers open) and leaves it to show inline."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    path = FIGURES / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"figure written: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return path
