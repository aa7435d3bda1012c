#!/usr/bin/env bash
# The language experiment of docs/methods.md §3.5, end to end (also a part of
# `adjoint reproduce tensor-similarity`): a 2-block bilinear-attention transformer trained on
# English text from Debian's `fortunes` package (`--data fortunes:16`; nothing downloaded),
# checkpoints kept over training, then every checkpoint compared with the last and with each
# other by tensor similarity over a context of 4 positions, with the validation loss beside it.
#
#   analysis/experiments/language.sh OUT [STEPS] [CHECKPOINTS]
#
# The model is small enough for the exact attention term of the recursion (its cost grows
# with the sixth power of the head width): width 16, 2 heads, bilinear MLP of 32, residual
# scale 0.5, byte-level, sequences of 16 bytes, AdamW 3e-3 with a cosine schedule, STEPS steps
# (default 3000), CHECKPOINTS log-spaced checkpoints (default 10). Tensor similarity uses
# Gaussian inputs of the one-hot tokens' norm (--input-std 1/16 for 256 byte values).
# Needs `apt-get install fortunes`.
set -euo pipefail
out=${1:?usage: language.sh OUT [STEPS] [CHECKPOINTS]}
steps=${2:-3000}
checkpoints=${3:-10}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
mkdir -p "$out"
[ -f "$out/run/done" ] || {
  "$adjoint" train --overwrite --model bilinear_lm --attention bilinear --dim 16 --depth 2 --heads 2 --mlp-ratio 2 \
    --residual-scale 0.5 --data fortunes:16 --optimizer adamw --lr 3e-3 --weight-decay 0.05 \
    --batch 64 --epochs 1 --max-steps "$steps" --schedule cosine --warmup 100 --keep-checkpoints "log:$checkpoints" \
    --eval-limit 2000 --out "$out/run"
  touch "$out/run/done"
}
"$adjoint" tensorsim --run "$out/run" --positions 4 --input-std 0.0625 --count 2000
cat "$out/run/tensorsim/run_similarity.md"
