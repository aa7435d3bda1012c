#!/usr/bin/env bash
# Layer × layer stitching maps (docs/methods.md §2.4): A's block i into B's block j, standard
# protocol, for two seeds of one architecture and across architectures.
#
#   analysis/experiments/stitch_layer_maps.sh OUT [PAIRS]
#
# PAIRS (default "vgg:vgg resnet:resnet vit:vit resnet:vit vit:resnet") names front:end
# families; each family is two models trained on Fashion-MNIST (seeds 1 and 2, 800 AdamW
# steps of 128, lr 2e-3, no augmentation):
#   vgg     VGG-11-BN at width 1/4; blocks 1, 3, 5, 7 (features.4, .11, .18, .25)
#   resnet  ResNet-18 at width 1/4; blocks 2, 4, 6, 8 (layer1.1, layer2.1, layer3.1, layer4.1)
#   vit     a ViT of width 64, depth 4, 4 heads, patches of 4 (7×7 tokens and a class
#           token); blocks 1, 2, 3, 4 (blocks.0 … blocks.3)
# A same-family pair stitches the first model into the second; a cross pair the first of
# one family into the second of the other, through the map↔token adapter. Every cell: slm,
# least squares then 2 epochs of AdamW on the first 5000 training images, scored on the
# first 5000 test images. OUT/<front>_<end>/ holds the sweep, its layer_map_slm_standard.png
# and layer_maps.md; OUT/layer_maps.md gathers them.
#
# Sizes: about 6 models of 3–6 minutes and 16 cells of 20–40 s per map on 2 cores.
set -euo pipefail
out=${1:?usage: stitch_layer_maps.sh OUT [PAIRS]}
pairs=${2:-vgg:vgg resnet:resnet vit:vit resnet:vit vit:resnet}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
threads=${THREADS:-2}
source "$(dirname "$0")/stitching_lib.sh"
mkdir -p "$out"

# BLOCKS_VGG, BLOCKS_RESNET and BLOCKS_VIT choose fewer (or other) blocks.
blocks() {
  case $1 in
    vgg) echo "${BLOCKS_VGG:-1 3 5 7}" ;;
    resnet) echo "${BLOCKS_RESNET:-2 4 6 8}" ;;
    vit) echo "${BLOCKS_VIT:-1 2 3 4}" ;;
  esac
}

train_family_model() {  # family seed
  local run="$out/models/$1_$2"
  mkdir -p "$out/models"
  [ -f "$run/checkpoint.safetensors" ] && return
  # shellcheck disable=SC2046
  "$adjoint" train --overwrite $(family_options "$1") --data fashion-mnist --max-steps 800 --batch 128 \
    --optimizer adamw --lr 2e-3 --no-augment --seed "$2" --threads "$threads" --out "$run" > "$run.log" 2>&1
}

echo "# Layer × layer stitching maps (standard protocol, slm)" > "$out/layer_maps.md.tmp"
for pair in $pairs; do
  front=${pair%%:*} end=${pair##*:}
  train_family_model "$front" 1
  train_family_model "$end" 2
  cells=""
  for i in $(blocks "$front"); do for j in $(blocks "$end"); do cells="$cells${cells:+,}$i:$j"; done; done
  "$adjoint" stitch --front "$out/models/${front}_1/checkpoint.safetensors" \
    --end "$out/models/${end}_2/checkpoint.safetensors" --data fashion-mnist --pairs "$cells" --objectives slm \
    --protocol standard --train-images 5000 --test-images 5000 --epochs 2 --threads "$threads" \
    --out "$out/${front}_${end}" > "$out/${front}_${end}.log" 2>&1
  { echo; echo "## $front (seed 1) → $end (seed 2)"; echo; tail -n +2 "$out/${front}_${end}/layer_maps.md"; } \
    >> "$out/layer_maps.md.tmp"
done
mv "$out/layer_maps.md.tmp" "$out/layer_maps.md"
cat "$out/layer_maps.md"
