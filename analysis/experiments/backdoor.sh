#!/usr/bin/env bash
# The backdoor experiment of docs/methods.md §3.5, end to end: can tensor similarity, from the
# weights alone, see that a model learnt a backdoor?
#
#   analysis/experiments/backdoor.sh OUT [SEEDS] [CLEAN_EPOCHS] [MORE_EPOCHS] [TARGET]
#
# Per seed: a bilinear MLP (Fashion-MNIST flattened → Bilinear(→64) → Linear(→10)) trained
# clean for CLEAN_EPOCHS (default 10); then two branches continue from that state for
# MORE_EPOCHS (default 5) on the same batches: "poison", where 10% of the training images
# carry a bright 3×3 trigger and are relabelled TARGET (default 0), and "control", clean.
# Per branch: clean test accuracy, the trigger's success rate (test images with the trigger,
# all labelled TARGET), and the per-class slice similarity of the final weights to the
# clean-stage weights, computed with no poisoned data; CKA of the logits beside it. The
# effect is read as the gap between the branches. OUT/backdoor.md and OUT/backdoor.csv
# gather all seeds.
set -euo pipefail
out=${1:?usage: backdoor.sh OUT [SEEDS] [CLEAN_EPOCHS] [MORE_EPOCHS] [TARGET]}
seeds=${2:-0 1 2}
clean_epochs=${3:-10}
more_epochs=${4:-5}
target=${5:-0}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
# Through the environment: WEIGHT_DECAY (AdamW's decoupled weight decay, default 0.05),
# MODEL_OPTS (the model's size, default "--hidden 64"), TRIGGER_SIZE (the square's side, default 3).
read -r -a model_opts <<< "${MODEL_OPTS:---hidden 64}"
trigger_size=${TRIGGER_SIZE:-3}
common=(--model bilinear_mlp "${model_opts[@]}" --optimizer adamw --lr 1e-3 --weight-decay "${WEIGHT_DECAY:-0.05}" --schedule constant
        --batch 128 --no-augment)
total=$((clean_epochs + more_epochs))
mkdir -p "$out"

value() { awk -F, -v k="$1" '$1 == k { print $2 }' "$2"; }
accuracy() { "$adjoint" eval --checkpoint "$1" ${2:+--data "$2"} | sed -nE 's/.*accuracy ([0-9.]+)%.*/\1/p'; }

echo "seed,branch,clean_accuracy,trigger_success,target_slice,other_slices_min,other_slices_max,other_slices_mean,total,cka_logits" \
  > "$out/backdoor.csv.tmp"
for seed in $seeds; do
  run="$out/seed$seed"
  [ -f "$run/clean/done" ] || {
    "$adjoint" train --overwrite "${common[@]}" --data fashion-mnist --epochs "$clean_epochs" --seed "$seed" --out "$run/clean"
    touch "$run/clean/done"
  }
  for branch in poison control; do
    data=fashion-mnist
    [ "$branch" = poison ] && data="fashion-mnist+backdoor:0.1:$target:$trigger_size"
    [ -f "$run/$branch/done" ] || {
      "$adjoint" train --overwrite "${common[@]}" --data "$data" --epochs "$total" --seed "$seed" \
        --continue-from "$run/clean/checkpoint.safetensors" --out "$run/$branch"
      touch "$run/$branch/done"
    }
    "$adjoint" tensorsim "$run/clean/checkpoint.safetensors" "$run/$branch/checkpoint.safetensors" --slices \
      --data fashion-mnist --out "$run/$branch/tensorsim" > /dev/null
    csv="$run/$branch/tensorsim/tensorsim.csv"
    others=$(awk -F, -v t="slice_$target" '$1 ~ /^slice_/ && $1 != t { print $2 }' "$csv" | sort -g)
    echo "$seed,$branch,$(accuracy "$run/$branch/checkpoint.safetensors"),$(accuracy "$run/$branch/checkpoint.safetensors" "fashion-mnist+trigger:$target:$trigger_size"),$(value "slice_$target" "$csv"),$(echo "$others" | head -1),$(echo "$others" | tail -1),$(echo "$others" | awk '{ s += $1 } END { printf "%.6f", s / NR }'),$(value tensor_similarity "$csv"),$(value cka_logits "$csv")" \
      >> "$out/backdoor.csv.tmp"
  done
done
mv "$out/backdoor.csv.tmp" "$out/backdoor.csv"

{
  echo "# Backdoor: slice similarity of the final weights to the clean-stage weights"
  echo
  echo "bilinear MLP (${model_opts[*]}) on Fashion-MNIST; $clean_epochs clean epochs, then $more_epochs more either with 10% of"
  echo "the training images carrying a bright ${trigger_size}×${trigger_size} trigger relabelled class $target (poison) or clean (control), same batches."
  echo "AdamW lr 1e-3, weight decay ${WEIGHT_DECAY:-0.05}. Tensor similarity: Gaussian metric with the bias coordinate, no poisoned data used. Seeds: $seeds."
  echo
  echo "| seed | branch | clean acc. % | trigger success % | slice of class $target | other slices (min–max) | whole tensor | CKA logits |"
  echo "|---:|---|---:|---:|---:|---|---:|---:|"
  awk -F, 'NR > 1 { printf "| %s | %s | %s | %s | %.4f | %.4f–%.4f | %.4f | %.4f |\n", $1, $2, $3, $4, $5, $6, $7, $9, $10 }' "$out/backdoor.csv"
  echo
  echo "The effect read against the control: per class, control slice − poison slice (the drop the poison"
  echo "adds to the drift of continued training), the target class beside the largest drop among the others."
  echo
  echo "| seed | drop of class $target | largest other drop (class) | median other drop |"
  echo "|---:|---:|---|---:|"
  for seed in $seeds; do
    drops=$(paste -d, <(grep '^slice_' "$out/seed$seed/poison/tensorsim/tensorsim.csv" | cut -d, -f1,2) \
                      <(grep '^slice_' "$out/seed$seed/control/tensorsim/tensorsim.csv" | cut -d, -f1,2) |
            awk -F, '{ sub("slice_", "", $1); printf "%s %.4f\n", $1, $4 - $2 }')
    own=$(echo "$drops" | awk -v t="$target" '$1 == t { print $2 }')
    others=$(echo "$drops" | awk -v t="$target" '$1 != t' | sort -k2 -g)
    best=$(echo "$others" | tail -1)
    median=$(echo "$others" | awk '{ v[NR] = $2 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
    echo "| $seed | $own | ${best#* } (${best%% *}) | $median |"
  done
} > "$out/backdoor.md.tmp"
mv "$out/backdoor.md.tmp" "$out/backdoor.md"
cat "$out/backdoor.md"
