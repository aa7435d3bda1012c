#!/usr/bin/env bash
# The grokking experiment of docs/methods.md §3.5: a part of `adjoint reproduce
# tensor-similarity --scale full`, run alone. Modular addition P = 113, input two concatenated
# one-hots (226) → Bilinear(→64) → Linear(→113), AdamW lr 1e-3, weight decay 0.3, batch 512,
# 30% of the pairs for training, 56k steps with a checkpoint every 1000; then every checkpoint
# compared with the last and with each other (adjoint tensorsim --run):
# OUT/parts/grok_similarity_s<seed>/run_similarity.{csv,json,md}, pairwise_similarity.{csv,png}
# and similarity_over_steps.png, and OUT/index.html with the grokking claims.
#
#   analysis/experiments/grokking.sh OUT [SEEDS]      (about 10 min a seed on one thread)
set -euo pipefail
out=${1:?usage: grokking.sh OUT [SEEDS]}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
exec "$adjoint" --threads 1 reproduce tensor-similarity --scale full --seeds "${2:-1}" --only grok_similarity --out "$out"
