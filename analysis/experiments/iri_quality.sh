#!/usr/bin/env bash
# Which IRI search reaches good IRIs (median relative distance ≤ 0.05, docs/methods.md §2.3)
# at the blocks of a VGG-11-BN that still hold a spatial map, and what the invariance-aware
# score of a same-bias and a cross-bias pair is once it does (analysis/results/iri_quality.csv).
#
#   analysis/experiments/iri_quality.sh OUT [SEED]
#
# Trains C1, C2 (Fashion-MNIST) and S1 (fashion-mnist+shortcut), VGG-11-BN at width 1/4, one
# epoch each (stitching_lib.sh), then for every search (rule × cotangent × steps) and block
# finds the IRIs of 64 of C1's images (--iri-images 64) and stitches C1→C2 and
# C1→S1 on them with the least-squares stitch (--steps 0, the same for every search).
# Writes OUT/iri_quality.csv (one line per search, block and pair) and prints it.
set -euo pipefail
out=${1:?usage: iri_quality.sh OUT [SEED]}
seed=${2:-0}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
threads=${THREADS:-1}
epochs=1
source "$(dirname "$0")/stitching_lib.sh"
mkdir -p "$out"
train_model "$out/C1" $((10 * seed + 1)) fashion-mnist
train_model "$out/C2" $((10 * seed + 2)) fashion-mnist
train_model "$out/S1" $((10 * seed + 3)) fashion-mnist+shortcut

blocks=2,3,4
csv=$out/iri_quality.csv
echo "seed,rule,transport,iri_steps,pair,front_block,iri_median_distance,iri_p90_distance,iri_share_below_0.05,end_agrees_on_iris,relative_score,seconds" > "$csv"
for search in l2:gradient:300 l2:gradient:1000 l2:gradient:3000 adam:gradient:1000 adam:gradient:3000 \
              l2:soft_pullback:1000 adam:soft_pullback:1000 adam:soft_pullback:3000; do
  IFS=: read -r rule transport steps <<< "$search"
  for end in C2 S1; do
    cell=$out/${rule}_${transport}_${steps}_C1_$end
    start=$(date +%s.%N)
    # An IRI set depends on the front alone: the second end reuses the first one's (the
    # sweep checks the set's record before it reads it).
    [ "$end" = S1 ] && [ ! -d "$cell/iris" ] && [ -d "${cell%_S1}_C2/iris" ] && mkdir -p "$cell" && cp -r "${cell%_S1}_C2/iris" "$cell/"
    [ -f "$cell/results.csv" ] ||
      "$adjoint" --threads "$threads" stitch --front "$out/C1/checkpoint.safetensors" --end "$out/$end/checkpoint.safetensors" \
        --data fashion-mnist+shortcut --test-data fashion-mnist --blocks "$blocks" --protocol invariance --objectives slm \
        --steps 0 --train-images 1000 --iri-images 64 --test-images 2000 --iri-rule "$rule" --iri-transport "$transport" \
        --iri-steps "$steps" --seed "$seed" --out "$cell" > "$cell.log" 2>&1
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    # The columns by name, one line per block.
    awk -F, -v pre="$seed,$rule,$transport,$steps,C1->$end" -v sec="$seconds" '
      NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
      { print pre "," $col["front_block"] "," $col["iri_median_distance"] "," $col["iri_p90_distance"] "," \
              $col["iri_share_below_0.05"] "," $col["end_agrees_on_iris"] "," $col["relative_score"] "," sec }' \
      "$cell/results.csv" >> "$csv"
  done
done
column -s, -t < "$csv"
