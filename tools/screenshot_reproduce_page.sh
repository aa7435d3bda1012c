#!/usr/bin/env bash
# Remakes docs/figures/reproduce_page.png, the README's picture of a reproduce page, from the
# code as it is, so that the picture cannot drift from what `adjoint reproduce` writes:
#   1. `adjoint reproduce semantic-pullbacks --scale quick --seeds 1` into OUT (minutes: two
#      small models trained and explained; a rerun at the same commit reuses OUT's finished
#      parts, so a second call only takes the picture);
#   2. OUT/index.html photographed in headless Chromium: the top 1000×1250 pixels of the page.
# The old picture is replaced only by a finished new one.
#   tools/screenshot_reproduce_page.sh [BUILD_DIR [OUT]]   (defaults: $BUILD_DIR or build, runs/reproduce_page)
# Exits 2 without Chromium or a build, 1 when a step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-${BUILD_DIR:-build}}
out=${2:-runs/reproduce_page}
adjoint="$build/tools/adjoint"
figure=docs/figures/reproduce_page.png
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "screenshot_reproduce_page: chromium is not installed" >&2; exit 2; }
[ -x "$adjoint" ] || { echo "screenshot_reproduce_page: $adjoint is not built" >&2; exit 2; }

# --overwrite remakes only the parts made by another commit, command line or thread count.
if ! "$adjoint" --threads 2 reproduce semantic-pullbacks --scale quick --seeds 1 --overwrite --out "$out"; then
  echo "screenshot_reproduce_page: adjoint reproduce failed" >&2
  exit 1
fi

# A fresh browser profile each time, and no network, update or sync traffic: the page is a
# local file and must render the same offline.
profile=$(mktemp -d)
shot="$profile/page.png"
trap 'rm -rf "$profile"' EXIT
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1000,1250 --screenshot="$shot" "file://$(realpath "$out/index.html")" >"$profile/browser.log" 2>&1
if [ ! -s "$shot" ]; then
  echo "screenshot_reproduce_page: Chromium took no screenshot: $(tail -n 1 "$profile/browser.log")" >&2
  exit 1
fi
install -m 644 "$shot" "$figure"
echo "wrote $figure from $out/index.html"
