#!/usr/bin/env bash
# The exact route for one-block attention LMs against Monte Carlo and the recursion, on trained
# models of the size analysis/results/tensor_similarity.md reports ("Exact
# similarity of one-block LMs"): two bilinear-attention LMs (dim 8, 2 heads, bilinear MLP of
# 32, byte tokens: vocabulary 256) trained 300 steps on `fortunes:16` from seeds 0 and 1, then
# compared over 2 and 4 positions at input std 1 and 1/16 (the one-hot tokens' norm), each
# with a 10⁶-sample Monte Carlo check beside it (--check-mc) and the recursion (--recursion).
#
#   analysis/experiments/lm_exact_check.sh OUT [SAMPLES]     (about 25 min on one core)
#
# Writes OUT/lm_exact_check.csv and OUT/lm_exact_check.md (every slice's distance from Monte
# Carlo in its standard errors, summarised). Needs `apt-get install fortunes`.
set -euo pipefail
out=${1:?usage: lm_exact_check.sh OUT [SAMPLES]}
samples=${2:-1000000}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
mkdir -p "$out"
for seed in 0 1; do
  [ -f "$out/lm_s$seed/checkpoint.safetensors" ] ||
    "$adjoint" --threads 1 train --model bilinear_lm --attention bilinear --dim 8 --heads 2 --depth 1 \
      --data fortunes:16 --epochs 1 --max-steps 300 --seed "$seed" --optimizer adamw --lr 3e-3 \
      --out "$out/lm_s$seed" > "$out/lm_s$seed.log"
done
a=$out/lm_s0/checkpoint.safetensors b=$out/lm_s1/checkpoint.safetensors
csv=$out/lm_exact_check.csv
echo "positions,input_std,exact,seconds,monte_carlo,standard_error,z,slices_within_3,slices,largest_slice_z,recursion,recursion_z" > "$csv"
for positions in 2 4; do
  for std in 1 0.0625; do
    cell=$out/T${positions}_std$std
    start=$(date +%s.%N)
    "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --slices --no-baselines \
      --out "$cell" > "$cell.log"
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --slices --no-baselines \
      --check-mc "$samples" --out "$cell/mc" > "$cell.mc.log"
    "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --no-baselines --recursion \
      --out "$cell/recursion" > "$cell.recursion.log"
    # One row from the three CSVs: the exact score and slices, Monte Carlo's, the recursion's.
    awk -F, -v positions="$positions" -v std="$std" -v seconds="$seconds" '
      FNR == 1 { file++ }
      file == 1 && $1 == "tensor_similarity" { exact = $2 }
      file == 1 && $1 ~ /^slice_[0-9]+$/ { split($1, p, "_"); slice[p[2]] = $2 }
      file == 2 && $1 == "monte_carlo_similarity" { mc = $2 }
      file == 2 && $1 == "monte_carlo_standard_error" { se = $2 }
      file == 2 && $1 ~ /^monte_carlo_slice_[0-9]+$/ { split($1, p, "_"); mslice[p[4]] = $2 }
      file == 2 && $1 ~ /^monte_carlo_slice_[0-9]+_standard_error$/ { split($1, p, "_"); sse[p[4]] = $2 }
      file == 3 && $1 == "tensor_similarity" { recursion = $2 }
      END {
        n = 0; within = 0; largest = 0
        for (k in slice) if (sse[k] > 0) {
          z = (slice[k] - mslice[k]) / sse[k]; z = z < 0 ? -z : z
          n++; if (z <= 3) within++; if (z > largest) largest = z
        }
        printf "%s,%s,%.6f,%.1f,%.6f,%.6f,%.2f,%d,%d,%.2f,%.6f,%.1f\n", positions, std, exact, seconds, mc, se,
               (exact - mc) / se, within, n, largest, recursion, (recursion - mc) / se
      }' "$cell/tensorsim.csv" "$cell/mc/tensorsim.csv" "$cell/recursion/tensorsim.csv" >> "$csv"
  done
done
{
  echo "# Exact similarity of one-block LMs against Monte Carlo ($samples samples)"
  echo
  # What made it: read off the first comparison's report (commit, CPU, BLAS kernels).
  report=$out/T2_std1/index.html
  made_by() { sed -nE "s|.*<th>$1</th><td>([^<]*)</td>.*|\1|p" "$report" | head -1; }
  echo "Made by \`analysis/experiments/lm_exact_check.sh OUT $samples\` at commit $(made_by commit);"
  echo "CPU $(made_by CPU), $(made_by 'BLAS kernels'), one thread. Time: the exact score's command alone."
  echo
  echo "| positions | input std | exact | time (s) | Monte Carlo ± s.e. | exact − MC (s.e.) | slices within 3 s.e. | largest slice (s.e.) | recursion | recursion − MC (s.e.) |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  tail -n +2 "$csv" | awk -F, '{ printf "| %s | %s | %s | %s | %s ± %s | %s | %s of %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }'
} > "$out/lm_exact_check.md"
cat "$out/lm_exact_check.md"
