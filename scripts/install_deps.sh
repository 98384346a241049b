#!/usr/bin/env bash
# Installs everything moeplan needs to build and test, from Debian packages and (headers only) PyPI.
# Idempotent: a second run only checks.
# Usage: scripts/install_deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin
  libeigen3-dev libboost-graph-dev libcli11-dev libfmt-dev doctest-dev nlohmann-json3-dev
  clang clang-format
  chromium
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  echo "install_deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install_deps: all ${#packages[@]} packages present"

# Header-only GPU libraries from PyPI, pinned: CUTLASS/CuTe (the grouped GEMM) and the cuDNN frontend (flash
# attention). Only their C++ headers are used; they are unpacked into .deps/ (ignored by git), where CMake looks.
deps_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps"
pywheels=(nvidia-cutlass==4.2.0.0 nvidia-cudnn-frontend==1.32.0)
stamp="$deps_dir/.stamp-$(echo "${pywheels[*]}" | tr ' =' '_-')"
if [[ ! -f $stamp ]]; then
  rm -rf "$deps_dir" && mkdir -p "$deps_dir/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$deps_dir/wheels" "${pywheels[@]}"
  mkdir -p "$deps_dir/cutlass" "$deps_dir/cudnn_frontend"
  python3 - "$deps_dir" <<'PY'
import pathlib, sys, zipfile
deps = pathlib.Path(sys.argv[1])
for whl in (deps / "wheels").glob("*.whl"):
    prefix, dest = (("cutlass_library/source/include/", deps / "cutlass/include") if "cutlass" in whl.name
                    else ("include/", deps / "cudnn_frontend/include"))
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                out = dest / name[len(prefix):]
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(name))
PY
  rm -rf "$deps_dir/wheels"
  touch "$stamp"
fi
echo "install_deps: ${pywheels[*]} headers in .deps/"
