#!/usr/bin/env bash
# Excessive agreement (docs/methods.md §2.4), end to end, over seeds: when the stitch-training
# images carry a cue that the models never saw, does stitching read the cue instead of
# the front model's function, and do IRIs take that away?
#
#   analysis/experiments/stitch_excessive_agreement.sh OUT [SEEDS] [EPOCHS]
#
# Per seed s: C1, C2 (VGG-11-BN at width 1/4, EPOCHS epochs on clean Fashion-MNIST) and U,
# the same network untrained (one step at lr 1e-12: a front with no function at all). C1→C2
# and U→C2 are stitched after blocks 3 and 7 on fashion-mnist+shortcut-train: a bright 2×2
# patch whose position codes the class is in every stitch-training image (and so in the
# images the IRIs imitate), never in the test images. Objectives hlm (labels, which the cue
# predicts) and slm (C2's soft labels); protocols standard (5000 images), control and
# invariance-aware (IRIs of 256 images, 300 normalised-L2 steps). Every stitch is scored on
# the clean test set and on the same test set with the cue (fashion-mnist+shortcut).
#
# The agreement the cue buys is the stitched accuracy with the cue minus without it, in
# points: a stitch that reads the garment through A gains nothing from the patch; one that
# learnt the patch gains up to what the garment leaves. OUT/stitch_excessive_agreement.{csv,md}.
#
# Every protocol's stitch trains for the same 200 steps (--steps), so that the protocols are
# compared at equal step budgets.
#
# Sizes: 3 models and 24 cells per seed; about 10 minutes a seed on 2 cores.
set -euo pipefail
out=${1:?usage: stitch_excessive_agreement.sh OUT [SEEDS] [EPOCHS]}
seeds=${2:-0 1 2}
epochs=${3:-1}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
threads=${THREADS:-2}
source "$(dirname "$0")/stitching_lib.sh"
cue=fashion-mnist+shortcut
cell_columns+=("stitched_accuracy[$cue]")
mkdir -p "$out"

collect_header > "$out/cells.csv.tmp"
for seed in $seeds; do
  dir="$out/seed$seed"
  mkdir -p "$dir"
  train_model "$dir/C1" $((10 * seed + 1)) fashion-mnist
  train_model "$dir/C2" $((10 * seed + 2)) fashion-mnist
  lr=1e-12 train_model "$dir/U" $((10 * seed + 7)) fashion-mnist --max-steps 1 --weight-decay 0
  for pair in C1:C2:trained U:C2:untrained; do
    IFS=: read -r front end kind <<< "$pair"
    stitch_pair "$dir" "$front" "$end" "$seed" --data fashion-mnist+shortcut-train --test-data "$cue" \
      --blocks 3,7 --objectives hlm,slm --protocol standard,control,invariance --train-images 5000 \
      --iri-images 256 --iri-steps 300 --steps 200
    collect "$seed" "$front→$end" "$kind" "$dir/${front}_${end}/results.csv" >> "$out/cells.csv.tmp"
  done
done
# The cue's gain, in points, as one more column.
awk -F, -v OFS=, -v cued="stitched_accuracy[$cue]" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; print $0, "cue_gain"; next }
  { print $0, 100 * ($col[cued] - $col["stitched_accuracy"]) }' "$out/cells.csv.tmp" > "$out/stitch_excessive_agreement.csv"
rm "$out/cells.csv.tmp"

{
  echo "# Excessive agreement over seeds ($(echo $seeds | wc -w) seeds; VGG-11-BN width 1/4, $epochs epoch(s))"
  echo
  echo "Stitch training on fashion-mnist+shortcut-train (the cue in stitch-training images only)."
  echo "The cue's gain: stitched accuracy on the test set with the cue minus on the clean one, in"
  echo "points (mean over seeds [smallest, largest]):"
  echo
  summary_header front
  summarise "$out/stitch_excessive_agreement.csv" cue_gain
  echo
  echo "Stitched accuracy on the clean test set, relative to C2's own:"
  echo
  summary_header front
  summarise "$out/stitch_excessive_agreement.csv" relative_score
} > "$out/stitch_excessive_agreement.md.tmp"
mv "$out/stitch_excessive_agreement.md.tmp" "$out/stitch_excessive_agreement.md"
cat "$out/stitch_excessive_agreement.md"
