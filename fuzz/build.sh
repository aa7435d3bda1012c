#!/bin/sh
# Builds one libFuzzer target per parser (fuzz/fuzz_*.cpp) with AddressSanitizer and
# UndefinedBehaviorSanitizer, using Debian's clang and libclang-rt:
#
#   fuzz/build.sh [OUT]          (OUT defaults to build-fuzz; objects are reused)
#   nice -n 19 build-fuzz/fuzz_json -max_total_time=600 -close_fd_mask=3 fuzz/corpus/json
#
# Each target's corpus is fuzz/corpus/<name>; a crash is written as crash-<hash> in the
# current folder. See README.md, "Tests".
set -eu
cd "$(dirname "$0")/.."
out=${1:-build-fuzz}
mkdir -p "$out/obj"
flags="-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -I. $(pkg-config --cflags openblas stb)"
libs="$(pkg-config --libs openblas tbb stb zlib) -lpthread"

# The engine sources the parsers need (the whole engine, for simplicity), the CLI parser and
# the readers of the stitching sweep's and explain's cell files (which need the engine alone).
objects=""
for src in engine/*.cpp engine/io/*.cpp engine/data/*.cpp tools/cli.cpp analysis/common/provenance.cpp analysis/stitching/records.cpp \
    analysis/pullbacks/cells.cpp models/paper_lm.cpp; do
  obj="$out/obj/$(echo "$src" | tr / _ | sed 's/\.cpp$/.o/')"
  objects="$objects $obj"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ]; then
    echo "compiling $src"
    clang++ $flags -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
done

for target in fuzz/fuzz_*.cpp; do
  name=$(basename "$target" .cpp)
  echo "linking $out/$name"
  clang++ $flags -fsanitize=fuzzer "$target" $objects $libs -o "$out/$name"
done
