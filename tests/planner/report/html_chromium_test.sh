#!/usr/bin/env bash
# Issue #8: the HTML report renders in headless Chromium (Debian's `chromium`) with no console errors, and a
# screenshot of it is not blank. Pages: `moeplan simulate --html` of an example plan and `moeplan plan --html`
# of a small search. A control page with a script error must be caught first, so the console check cannot pass
# vacuously. Fails (never skips) when chromium is missing: scripts/install_deps.sh installs it.
# Usage: html_chromium_test.sh MOEPLAN_BIN SOURCE_DIR
set -euo pipefail

moeplan=$1
src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/moeplan_html_chromium.XXXXXX")
trap 'rm -rf "$work"' EXIT

if ! command -v chromium >/dev/null; then
  echo "FAIL: chromium not found (install it: scripts/install_deps.sh)" >&2
  exit 1
fi

# Headless Chromium of Debian 12 as issue #8 names it; its own profile so parallel runs do not share one.
browse() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
    --user-data-dir="$work/profile" "$@"
}

# Console messages of a page (Chromium logs each as "...:CONSOLE:<line>] "<message>", source: ..."). The
# pages carry no script, so any console line at all is a failure.
console_lines() {
  browse --enable-logging=stderr --v=0 --dump-dom "file://$1" 2>&1 >"$1.dom" | grep -E ':CONSOLE[:(]|Uncaught' || true
}

# Not blank: many distinct colours, and enough pixels away from the most common (background) colour. The PNG
# is decoded with the standard library.
check_png() {
  python3 - "$1" "$2" <<'PY'
import struct, sys, zlib

path, min_colours = sys.argv[1], int(sys.argv[2])
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
assert depth == 8 and colour_type in (2, 6) and interlace == 0, (depth, colour_type, interlace)
bpp = 3 if colour_type == 2 else 4
raw = zlib.decompress(idat)
stride = width * bpp
prev = bytearray(stride)
colours = {}
for y in range(height):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 1:
        for i in range(bpp, stride):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif f == 2:
        line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
    elif f == 3:
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif f == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else (b if pb <= pc else c))) & 0xFF
    prev = line
    for x in range(0, stride, bpp * 2):  # every second pixel is plenty to judge a page
        px = bytes(line[x:x + 3])
        colours[px] = colours.get(px, 0) + 1
sampled = sum(colours.values())
share = 1 - max(colours.values()) / sampled
print(f"{path}: {width}x{height}, {len(colours)} distinct colours, {100 * share:.1f}% off the background")
if len(colours) < min_colours or share < 0.05:
    sys.exit(f"FAIL: {path} looks blank")
PY
}

# 1. The console check catches a script error on a control page.
printf '<!DOCTYPE html><html><body><p>control</p><script>no_such_function();</script></body></html>\n' \
  >"$work/control.html"
if [[ -z $(console_lines "$work/control.html") ]]; then
  echo "FAIL: the console check missed the control page's script error" >&2
  exit 1
fi

# 2. The pages.
"$moeplan" simulate "$src/planner/examples/mixtral-8x22b-128xh100.json" --html "$work/simulate.html" >/dev/null
"$moeplan" plan --model tiny-moe --hardware h100-sxm --gpus 8 --seq-len 256 --global-batch 32 --top 4 \
  --html "$work/plan.html" >/dev/null

status=0
for page in simulate plan; do
  html="$work/$page.html"
  errors=$(console_lines "$html")
  if [[ -n $errors ]]; then
    echo "FAIL: $page.html logs to the console:" >&2
    echo "$errors" >&2
    status=1
  fi
  # Rendered: the DOM Chromium built holds the report's sections and its charts.
  for id in summary breakdown memory timeline; do
    grep -q "<section id=\"$id\"" "$html.dom" || { echo "FAIL: $page.html renders without #$id" >&2; status=1; }
  done
  charts=$(grep -o '<svg' "$html.dom" | wc -l)
  [[ $charts -ge 3 ]] || { echo "FAIL: $page.html renders $charts charts" >&2; status=1; }
  browse --screenshot="$work/$page.png" --window-size=1400,2000 "file://$html" >/dev/null 2>&1
  check_png "$work/$page.png" 24 || status=1
  if [[ -n ${MOEPLAN_KEEP_SCREENSHOTS:-} ]]; then cp "$work/$page.png" "$html" "$MOEPLAN_KEEP_SCREENSHOTS/"; fi
done
[[ $status -eq 0 ]] && echo "html report: renders in chromium, no console messages, screenshots not blank"
exit $status
