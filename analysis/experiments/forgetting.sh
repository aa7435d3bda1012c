#!/usr/bin/env bash
# The forgetting experiment of docs/methods.md §3.5, end to end: a curriculum that adds classes,
# removes one and re-adds it, read through per-class slice similarity of the weights.
#
#   analysis/experiments/forgetting.sh OUT [SEEDS] [STAGE_STEPS] [REMOVED]
#
# Per seed, a bilinear MLP (Fashion-MNIST flattened → Bilinear(→64) → Linear(→10)) goes
# through four stages of STAGE_STEPS steps each (default 2000, batch 128):
#   1 classes 0–4   2 all classes ("before")   3 all but REMOVED (default 3)   4 all again
# and a control branch that runs stage 3 on all classes from the same state. Slices compare
# stage 2's weights with stage 3's (removed vs control) and with stage 4's (re-added).
# OUT/forgetting.md and OUT/forgetting.csv gather all seeds.
set -euo pipefail
out=${1:?usage: forgetting.sh OUT [SEEDS] [STAGE_STEPS] [REMOVED]}
seeds=${2:-0 1 2}
stage=${3:-2000}
removed=${4:-3}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
# Through the environment: WEIGHT_DECAY (AdamW's decoupled weight decay, default 0.05) and
# MODEL_OPTS (the model's size, default "--hidden 64").
read -r -a model_opts <<< "${MODEL_OPTS:---hidden 64}"
common=(--model bilinear_mlp "${model_opts[@]}" --optimizer adamw --lr 1e-3 --weight-decay "${WEIGHT_DECAY:-0.05}" --schedule constant
        --batch 128 --no-augment --epochs 1000)
without=$(seq 0 9 | grep -vx "$removed" | paste -sd, -)
mkdir -p "$out"

value() { awk -F, -v k="$1" '$1 == k { print $2 }' "$2"; }
# train NAME DATA STEPS [FROM]: one stage, skipped when already done (restartable).
train_stage() {
  [ -f "$run/$1/done" ] && return
  "$adjoint" train --overwrite "${common[@]}" --data "$2" --max-steps "$3" --seed "$seed" ${4:+--continue-from "$4"} --out "$run/$1"
  touch "$run/$1/done"
}
# compare A B NAME: slices of B against A, one CSV row.
compare() {
  "$adjoint" tensorsim "$run/$1/checkpoint.safetensors" "$run/$2/checkpoint.safetensors" --slices \
    --data fashion-mnist --out "$run/$3" > /dev/null
  local csv="$run/$3/tensorsim.csv"
  local others
  others=$(awk -F, -v t="slice_$removed" '$1 ~ /^slice_/ && $1 != t { print $2 }' "$csv" | sort -g)
  echo "$seed,$3,$(value "slice_$removed" "$csv"),$(echo "$others" | head -1),$(echo "$others" | tail -1),$(echo "$others" | awk '{ s += $1 } END { printf "%.6f", s / NR }'),$(value tensor_similarity "$csv"),$(value cka_logits "$csv")" >> "$out/forgetting.csv.tmp"
}

echo "seed,comparison,removed_slice,other_slices_min,other_slices_max,other_slices_mean,total,cka_logits" > "$out/forgetting.csv.tmp"
for seed in $seeds; do
  run="$out/seed$seed"
  train_stage stage1 "fashion-mnist+classes:0-4" "$stage"
  train_stage stage2 fashion-mnist $((2 * stage)) "$run/stage1/checkpoint.safetensors"
  train_stage stage3_removed "fashion-mnist+classes:$without" $((3 * stage)) "$run/stage2/checkpoint.safetensors"
  train_stage stage3_control fashion-mnist $((3 * stage)) "$run/stage2/checkpoint.safetensors"
  train_stage stage4_readded fashion-mnist $((4 * stage)) "$run/stage3_removed/checkpoint.safetensors"
  compare stage2 stage3_removed removed_vs_before
  compare stage2 stage3_control control_vs_before
  compare stage2 stage4_readded readded_vs_before
done
mv "$out/forgetting.csv.tmp" "$out/forgetting.csv"

{
  echo "# Forgetting: per-class slice similarity to the weights before class $removed was removed"
  echo
  echo "bilinear MLP (${model_opts[*]}) on Fashion-MNIST, stages of $stage steps: classes 0–4, all, all but $removed"
  echo "(or all: control), all again. AdamW lr 1e-3, weight decay ${WEIGHT_DECAY:-0.05}. Tensor similarity: Gaussian metric with the bias coordinate. Seeds: $seeds."
  echo
  echo "| seed | comparison | slice of class $removed | other slices (min–max) | whole tensor | CKA logits |"
  echo "|---:|---|---:|---|---:|---:|"
  awk -F, 'NR > 1 { printf "| %s | %s | %.4f | %.4f–%.4f | %.4f | %.4f |\n", $1, $2, $3, $4, $5, $7, $8 }' "$out/forgetting.csv"
} > "$out/forgetting.md.tmp"
mv "$out/forgetting.md.tmp" "$out/forgetting.md"
cat "$out/forgetting.md"
