#!/usr/bin/env bash
# The language experiment of docs/methods.md §3.5: a part of `adjoint reproduce
# tensor-similarity --scale full`, run alone. A 2-block bilinear-attention transformer
# (byte-level, width 16, 2 heads, bilinear MLP of 32, residual scale 0.5) trained on English
# text from Debian's `fortunes` package (`--data fortunes:16`, nothing downloaded) for one
# epoch (2157 steps of 64 sequences of 16 bytes, AdamW 3e-3 cosine), 10 log-spaced
# checkpoints; then every checkpoint compared with the last and with each other by tensor
# similarity over a context of 4 positions (the recursion with its exact attention term,
# Gaussian inputs of the one-hot tokens' norm, --input-std 1/16):
# OUT/parts/lm_similarity_s<seed>/, and OUT/index.html with the block-structure claim.
#
#   analysis/experiments/language.sh OUT [SEEDS]      (about 3 min a seed on 2 threads)
#
# Needs `apt-get install fortunes`.
set -euo pipefail
out=${1:?usage: language.sh OUT [SEEDS]}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
exec "$adjoint" reproduce tensor-similarity --scale full --seeds "${2:-1}" --only lm_similarity --out "$out"
