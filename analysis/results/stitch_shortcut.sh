#!/bin/sh
# The first small shortcut experiment of issue #13 (docs/methods.md §2.4): two clean models
# (C1, C2) on Fashion-MNIST and two shortcut models (S1, S2) on fashion-mnist+shortcut
# (a bright 2×2 patch whose position codes the class), VGG-11-BN at width 1/4, 800 AdamW
# steps each; then slm stitching under the standard and invariance-aware protocols for the
# same-bias pairs C1→C2, S1→S2 and the cross-bias pairs C1→S1, S1→C1, after blocks 3 and 7,
# stitch data and test set fashion-mnist+shortcut. Run from the repository root after
# building; about 50 minutes on 2 cores. Writes runs/stitch_shortcut/ (not committed) and
# prints the tables.
set -e
ADJ=./build/tools/adjoint
OUT=runs/stitch_shortcut
mkdir -p $OUT
train() {  # name seed data
  [ -f $OUT/$1/checkpoint.safetensors ] || nice -n 19 $ADJ train --model vgg11_bn --width 0.25 --data $3 \
    --epochs 1 --max-steps 800 --batch 128 --optimizer adamw --lr 2e-3 --no-augment --seed $2 --threads 2 \
    --out $OUT/$1 > $OUT/$1.log
  tail -n 1 $OUT/$1.log
}
train C1 1 fashion-mnist
train C2 2 fashion-mnist
train S1 3 fashion-mnist+shortcut
train S2 4 fashion-mnist+shortcut
# The four pairs, then the sanity rows (a model stitched into itself).
for pair in C1:C2 S1:S2 C1:S1 S1:C1 C1:C1 S1:S1; do
  front=${pair%%:*}; end=${pair##*:}
  nice -n 19 $ADJ stitch --front $OUT/$front/checkpoint.safetensors --end $OUT/$end/checkpoint.safetensors \
    --data fashion-mnist+shortcut --blocks 3,7 --objectives slm --protocol standard,invariance \
    --train-images 5000 --iri-images 256 --iri-steps 300 --epochs 3 --threads 2 \
    --out $OUT/${front}_${end} > $OUT/${front}_${end}.log 2>&1
  cat $OUT/${front}_${end}/results.md
done
# Block 7 with the default 1000 IRI steps, and the four objectives under the standard protocol.
for pair in C1:C2 C1:S1 S1:S2 S1:C1; do
  front=${pair%%:*}; end=${pair##*:}
  nice -n 19 $ADJ stitch --front $OUT/$front/checkpoint.safetensors --end $OUT/$end/checkpoint.safetensors \
    --data fashion-mnist+shortcut --blocks 7 --objectives slm --protocol invariance \
    --train-images 5000 --iri-images 256 --iri-steps 1000 --epochs 3 --threads 2 \
    --out $OUT/${front}_${end}_1000 > $OUT/${front}_${end}_1000.log 2>&1
  tail -n 1 $OUT/${front}_${end}_1000/results.md
done
for pair in C1:C2 C1:S1; do
  front=${pair%%:*}; end=${pair##*:}
  nice -n 19 $ADJ stitch --front $OUT/$front/checkpoint.safetensors --end $OUT/$end/checkpoint.safetensors \
    --data fashion-mnist+shortcut --blocks 3,7 --objectives hlm,slm,dm,fula --protocol standard \
    --train-images 5000 --epochs 3 --threads 2 \
    --out $OUT/${front}_${end}_objectives > $OUT/${front}_${end}_objectives.log 2>&1
  cat $OUT/${front}_${end}_objectives/results.md
done
# A random front (untrained: one step at lr 1e-12) into C2, on clean and on shortcut data.
[ -f $OUT/R/checkpoint.safetensors ] || nice -n 19 $ADJ train --model vgg11_bn --width 0.25 --data fashion-mnist \
  --epochs 1 --max-steps 1 --lr 1e-12 --optimizer adamw --weight-decay 0 --no-augment --seed 5 --threads 2 \
  --out $OUT/R > $OUT/R.log
for data in fashion-mnist fashion-mnist+shortcut; do
  nice -n 19 $ADJ stitch --front $OUT/R/checkpoint.safetensors --end $OUT/C2/checkpoint.safetensors \
    --data $data --blocks 3,7 --objectives slm --protocol standard,invariance \
    --train-images 5000 --iri-images 256 --iri-steps 300 --epochs 3 --threads 2 \
    --out $OUT/R_C2_$data > $OUT/R_C2_$data.log 2>&1
  cat $OUT/R_C2_$data/results.md
done
