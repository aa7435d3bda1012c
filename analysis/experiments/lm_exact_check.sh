#!/usr/bin/env bash
# The exact route for one-block attention LMs against Monte Carlo and the recursion, on trained
# models of the size analysis/results/tensor_similarity.md reports ("Exact
# similarity of one-block LMs"): two bilinear-attention LMs (dim 8, 2 heads, bilinear MLP of
# 32, byte tokens: vocabulary 256) trained 300 steps on `fortunes:16` from seeds 0 and 1, then
# compared over 2 and 4 positions at input std 1 and 1/16 (the one-hot tokens' norm). Beside
# each exact score: BATCHES independent Monte Carlo runs of SAMPLES inputs each (--check-mc with
# --seed 1 … BATCHES), every inner product ⟨A|B⟩, ⟨A|A⟩, ⟨B|B⟩ checked apart against the exact
# route (one batch's heavy tail cannot hide in a single run's standard error), and the recursion.
# Each batch records whether its estimate is marked unreliable (the tail diagnostics: its draws'
# Pareto shape, the largest draw's share of the variance, the self terms' effective draws).
#
#   analysis/experiments/lm_exact_check.sh OUT [SAMPLES] [BATCHES]     (defaults 200000 and 5)
#
# POSITIONS (default "2 4") picks the contexts compared. TEMPERED=R (default 0) adds, in each
# cell, R independent estimates of the sampled route itself (--sampled --seed 1 … R, sized to
# TOLERANCE, default 0.001, tempered over directions where marked), each against the exact
# values; SAMPLED_STDS (default "1 0.0625") the input stds where such runs are made (a run already
# made is reported wherever it is). A rerun into the same OUT reuses the trained models, each
# cell's exact and recursion scores, each batch already run with SAMPLES (and its diagnostics) and each tempered estimate.
# Writes OUT/lm_exact_check.csv (a row per cell and batch), OUT/lm_exact_check_sampled.csv (a
# row per cell and sampled estimate) and OUT/lm_exact_check.md. For each
# inner product: the batches' mean against the exact value in units of the batch means' own
# standard error (their spread over sqrt(BATCHES), no single run's variance trusted), and how
# many batches' 95% intervals covered the exact value; and the batches against the errors they
# claim (the pooled mean's z from them, the batches' spread over them). Needs `apt-get install fortunes`.
set -euo pipefail
out=${1:?usage: lm_exact_check.sh OUT [SAMPLES] [BATCHES]}
samples=${2:-200000}
batches=${3:-5}
tempered=${TEMPERED:-0}
tolerance=${TOLERANCE:-0.001}
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
echo "positions,input_std,batch,exact,exact_ab,exact_aa,exact_bb,seconds,mc,mc_se,mc_ab,mc_ab_se,mc_aa,mc_aa_se,mc_bb,mc_bb_se,recursion,reliable,pareto_shape,tail_share,effective_draws" > "$csv"
sampled_csv=$out/lm_exact_check_sampled.csv
echo "positions,input_std,run,exact,exact_ab,exact_aa,exact_bb,seconds,sampled,sampled_se,ab,ab_se,aa,aa_se,bb,bb_se,reliable" > "$sampled_csv"
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
      # A batch already run with this many samples, and its diagnostics, is reused (its report
      # records the count). Beside the recursion, not the exact score, which the cell has already.
      if ! grep -q "^samples,$samples\$" "$cell/mc$batch/samples" 2>/dev/null ||
         ! grep -q "^monte_carlo_reliable," "$cell/mc$batch/tensorsim.csv" 2>/dev/null; then
        "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --no-baselines --recursion \
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
          printf "%s,%s,%s,%.9g,%.9g,%.9g,%.9g,%.1f,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.6f,%d,%.4f,%.4f,%.1f\n", positions, std, batch,
                 exact, ab, aa, bb, seconds, mc["similarity"], mc["standard_error"], mc["inner_ab"],
                 mc["inner_ab_standard_error"], mc["inner_aa"], mc["inner_aa_standard_error"], mc["inner_bb"],
                 mc["inner_bb_standard_error"], recursion, mc["reliable"], mc["pareto_shape"], mc["tail_share"],
                 mc["effective_draws"]
        }' "$cell/tensorsim.csv" "$cell/mc$batch/tensorsim.csv" "$cell/recursion/tensorsim.csv" >> "$csv"
    done
    for run in $(seq 1 "$tempered"); do
      # The sampled route itself (tempered where its first estimate is marked), timed.
      dir=$cell/sampled$run
      if ! grep -q "^tolerance,$tolerance\$" "$dir/tolerance" 2>/dev/null; then
        case " ${SAMPLED_STDS-1 0.0625} " in *" $std "*) ;; *) continue ;; esac
        start=$(date +%s.%N)
        "$adjoint" --threads 1 tensorsim "$a" "$b" --positions "$positions" --input-std "$std" --no-baselines --sampled \
          --tolerance "$tolerance" --seed "$run" --out "$dir" > "$cell.sampled$run.log"
        echo "$(date +%s.%N) - $start" | bc > "$dir/seconds"
        echo "tolerance,$tolerance" > "$dir/tolerance"
      fi
      # The sampled score's row: the cosine and inner products, their standard errors, its mark.
      awk -F, -v positions="$positions" -v std="$std" -v run="$run" -v seconds="$(cat "$dir/seconds")" '
        FNR == 1 { file++ }
        file == 1 && $1 == "tensor_similarity" { exact = $2; ab = $3; aa = $4 * $4; bb = $5 * $5 }
        file == 2 && $1 == "tensor_similarity" { value = $2; sab = $3; saa = $4 * $4; sbb = $5 * $5 }
        file == 2 && $1 ~ /standard_error$|^reliable$/ { s[$1] = $2 }
        END {
          printf "%s,%s,%s,%.9g,%.9g,%.9g,%.9g,%.1f,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%d\n", positions, std, run, exact, ab, aa,
                 bb, seconds, value, s["standard_error"], sab, s["inner_ab_standard_error"], saa, s["inner_aa_standard_error"],
                 sbb, s["inner_bb_standard_error"], s["reliable"]
        }' "$cell/tensorsim.csv" "$dir/tensorsim.csv" >> "$sampled_csv"
    done
  done
done
{
  echo "# Exact similarity of one-block LMs against Monte Carlo ($batches independent batches of $samples samples)"
  echo
  # What made it: read off the first comparison's report (commit, CPU, BLAS kernels).
  report=$out/T2_std1/index.html
  made_by() { sed -nE "s|.*<th>$1</th><td>([^<]*)</td>.*|\1|p" "$report" | head -1; }
  echo "Made by \`POSITIONS=\"${POSITIONS:-2 4}\" TEMPERED=$tempered SAMPLED_STDS=\"${SAMPLED_STDS-1 0.0625}\" TOLERANCE=$tolerance analysis/experiments/lm_exact_check.sh OUT $samples $batches\`"
  echo "at commit $(made_by commit) (the first cell's report; later batches may be newer);"
  echo "CPU $(made_by CPU), $(made_by 'BLAS kernels'), one thread. Time: the exact score's command alone."
  echo "Each inner product: the batches' mean − exact, in units of the batch means' standard error"
  echo "(their standard deviation over sqrt($batches)), and how many batches' own 95% intervals covered the exact value."
  echo "With $batches batches that ratio is Student's t of $((batches - 1)) degrees of freedom, not a normal z: where the"
  echo "batches happen to lie close together it is large although each covers (the second table reads them against their claims)."
  echo
  echo "| positions | input std | exact cosine | time (s) | MC cosine (batch mean ± s.e.) | cosine t | ⟨A\|B⟩ exact | ⟨A\|B⟩ t | covered | ⟨A\|A⟩ exact | ⟨A\|A⟩ t | covered | ⟨B\|B⟩ exact | ⟨B\|B⟩ t | covered | marked | recursion |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
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
      if ($18 == 0) marked[key]++
    }
    END {
      for (c = 1; c <= cells; c++) {
        key = order[c]; split(key, p, ","); k = n[key, "cos"]
        m = sum[key, "cos"] / k; sd = sqrt((sq[key, "cos"] - k * m * m) / (k - 1)) / sqrt(k)
        printf "| %s | %s | %.6f | %s | %.6f ± %.6f | %.2f | %.6g | %.2f | %d of %d | %.6g | %.2f | %d of %d | %.6g | %.2f | %d of %d | %d of %d | %.6f |\n",
               p[1], p[2], E[key, "cos"], T[key], m, sd, z("cos", E[key, "cos"]),
               E[key, "ab"], z("ab", E[key, "ab"]), hit[key, "ab"], k, E[key, "aa"], z("aa", E[key, "aa"]), hit[key, "aa"], k,
               E[key, "bb"], z("bb", E[key, "bb"]), hit[key, "bb"], k, marked[key], k, R[key]
      }
    }'
  # The batches against the standard errors they claim: the pooled mean's z, (mean − exact) over
  # sqrt(Σ se²)/n, normal where the claims are right; and the batches' spread over their mean
  # claimed error, near 1 where the claims are right (a standard deviation of n draws: within
  # about ±1.96/sqrt(2(n − 1)) of its truth).
  echo
  echo "The batches against their own standard errors: the mean − exact over the pooled claimed error sqrt(Σ se²)/$batches"
  echo "(z), and the batches' standard deviation over their mean claimed error (spread; within about"
  echo "±$(echo "scale=2; 1.96 / sqrt(2 * ($batches - 1))" | bc) of 1 for $batches batches whose claims are right)."
  echo
  echo "| positions | input std | cosine z | spread | ⟨A\|B⟩ z | spread | ⟨A\|A⟩ z | spread | ⟨B\|B⟩ z | spread |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  tail -n +2 "$csv" | awk -F, '
    function add(name, value, se, exact) {
      n[key, name]++; sum[key, name] += value - exact; sq[key, name] += (value - exact) * (value - exact)
      claimed[key, name] += se; claimed_sq[key, name] += se * se
    }
    function cells(name,   k, m, sd) {
      k = n[key, name]; m = sum[key, name] / k; sd = sqrt((sq[key, name] - k * m * m) / (k - 1))
      return sprintf("%.2f | %.2f", m / (sqrt(claimed_sq[key, name]) / k), sd / (claimed[key, name] / k))
    }
    {
      key = $1 "," $2
      if (!(key in seen)) { seen[key] = 1; order[++cells_count] = key }
      add("cos", $9, $10, $4); add("ab", $11, $12, $5); add("aa", $13, $14, $6); add("bb", $15, $16, $7)
    }
    END {
      for (c = 1; c <= cells_count; c++) {
        key = order[c]; split(key, p, ",")
        printf "| %s | %s | %s | %s | %s | %s |\n", p[1], p[2], cells("cos"), cells("ab"), cells("aa"), cells("bb")
      }
    }'
  # Each batch apart: every estimate against the exact value in its own standard errors, and the
  # diagnostics that mark it.
  echo
  echo "Each batch: (estimate − exact)/(its own standard error), its draws' largest Pareto shape k̂, the self terms' effective draws, its mark."
  echo
  echo "| positions | input std | batch | cosine ± s.e. | z | ⟨A\|B⟩ z | ⟨A\|A⟩ ± s.e. | z | ⟨B\|B⟩ ± s.e. | z | k̂ | effective draws | marked |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|"
  tail -n +2 "$csv" | awk -F, '
    function z(v, se, exact) { return se > 0 ? (v - exact) / se : 0 }
    { printf "| %s | %s | %s | %.6f ± %.6f | %.1f | %.1f | %.4g ± %.2g | %.1f | %.4g ± %.2g | %.1f | %.2f | %.1f | %s |\n", $1, $2, $3,
             $9, $10, z($9, $10, $4), z($11, $12, $5), $13, $14, z($13, $14, $6), $15, $16, z($15, $16, $7), $19, $21,
             $18 == 1 ? "no" : "**marked**" }'
  if [ "$tempered" -gt 0 ]; then
    echo
    echo "The sampled route itself (\`--sampled --tolerance $tolerance\`, tempered over directions where its first estimate is"
    echo "marked), $tempered independent runs a cell: (estimate − exact)/(its own standard error), its time, its mark."
    echo
    echo "| positions | input std | run | cosine ± s.e. | z | ⟨A\|B⟩ ± s.e. | z | ⟨A\|A⟩ ± s.e. | z | ⟨B\|B⟩ ± s.e. | z | time (s) | marked |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|"
    tail -n +2 "$sampled_csv" | awk -F, '
      function z(v, se, exact) { return se > 0 ? (v - exact) / se : 0 }
      { printf "| %s | %s | %s | %.6f ± %.6f | %.1f | %.4g ± %.2g | %.1f | %.4g ± %.2g | %.1f | %.4g ± %.2g | %.1f | %s | %s |\n", $1, $2, $3,
               $9, $10, z($9, $10, $4), $11, $12, z($11, $12, $5), $13, $14, z($13, $14, $6), $15, $16, z($15, $16, $7), $8,
               $17 == 1 ? "no" : "**marked**" }'
  fi
} > "$out/lm_exact_check.md"
cat "$out/lm_exact_check.md"
