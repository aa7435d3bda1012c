#!/bin/sh
# explain --evaluate in one process × 2 threads against `mpirun -n 2` × 1 thread each,
# side by side, REPEATS times each (alternating), on CHECKPOINT's first 128 test images
# with every method and metric; checks the tables are the same bytes and prints the wall
# times and the load. The figures are in docs/benchmarks.md.
#
#   tools/bench_explain_ranks.sh CHECKPOINT [REPEATS] [EXTRA OPTIONS...]
set -eu
checkpoint=$1
repeats=${2:-3}
shift; [ $# -gt 0 ] && shift
adjoint=${ADJOINT:-build/tools/adjoint}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common="explain --checkpoint $checkpoint --evaluate --count 128 $*"
seconds() { date +%s.%N; }
uptime
for k in $(seq "$repeats"); do
  start=$(seconds)
  "$adjoint" $common --threads 2 --out "$out/one_$k" > "$out/one_$k.log" 2>&1
  one=$(echo "$(seconds) - $start" | bc)
  start=$(seconds)
  mpirun --allow-run-as-root --mca btl self,vader -n 2 "$adjoint" $common --threads 1 --out "$out/two_$k" \
    > "$out/two_$k.log" 2>&1
  two=$(echo "$(seconds) - $start" | bc)
  same=yes
  for f in metrics.csv metrics.json metrics.md; do cmp -s "$out/one_1/$f" "$out/one_$k/$f" || same=no; done
  for f in metrics.csv metrics.json metrics.md; do cmp -s "$out/one_1/$f" "$out/two_$k/$f" || same=no; done
  printf 'repeat %s: 1 process x 2 threads %.1f s, mpirun -n 2 x 1 thread %.1f s, ratio %.2f, tables identical: %s\n' \
    "$k" "$one" "$two" "$(echo "$one / $two" | bc -l)" "$same"
done
uptime
