#!/usr/bin/env bash
# The robust-versus-standard experiment of docs/methods.md §2.4, end to end, over seeds: do
# robust and standard models look alike to standard stitching, and apart to the
# invariance-aware protocol?
#
#   analysis/experiments/stitch_robust.sh OUT [SEEDS] [EPOCHS]
#
# Per seed s: four VGG-11-BN at width 1/4 on Fashion-MNIST, EPOCHS epochs each (default 1:
# 469 AdamW steps of 128): C1, C2 trained as usual and R1, R2 trained on PGD adversarial
# examples (L∞, ε = 0.1 in [0, 1] pixels, 5 steps of 2.5·ε/5, Madry et al.). Then
# R1→R2 (robust into robust), C1→R1 (standard into robust), R1→C1 and C1→C2 are stitched
# after block 3 and block 7 with slm under the standard, control and invariance-aware
# protocols (5000 images; IRIs of 256 images, 300 normalised-L2 steps), every cell with
# rAuA: the area under the stitched model's accuracy under L∞ PGD (10 steps) over
# ε ∈ {0, 0.05, 0.1, 0.15} on 200 test images, relative to the end model's own area.
# OUT/stitch_robust.{csv,md} gather every seed (mean over seeds [smallest, largest]).
#
# Sizes: a PGD model costs about 4.3 standard ones; two seeds take about an hour on 2 cores.
# Every protocol's stitch trains for the same 200 steps (--steps), so that the protocols are
# compared at equal step budgets. Every finished model and cell is kept, so a rerun continues.
set -euo pipefail
out=${1:?usage: stitch_robust.sh OUT [SEEDS] [EPOCHS]}
seeds=${2:-0 1}
epochs=${3:-1}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
threads=${THREADS:-2}
source "$(dirname "$0")/stitching_lib.sh"
mkdir -p "$out"
pgd=(--pgd-norm linf --pgd-steps 5)
eps_grid=0,0.05,0.1,0.15

collect_header > "$out/stitch_robust.csv.tmp"
: > "$out/models.txt.tmp"
for seed in $seeds; do
  dir="$out/seed$seed"
  mkdir -p "$dir"
  train_model "$dir/C1" $((10 * seed + 1)) fashion-mnist
  train_model "$dir/C2" $((10 * seed + 2)) fashion-mnist
  train_model "$dir/R1" $((10 * seed + 5)) fashion-mnist --adversarial pgd --pgd-eps 0.1 "${pgd[@]}"
  train_model "$dir/R2" $((10 * seed + 6)) fashion-mnist --adversarial pgd --pgd-eps 0.1 "${pgd[@]}"
  for pair in R1:R2:robust→robust C1:R1:standard→robust R1:C1:robust→standard C1:C2:standard→standard; do
    IFS=: read -r front end kind <<< "$pair"
    stitch_pair "$dir" "$front" "$end" "$seed" --data fashion-mnist --blocks 3,7 --objectives slm \
      --protocol standard,control,invariance --train-images 5000 --iri-images 256 --iri-steps 300 --steps 200 \
      --raua-eps "$eps_grid" --raua-images 200 --pgd-norm linf --pgd-steps 10
    collect "$seed" "$front→$end" "$kind" "$dir/${front}_${end}/results.csv" >> "$out/stitch_robust.csv.tmp"
  done
  for model in C1 C2 R1 R2; do
    echo "seed $seed $model: $("$adjoint" eval --checkpoint "$dir/$model/checkpoint.safetensors" --threads "$threads" \
      --pgd-eps "$eps_grid" --pgd-images 500 --pgd-norm linf --pgd-steps 10 | tr '\n' ' ' |
      sed -E 's/  +/ /g')"
  done >> "$out/models.txt.tmp"
done
mv "$out/stitch_robust.csv.tmp" "$out/stitch_robust.csv"
mv "$out/models.txt.tmp" "$out/models.txt"

{
  echo "# Robust and standard models stitched ($(echo $seeds | wc -w) seeds; VGG-11-BN width 1/4, $epochs epoch(s))"
  echo
  echo "Relative score = stitched / end accuracy on the clean Fashion-MNIST test set: mean over seeds"
  echo "[smallest, largest]. \"B on IRIs\": the end model's accuracy against y(x) on the front's IRIs."
  echo
  summary_header kind
  summarise "$out/stitch_robust.csv" relative_score
  echo
  echo "rAuA = AuA(stitched) / AuA(end) under L∞ PGD (10 steps), ε ∈ {$eps_grid}, 200 test images:"
  echo
  summary_header kind
  summarise "$out/stitch_robust.csv" raua
  echo
  echo "Models (eval, with PGD on 500 test images):"
  echo
  sed 's/^/- /' "$out/models.txt"
} > "$out/stitch_robust.md.tmp"
mv "$out/stitch_robust.md.tmp" "$out/stitch_robust.md"
cat "$out/stitch_robust.md"
