#!/usr/bin/env bash
# The exact route for one-block attention LMs against Monte Carlo and the recursion, on trained
# models of the size analysis/results/tensor_similarity.md reports ("Exact
# similarity of one-block LMs"): two bilinear-attention LMs (dim 8, 2 heads, bilinear MLP of
# 32, byte tokens: vocabulary 256) trained 300 steps on `fortunes:16` from seeds 0 and 1, then
# compared over 2 and 4 positions at input std 1 and 1/16 (the one-hot tokens' norm). Beside
# each exact score: BATCHES independent Monte Carlo runs of SAMPLES inputs each (--check-mc with
# --seed 1 … BATCHES), every inner product ⟨A|B⟩, ⟨A|A⟩, ⟨B|B⟩ checked apart against the exact
# route (one batch's heavy tail cannot hide in a single run's standard error), and the recursion.
#
#   analysis/experiments/lm_exact_check.sh OUT [SAMPLES] [BATCHES]     (defaults 200000 and 5)
#
# POSITIONS (default "2 4") picks the contexts compared. A rerun into the same OUT reuses the
# trained models, each cell's exact and recursion scores, and each batch already run with SAMPLES.
# Writes OUT/lm_exact_check.csv (a row per cell and batch) and OUT/lm_exact_check.md. For each
# inner product: the batches' mean against the exact value in units of the batch means' own
# standard error (their spread over sqrt(BATCHES), no single run's variance trusted), and how
# many batches' 95% intervals covered the exact value. Needs `apt-get install fortunes`.
set -euo pipefail
out=${1:?usage: lm_exact_check.sh OUT [SAMPLES] [BATCHES]}
samples=${2:-200000}
batches=${3:-5}
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
echo "positions,input_std,batch,exact,exact_ab,exact_aa,exact_bb,seconds,mc,mc_se,mc_ab,mc_ab_se,mc_aa,mc_aa_se,mc_bb,mc_bb_se,recursion" > "$csv"
for positions in ${POSITIONS:-2 4}; do
  for std in 1 0.0625; do
    cell=$out/T${positions}_std$std
    if [ ! -f "$cell/seconds" ]; then
      start=$(date +%s.%N)
      "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --no-baselines \
        --out "$cell" > "$cell.log"
      echo "$(date +%s.%N) - $start" | bc > "$cell/seconds"
      "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --no-baselines --recursion \
        --out "$cell/recursion" > "$cell.recursion.log"
    fi
    seconds=$(cat "$cell/seconds")
    for batch in $(seq 1 "$batches"); do
      # A batch already run with this many samples is reused (its report records the count).
      if ! grep -q "^samples,$samples\$" "$cell/mc$batch/samples" 2>/dev/null; then
        "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --no-baselines \
          --check-mc "$samples" --seed "$batch" --out "$cell/mc$batch" > "$cell.mc$batch.log"
        echo "samples,$samples" > "$cell/mc$batch/samples"
      fi
      # One row from the three CSVs: the exact score and inner products, this batch's, the recursion's.
      awk -F, -v positions="$positions" -v std="$std" -v batch="$batch" -v seconds="$seconds" '
        FNR == 1 { file++ }
        file == 1 && $1 == "tensor_similarity" { exact = $2; ab = $3; aa = $4 * $4; bb = $5 * $5 }
        file == 2 && $1 ~ /^monte_carlo_/ { mc[substr($1, 13)] = $2 }
        file == 3 && $1 == "tensor_similarity" { recursion = $2 }
        END {
          printf "%s,%s,%s,%.9g,%.9g,%.9g,%.9g,%.1f,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.6f\n", positions, std, batch,
                 exact, ab, aa, bb, seconds, mc["similarity"], mc["standard_error"], mc["inner_ab"],
                 mc["inner_ab_standard_error"], mc["inner_aa"], mc["inner_aa_standard_error"], mc["inner_bb"],
                 mc["inner_bb_standard_error"], recursion
        }' "$cell/tensorsim.csv" "$cell/mc$batch/tensorsim.csv" "$cell/recursion/tensorsim.csv" >> "$csv"
    done
  done
done
{
  echo "# Exact similarity of one-block LMs against Monte Carlo ($batches independent batches of $samples samples)"
  echo
  # What made it: read off the first comparison's report (commit, CPU, BLAS kernels).
  report=$out/T2_std1/index.html
  made_by() { sed -nE "s|.*<th>$1</th><td>([^<]*)</td>.*|\1|p" "$report" | head -1; }
  echo "Made by \`analysis/experiments/lm_exact_check.sh OUT $samples $batches\` at commit $(made_by commit);"
  echo "CPU $(made_by CPU), $(made_by 'BLAS kernels'), one thread. Time: the exact score's command alone."
  echo "Each inner product: the batches' mean − exact, in units of the batch means' standard error"
  echo "(their standard deviation over sqrt($batches)), and how many batches' own 95% intervals covered the exact value."
  echo
  echo "| positions | input std | exact cosine | time (s) | MC cosine (batch mean ± s.e.) | cosine z | ⟨A\|B⟩ exact | ⟨A\|B⟩ z | covered | ⟨A\|A⟩ exact | ⟨A\|A⟩ z | covered | ⟨B\|B⟩ exact | ⟨B\|B⟩ z | covered | recursion |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  tail -n +2 "$csv" | awk -F, '
    function add(name, value, se, exact) {
      n[key, name]++; sum[key, name] += value; sq[key, name] += value * value
      d = value - exact; if (d < 0) d = -d; if (d <= 1.96 * se) hit[key, name]++
    }
    function z(name, exact,   m, sd) {
      m = sum[key, name] / n[key, name]; sd = sqrt((sq[key, name] - n[key, name] * m * m) / (n[key, name] - 1))
      return sd > 0 ? (m - exact) / (sd / sqrt(n[key, name])) : 0
    }
    {
      key = $1 "," $2
      if (!(key in seen)) { seen[key] = 1; order[++cells] = key }
      E[key, "cos"] = $4; E[key, "ab"] = $5; E[key, "aa"] = $6; E[key, "bb"] = $7; T[key] = $8; R[key] = $17
      add("cos", $9, $10, $4); add("ab", $11, $12, $5); add("aa", $13, $14, $6); add("bb", $15, $16, $7)
    }
    END {
      for (c = 1; c <= cells; c++) {
        key = order[c]; split(key, p, ","); k = n[key, "cos"]
        m = sum[key, "cos"] / k; sd = sqrt((sq[key, "cos"] - k * m * m) / (k - 1)) / sqrt(k)
        printf "| %s | %s | %.6f | %s | %.6f ± %.6f | %.2f | %.6g | %.2f | %d of %d | %.6g | %.2f | %d of %d | %.6g | %.2f | %d of %d | %.6f |\n",
               p[1], p[2], E[key, "cos"], T[key], m, sd, z("cos", E[key, "cos"]),
               E[key, "ab"], z("ab", E[key, "ab"]), hit[key, "ab"], k, E[key, "aa"], z("aa", E[key, "aa"]), hit[key, "aa"], k,
               E[key, "bb"], z("bb", E[key, "bb"]), hit[key, "bb"], k, R[key]
      }
    }'
} > "$out/lm_exact_check.md"
cat "$out/lm_exact_check.md"
