#!/usr/bin/env bash
# Fresh-machine set-up for adjoint (Debian bookworm, as root or with sudo).
#   tools/quickstart.sh demo   install what is missing, build, run the main job
#   tools/quickstart.sh test   install what is missing, build, run the whole test suite
# Options through the environment: BUILD_DIR (default build), THREADS (default all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-demo}
build=${BUILD_DIR:-build}

packages=(g++ meson ninja-build pkg-config cmake libopenblas-dev libtbb-dev libstb-dev doctest-dev
          zlib1g-dev libcairo2-dev fonts-dejavu-core dataset-fashion-mnist)
# The test mode also opens the HTML reports in a headless browser (tools/check_reports.sh)
# and runs the MPI tests (tests/test_distributed.cpp).
[ "$mode" = test ] && packages+=(chromium python3 libopenmpi-dev openmpi-bin)
[ "$mode" = test ] && packages+=(slurm-wlm munge)  # the one-node Slurm of tests/slurm_one_node.sh
# reproduce tensor-similarity's language parts read Debian's fortunes (the suite runs other parts)
[ "$mode" = test ] && packages+=(fortunes)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

# A build folder configured before a feature's package was installed (`demo` installs no Open
# MPI, `test` does) has that feature off until meson looks again: reconfigure it when this run
# installed anything, and always for `test` (the package may have come some other way), so
# that the MPI tests run rather than skip. Reconfiguring rebuilds only what it changes.
if [ ! -d "$build" ]; then
  meson setup "$build" --buildtype=release
elif [ ${#missing[@]} -gt 0 ] || [ "$mode" = test ]; then
  meson setup --reconfigure "$build"
fi
ninja -C "$build" -j"$(nproc)"

threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")

case "$mode" in
  demo)
    # The main job: a small ResNet-18 trained on Fashion-MNIST (--quick: about 35 s on 2 cores), then
    # evaluated on the whole test set.
    "$build"/tools/adjoint "${threads[@]}" train --model resnet18 --data fashion-mnist --quick --overwrite --out runs/quickstart
    "$build"/tools/adjoint "${threads[@]}" eval --checkpoint runs/quickstart/checkpoint.safetensors
    ;;
  test)
    # The suite, then the same suite linked without MPI where the build has both
    # (tests/meson.build): CI shows that a machine without Open MPI builds and passes.
    passed=0
    failed=0
    status=0
    suites=("$build"/tests/adjoint_tests)
    if [ -x "$build"/tests/adjoint_tests_without_mpi ]; then suites+=("$build"/tests/adjoint_tests_without_mpi); fi
    for suite in "${suites[@]}"; do
      log=$(mktemp)
      set +e
      "$suite" --no-version 2>&1 | tee "$log"
      suite_status=${PIPESTATUS[0]}
      set -e
      # doctest's totals as the plain closing line CI reads.
      line=$(grep -E '^\[doctest\] test cases:' "$log" | tail -n 1)
      rm -f "$log"
      suite_passed=$(echo "$line" | sed -nE 's/.*\| *([0-9]+) passed.*/\1/p')
      suite_failed=$(echo "$line" | sed -nE 's/.*\| *([0-9]+) failed.*/\1/p')
      echo "$(basename "$suite"): ${suite_passed:-0} passed, ${suite_failed:-1} failed"
      passed=$((passed + ${suite_passed:-0}))
      failed=$((failed + ${suite_failed:-1}))
      if [ "$suite_status" -ne 0 ]; then status=1; fi
    done
    # The reports in a real browser: one more test, passed or failed.
    if command -v chromium >/dev/null 2>&1; then
      if bash tools/check_reports.sh "$build"; then
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
        status=1
      fi
    else
      echo "tools/check_reports.sh skipped: chromium is not installed"
    fi
    echo "$passed passed, $failed failed"
    exit "$status"
    ;;
  *)
    echo "usage: tools/quickstart.sh demo|test" >&2
    exit 2
    ;;
esac
