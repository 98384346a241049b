#!/usr/bin/env bash
# Executes every numbered notebook (notebooks/[0-9][0-9]_*.ipynb) headlessly, as CI does: fails on the first
# cell error of any notebook, naming the notebook and the cell. Each figure is also written as a PNG.
# Usage (after scripts/build.sh): scripts/run_notebooks.sh [NOTEBOOK ...]
#   env: MOEPLAN_BUILD   build folder (default build)
#        MOEPLAN_FIGURES PNG folder (default notebooks/figures); the executed notebooks go to its executed/
#        NOTEBOOK_VENV   virtual environment, created when missing (default .venv-notebooks)
#        CELL_TIMEOUT_S  per-cell limit in seconds (default 600)
# Python packages come from notebooks/requirements.txt (pinned, from PyPI). The source notebooks are never
# modified: they stay committed without outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
export MOEPLAN_BUILD=${MOEPLAN_BUILD:-build}
export MOEPLAN_FIGURES=${MOEPLAN_FIGURES:-notebooks/figures}
VENV=${NOTEBOOK_VENV:-.venv-notebooks}
CELL_TIMEOUT_S=${CELL_TIMEOUT_S:-600}

for bin in "$MOEPLAN_BUILD/planner/moeplan" "$MOEPLAN_BUILD/executor/moerun/moerun"; do
  [[ -x $bin ]] || { echo "run_notebooks.sh: $bin missing (run scripts/build.sh, or set MOEPLAN_BUILD)" >&2; exit 2; }
done

if [[ ! -x $VENV/bin/python ]]; then
  # Debian ships venv and ensurepip in python3-venv, which a minimal image lacks.
  if ! python3 -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$VENV"
    else
      echo "run_notebooks.sh: python3 -m venv failed; install python3-venv" >&2
      exit 2
    fi
  fi
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r notebooks/requirements.txt

if (($# > 0)); then notebooks=("$@"); else notebooks=(notebooks/[0-9][0-9]_*.ipynb); fi
mkdir -p "$MOEPLAN_FIGURES/executed"
"$VENV/bin/python" - "$CELL_TIMEOUT_S" "$MOEPLAN_FIGURES/executed" "${notebooks[@]}" <<'PY'
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

timeout, executed_dir, paths = int(sys.argv[1]), Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
failed = []
for path in paths:
    nb = nbformat.read(path, as_version=4)
    running = {"cell": None}

    def note_cell(cell, cell_index):
        running["cell"] = cell_index

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", on_cell_execute=note_cell,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    try:
        client.execute()
        print(f"ok      {path} ({time.monotonic() - start:.1f} s)", flush=True)
    except (CellExecutionError, CellTimeoutError) as err:
        cell = running["cell"]
        source = nb.cells[cell].source.splitlines()[0] if cell is not None and nb.cells[cell].source else ""
        print(f"FAILED  {path}: cell {cell} (0-based, of {len(nb.cells)}) starting {source!r}\n{err}",
              file=sys.stderr, flush=True)
        failed.append(str(path))
    finally:
        nbformat.write(nb, executed_dir / path.name)
if failed:
    print(f"run_notebooks.sh: {len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
    sys.exit(1)
print(f"all {len(paths)} notebook(s) ran; figures in {executed_dir.parent}, executed copies in {executed_dir}")
PY
