#!/usr/bin/env bash
# The HTML reports (OUT/index.html) checked in a real browser: makes one tiny output folder
# per kind of report (train, tensorsim of a pair and of a run, explain, stitch, bench),
# opens each page in headless Chromium and fails on
#   - a blank page: the screenshot nearly one colour,
#   - a broken image: an <img> the browser could not decode (a checking script is added to a
#     copy of the page beside it; the report itself has no script),
#   - a console message (a page without scripts logs none unless something failed),
#   - an external URL (http:, https:, //) in a src or href: a report must open offline.
# Prints one line per report and exits 1 when any failed (2: no Chromium or no build).
#   tools/check_reports.sh [BUILD_DIR]     (default: $BUILD_DIR or build)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-${BUILD_DIR:-build}}
adjoint="$build/tools/adjoint"
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "check_reports: chromium is not installed" >&2; exit 2; }
[ -x "$adjoint" ] || { echo "check_reports: $adjoint is not built" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. Tiny output folders, a few seconds each.
make_folder() {  # make_folder NAME ARGS...: runs adjoint, its output in $work/NAME.log
  local name=$1
  shift
  local started=$SECONDS
  if ! "$adjoint" --threads 2 "$@" >"$work/$name.log" 2>&1; then
    tail -n 5 "$work/$name.log" >&2
    echo "check_reports: adjoint $* failed" >&2
    exit 1
  fi
  [ -n "${CHECK_REPORTS_VERBOSE:-}" ] && echo "  $name: $((SECONDS - started)) s" >&2
  return 0
}
tiny_image_model=(train --data fashion-mnist --model resnet18 --width 0.125 --epochs 1 --max-steps 6 --batch 32
                  --eval-limit 200)
make_folder train_a "${tiny_image_model[@]}" --seed 1 --out "$work/train_a"
make_folder train_b "${tiny_image_model[@]}" --seed 2 --out "$work/train_b"
make_folder train_run train --data modadd:11 --model bilinear_mlp --epochs 4 --batch 16 --optimizer adamw --lr 0.01 \
  --keep-checkpoints every:2 --out "$work/train_run"
make_folder train_run2 train --data modadd:11 --model bilinear_mlp --epochs 1 --batch 16 --optimizer adamw --lr 0.01 \
  --seed 3 --out "$work/train_run2"
make_folder tensorsim tensorsim "$work/train_run/checkpoint.safetensors" "$work/train_run2/checkpoint.safetensors" \
  --slices --out "$work/tensorsim"
make_folder tensorsim_run tensorsim --run "$work/train_run" --no-baselines --out "$work/tensorsim_run"
make_folder explain explain --checkpoint "$work/train_a/checkpoint.safetensors" --data fashion-mnist --count 2 \
  --metrics none --out "$work/explain"
make_folder stitch stitch --front "$work/train_a/checkpoint.safetensors" --end "$work/train_b/checkpoint.safetensors" \
  --pairs 2:2,4:3 --train-images 100 --epochs 1 --batch 25 --objectives hlm --protocol standard,invariance \
  --iri-images 4 --iri-steps 5 --test-images 200 --out "$work/stitch"
make_folder bench bench stitch --only vgg11_bn --batch 2 --steps 1 --repeats 1 --block 7 --out "$work/bench.json"

# 2. Each page in the browser.
# Added to a copy of a page: on load, a page with a broken image turns magenta all over,
# which the screenshot check below reports.
checker='<script>addEventListener("load",()=>{const broken=[...document.images].filter(i=>!i.complete||i.naturalWidth===0);if(broken.length){const d=document.createElement("div");d.style.cssText="position:fixed;inset:0;background:#ff00ff;z-index:99";document.body.appendChild(d);}});</script>'

# Reads a PNG screenshot (Python's standard library only) and prints: the share of its
# most common colour, and the share of magenta pixels.
read_screenshot='
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w, h, ctype = 8, b"", 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), "unexpected PNG format"
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
bpp = 4 if ctype == 6 else 3
raw, stride = zlib.decompress(idat), w * bpp
prev, counts, magenta = bytearray(stride), {}, 0
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 2:  # the common filters at once, the others byte by byte
        line, f = bytearray((u + v) & 255 for u, v in zip(line, prev)), 0
    for i in range(stride if f else 0):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp * 4):  # every fourth pixel is plenty
        key = bytes(line[x:x + 3])
        counts[key] = counts.get(key, 0) + 1
        magenta += key == b"\xff\x00\xff"
    prev = line
total = sum(counts.values())
print("%.4f %.4f" % (max(counts.values()) / total, magenta / total))
'

failed=0
check_page() {  # check_page KIND PAGE
  local kind=$1 page=$2 problem=""
  if [ ! -s "$page" ]; then
    problem="no page"
  elif grep -Eqi '(src|href)="(https?:)?//' "$page"; then
    problem="an external URL: $(grep -Eoi '(src|href)="(https?:)?//[^"]*' "$page" | head -n 1)"
  else
    local copy="${page%.html}.check.html" shot="$work/shot.png"
    python3 -c 'import sys; open(sys.argv[2], "w").write(open(sys.argv[1]).read().replace("</body>", sys.argv[3] + "</body>"))' \
      "$page" "$copy" "$checker"
    rm -f "$shot"
    local started=$SECONDS
    timeout 60 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --enable-logging=stderr --v=0 \
      --virtual-time-budget=3000 --window-size=1000,1300 --force-device-scale-factor=0.25 --screenshot="$shot" "file://$(realpath "$copy")" \
      >"$work/browser.log" 2>&1
    rm -f "$copy"
    [ -n "${CHECK_REPORTS_VERBOSE:-}" ] && echo "  browser: $((SECONDS - started)) s" >&2
    started=$SECONDS
    local console
    console=$(grep -E ':CONSOLE[:(]' "$work/browser.log" | head -n 1)
    if [ ! -s "$shot" ]; then
      problem="no screenshot ($(tail -n 1 "$work/browser.log"))"
    elif [ -n "$console" ]; then
      problem="a console message: $console"
    else
      read -r common magenta < <(python3 -c "$read_screenshot" "$shot")
      [ -n "${CHECK_REPORTS_VERBOSE:-}" ] && echo "  screenshot read: $((SECONDS - started)) s" >&2
      if awk -v m="$magenta" 'BEGIN { exit !(m > 0.5) }'; then
        problem="a broken image"
      elif awk -v c="$common" 'BEGIN { exit !(c > 0.995) }'; then
        problem="a blank page (one colour on $(awk -v c="$common" 'BEGIN { printf "%.1f", 100 * c }')% of it)"
      fi
    fi
  fi
  if [ -z "$problem" ]; then
    printf 'ok     %-14s %s\n' "$kind" "$page"
  else
    printf 'FAILED %-14s %s: %s\n' "$kind" "$page" "$problem"
    failed=$((failed + 1))
  fi
}

check_page train "$work/train_a/index.html"
check_page tensorsim "$work/tensorsim/index.html"
check_page tensorsim-run "$work/tensorsim_run/index.html"
check_page explain "$work/explain/index.html"
check_page stitch "$work/stitch/index.html"
check_page bench "$work/bench.html"
if [ -n "${CHECK_REPORTS_SELF_TEST:-}" ]; then  # the checks themselves: each bad page must fail
  printf '<!DOCTYPE html><html><body></body></html>' >"$work/blank.html"
  check_page self:blank "$work/blank.html"
  printf '<!DOCTYPE html><html><body><h1>x</h1><img src="data:image/png;base64,AAAA"></body></html>' >"$work/broken.html"
  check_page self:broken "$work/broken.html"
  printf '<!DOCTYPE html><html><body><h1>x</h1><img src="https://example.org/a.png"></body></html>' >"$work/external.html"
  check_page self:external "$work/external.html"
  printf '<!DOCTYPE html><html><body><h1>x</h1><script>console.error("x")</script></body></html>' >"$work/console.html"
  check_page self:console "$work/console.html"
  [ "$failed" -eq 4 ] && { echo "check_reports: self-test: the four bad pages failed, as they should"; exit 0; }
  echo "check_reports: self-test: $failed failures, expected exactly the four bad pages" >&2
  exit 1
fi
[ "$failed" -eq 0 ] || exit 1
