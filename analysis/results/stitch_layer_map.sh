#!/bin/sh
# A layer × layer stitching map for a VGG↔VGG pair (issue #13, docs/methods.md §2.4): two
# VGG-11-BN models at width 1/4 trained 800 AdamW steps each on Fashion-MNIST (seeds 1 and
# 2), then standard-protocol slm stitching from every one of A's blocks 1, 3, 5, 7 into
# every one of B's blocks 1, 3, 5, 7 (16 stitches). Writes runs/stitch_layer_map/ (not
# committed): the sweep's results.{csv,md,json}, layer_map_slm_standard.{csv,png} and
# layer_maps.md, which analysis/results/stitch_layer_map.{md,png} were copied from. Run
# from the repository root after building; about 15 minutes on 2 cores.
set -e
ADJ=./build/tools/adjoint
OUT=runs/stitch_layer_map
mkdir -p $OUT
train() {  # name seed
  [ -f $OUT/$1/checkpoint.safetensors ] || nice -n 10 $ADJ train --model vgg11_bn --width 0.25 --data fashion-mnist \
    --max-steps 800 --batch 128 --optimizer adamw --lr 2e-3 --no-augment --seed $2 --threads 2 \
    --out $OUT/$1 > $OUT/$1.log
  tail -n 1 $OUT/$1.log
}
train A 1
train B 2
pairs=""
for i in 1 3 5 7; do for j in 1 3 5 7; do pairs="$pairs${pairs:+,}$i:$j"; done; done
nice -n 10 $ADJ stitch --front $OUT/A/checkpoint.safetensors --end $OUT/B/checkpoint.safetensors \
  --data fashion-mnist --pairs $pairs --objectives slm --protocol standard \
  --train-images 5000 --test-images 5000 --epochs 2 --threads 2 --out $OUT/sweep > $OUT/sweep.log 2>&1
cat $OUT/sweep/layer_maps.md
