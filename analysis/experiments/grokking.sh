#!/usr/bin/env bash
# The grokking experiment of docs/methods.md §3.5, end to end: modular addition P = 113, input two
# concatenated one-hots (226) → Bilinear(→64) → Linear(→113), AdamW lr 1e-3, weight decay 0.3,
# batch 512, 30% of the pairs for training, a checkpoint kept every 1000 steps; then every
# checkpoint compared with the last and with each other by tensor similarity
# (adjoint tensorsim --run): OUT/tensorsim/run_similarity.{csv,json,md},
# pairwise_similarity.{csv,png} and similarity_over_steps.png.
#
#   analysis/experiments/grokking.sh OUT [EPOCHS]
#
# EPOCHS of 7 steps each (default 8000: 56k steps, about 4 min on one thread).
set -euo pipefail
out=${1:?usage: grokking.sh OUT [EPOCHS]}
epochs=${2:-8000}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
[ -f "$out/done" ] || {
  "$adjoint" --threads 1 train --overwrite --model bilinear_mlp --hidden 64 --data modadd:113 --optimizer adamw --lr 1e-3 \
    --weight-decay 0.3 --batch 512 --epochs "$epochs" --schedule constant --keep-checkpoints every:1000 --out "$out"
  touch "$out/done"
}
"$adjoint" tensorsim --run "$out" --count 0
cat "$out/tensorsim/run_similarity.md"
