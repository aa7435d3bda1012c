#!/bin/sh
# explain's overhead around its methods at 224 pixels: torchvision's ResNet-50 (random
# weights, torch.save'd), 256 x 256 noise PNGs through the resnet50_v1 preset, the gradient,
# no metrics, 2 threads. For 16 and 64 images it runs the BEFORE and AFTER executables
# alternately and prints, per run, the whole command's wall time (process start to exit),
# the methods' time (explain's own `time:` line), the process's CPU time and peak resident
# set (where GNU time is installed) and the overhead, (whole - methods) / methods; then the
# median (with the range) and the best of each, and whether both wrote the same results
# (tools/compare_explain_outputs.py). Run it on a quiet machine (about 2 minutes); the
# figures are in docs/benchmarks.md.
#
#   tools/bench_explain_overhead.sh OUTDIR [BEFORE] [AFTER]
#   (default AFTER: build/tools/adjoint; without BEFORE only AFTER runs; REPEATS=5, IMAGES="16 64" and
#   THREADS=2 by default. OUTDIR/fixture is made once: tools/explain_overhead_fixture.py.)
set -eu
out=$1
before=${2:-}
after=${3:-build/tools/adjoint}
repeats=${REPEATS:-5}
threads=${THREADS:-2}
image_counts=${IMAGES:-16 64}
mkdir -p "$out"
/usr/bin/python3 "$(dirname "$0")/explain_overhead_fixture.py" "$out/fixture" 64 > /dev/null
lscpu | sed -n 's/^Model name: *//p'
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
seconds() { date +%s.%N; }
# Runs the command; where GNU time is installed, its log ends with the process's CPU time
# (user + system) and peak resident set.
with_usage() {
  if [ -x /usr/bin/time ]; then /usr/bin/time -f 'usage: cpu %U + %S s, peak %M KiB' "$@"; else "$@"; fi
}
results=$out/results.txt
: > "$results"
run() {  # run LABEL EXECUTABLE IMAGES REPEAT
  folder=$out/${1}_$3_$4
  rm -rf "$folder"
  start=$(seconds)
  with_usage "$2" --threads "$threads" explain --model resnet50 --imagenet-stem --weights "$out/fixture/resnet50.pth" \
    --data "imagenet:$out/fixture/imagenet" --count "$3" --methods gradient --metrics none --out "$folder" \
    > "$folder.log" 2>&1
  whole=$(echo "$(seconds) - $start" | bc -l)
  methods=$(sed -n 's/^time: .*; methods \([0-9.e+-]*\) s.*/\1/p' "$folder.log")
  overhead=$(echo "100 * ($whole - $methods) / $methods" | bc -l)
  usage=$(sed -n 's/^usage: //p' "$folder.log")
  printf '%-6s %2d images: whole %.3f s, methods %.3f s, %soverhead %.1f%%\n' "$1" "$3" "$whole" "$methods" \
    "${usage:+$usage, }" "$overhead" | tee -a "$results"
}
for images in $image_counts; do
  for k in $(seq "$repeats"); do
    [ -n "$before" ] && run before "$before" "$images" "$k"
    run after "$after" "$images" "$k"
  done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$before" ]; then  # the same results from both (pictures by their pixels)
  for images in $image_counts; do
    printf '%s images, before against after: ' "$images"
    /usr/bin/python3 "$(dirname "$0")/compare_explain_outputs.py" "$out/before_${images}_1" "$out/after_${images}_1"
  done
fi
# The spread between runs of one executable is part of the result: the median too, and
# the range of the fixed part (whole - methods).
echo "median of $repeats runs each, and the range of whole - methods:"
awk '{ key = $1 " " $2 " " $3; o = $NF; sub("%", "", o)
       whole = $0; sub(/.*whole /, "", whole); sub(/ s,.*/, "", whole)
       methods = $0; sub(/.*methods /, "", methods); sub(/ s,.*/, "", methods)
       n[key]++; overhead[key, n[key]] = o + 0; fixed = whole - methods
       if (!(key in lo) || fixed < lo[key]) lo[key] = fixed
       if (!(key in hi) || fixed > hi[key]) hi[key] = fixed }
     END { for (k in n) {
             m = n[k]
             for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
               if (overhead[k, j] < overhead[k, i]) { t = overhead[k, i]; overhead[k, i] = overhead[k, j]; overhead[k, j] = t }
             median = m % 2 ? overhead[k, (m + 1) / 2] : (overhead[k, m / 2] + overhead[k, m / 2 + 1]) / 2
             printf "%s overhead median %.1f%% (%.1f-%.1f%%), whole - methods %.3f-%.3f s\n", k, median,
                    overhead[k, 1], overhead[k, m], lo[k], hi[k] } }' "$results" | sort -k1,1r -k2,2n
echo "best of $repeats runs each (the lowest overhead):"
awk '{ key = $1 " " $2; o = $NF; sub("%", "", o)
       if (!(key in best) || o + 0 < best[key] + 0) { best[key] = o; line[key] = $0 } }
     END { for (k in line) print line[k] }' "$results" | sort -k1,1r -k2,2n
