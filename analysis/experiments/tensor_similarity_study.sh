#!/usr/bin/env bash
# Why are the backdoor and forgetting effects weaker on Fashion-MNIST than the paper's SVHN
# figures? A short study (analysis/results/tensor_similarity.md, "Why the effects are weaker
# here"): the two experiments rerun with one thing changed at a time, three seeds each, then
# the metric and the bias coordinate checked on one pair of each.
#
#   analysis/experiments/tensor_similarity_study.sh OUT [SEEDS]
#
# Writes OUT/study.csv (one row per configuration and comparison: mean and range over seeds)
# and OUT/study.md; each configuration's own tables are in OUT/<configuration>/.
# Restartable: finished trainings are skipped (the experiment scripts' done markers).
set -euo pipefail
out=${1:?usage: tensor_similarity_study.sh OUT [SEEDS]}
seeds=${2:-0 1 2}
here=$(dirname "$0")
export ADJOINT=${ADJOINT:-$here/../../build/tools/adjoint}
mkdir -p "$out"

# The configurations: a name, then the environment the experiment script runs under.
backdoor_configs=(
  "backdoor_base|"
  "backdoor_wd0.5|WEIGHT_DECAY=0.5"
  "backdoor_trigger5|TRIGGER_SIZE=5"
  "backdoor_wide|MODEL_OPTS=--dim 128 --hidden 256"
)
forgetting_configs=(
  "forgetting_base|"
  "forgetting_wd0.5|WEIGHT_DECAY=0.5"
  "forgetting_paper_model|MODEL_OPTS=--dim 128 --hidden 256;WEIGHT_DECAY=0.5"
)

# run SCRIPT NAME|ENV: one configuration of one experiment, its output in OUT/NAME.
run() {
  local script=$1 name=${2%%|*} settings=${2#*|}
  local env_args=()
  IFS=';' read -r -a env_args <<< "$settings"
  echo "== $name (${settings:-defaults})"
  env "${env_args[@]}" bash "$here/$script" "$out/$name" "$seeds" > "$out/$name.log" 2>&1 ||
    { echo "$name failed: see $out/$name.log" >&2; exit 1; }
}
for c in "${backdoor_configs[@]}"; do run backdoor.sh "$c"; done
for c in "${forgetting_configs[@]}"; do run forgetting.sh "$c"; done

# The summary: per configuration and comparison, the affected class's slice and the mean of the
# other classes' slices, mean [min, max] over seeds.
summary() {  # CSV COLUMN_OF_KEY KEY_NAME: prints CONFIG,KEY,mean,min,max of the slice and of the others' mean
  awk -F, -v config="$2" -v kc="$3" -v sc="$4" -v oc="$5" 'NR > 1 {
      k = $kc; n[k]++; s[k] += $sc; o[k] += $oc
      if (!(k in lo) || $sc < lo[k]) lo[k] = $sc; if (!(k in hi) || $sc > hi[k]) hi[k] = $sc
    } END { for (k in n) printf "%s,%s,%.4f,%.4f,%.4f,%.4f\n", config, k, s[k] / n[k], lo[k], hi[k], o[k] / n[k] }' "$1" | sort
}
{
  echo "configuration,comparison,slice_mean,slice_min,slice_max,other_slices_mean"
  for c in "${backdoor_configs[@]}"; do summary "$out/${c%%|*}/backdoor.csv" "${c%%|*}" 2 5 8; done
  for c in "${forgetting_configs[@]}"; do summary "$out/${c%%|*}/forgetting.csv" "${c%%|*}" 2 3 6; done
} > "$out/study.csv.tmp"
mv "$out/study.csv.tmp" "$out/study.csv"

# The metric and the bias coordinate, on seed 0's poisoned and removed pairs: the affected
# slice under each metric, with and without the constant coordinate, and a Monte Carlo check.
measures() {  # A B: "identity gaussian data no-bias mc±se" for the slice of class CLASS
  local a=$1 b=$2 class=$3 row=""
  for metric in identity gaussian data; do
    "$ADJOINT" tensorsim "$a" "$b" --slices --metric "$metric" --data fashion-mnist --no-baselines \
      --out "$out/metrics_tmp" > /dev/null
    row+=",$(awk -F, -v k="slice_$class" '$1 == k { print $2 }' "$out/metrics_tmp/tensorsim.csv")"
  done
  "$ADJOINT" tensorsim "$a" "$b" --slices --no-bias --no-baselines --out "$out/metrics_tmp" > /dev/null
  row+=",$(awk -F, -v k="slice_$class" '$1 == k { print $2 }' "$out/metrics_tmp/tensorsim.csv")"
  "$ADJOINT" tensorsim "$a" "$b" --check-mc 200000 --no-baselines --out "$out/metrics_tmp" > /dev/null
  row+=",$(awk -F, '$1 == "tensor_similarity" { print $2 }' "$out/metrics_tmp/tensorsim.csv")"
  row+=",$(awk -F, '$1 == "monte_carlo_similarity" { print $2 }' "$out/metrics_tmp/tensorsim.csv")"
  row+=",$(awk -F, '$1 == "monte_carlo_standard_error" { print $2 }' "$out/metrics_tmp/tensorsim.csv")"
  echo "$row"
}
{
  echo "pair,class,slice_identity,slice_gaussian,slice_data,slice_gaussian_no_bias,total_gaussian,total_monte_carlo,monte_carlo_se"
  b="$out/backdoor_base/seed${seeds%% *}"
  echo "backdoor poison vs clean,0$(measures "$b/clean/checkpoint.safetensors" "$b/poison/checkpoint.safetensors" 0)"
  echo "backdoor control vs clean,0$(measures "$b/clean/checkpoint.safetensors" "$b/control/checkpoint.safetensors" 0)"
  f="$out/forgetting_base/seed${seeds%% *}"
  echo "forgetting removed vs before,3$(measures "$f/stage2/checkpoint.safetensors" "$f/stage3_removed/checkpoint.safetensors" 3)"
  echo "forgetting control vs before,3$(measures "$f/stage2/checkpoint.safetensors" "$f/stage3_control/checkpoint.safetensors" 3)"
} > "$out/metrics.csv.tmp"
rm -rf "$out/metrics_tmp"
mv "$out/metrics.csv.tmp" "$out/metrics.csv"

{
  echo "# Tensor similarity study: backdoor and forgetting on Fashion-MNIST, one change at a time"
  echo
  # What made it: read off the first training's report (commit, CPU, BLAS kernels, threads).
  report="$out/${backdoor_configs[0]%%|*}/seed${seeds%% *}/clean/index.html"
  made_by() { sed -nE "s|.*<th>$1</th><td>([^<]*)</td>.*|\1|p" "$report" | head -1; }
  echo "Made by \`analysis/experiments/tensor_similarity_study.sh OUT \"$seeds\"\` at commit $(made_by commit);"
  echo "CPU $(made_by CPU), $(made_by 'BLAS kernels'), $(made_by threads) thread(s) per run."
  echo
  echo "Seeds: $seeds. Slice: the target class (backdoor)"
  echo "or the removed class (forgetting); others: the mean of the other nine classes' slices."
  echo
  echo "| configuration | comparison | slice mean [min, max] | others' mean |"
  echo "|---|---|---|---:|"
  awk -F, 'NR > 1 { printf "| %s | %s | %.3f [%.3f, %.3f] | %.3f |\n", $1, $2, $3, $4, $5, $6 }' "$out/study.csv"
  echo
  echo "Metrics and the bias coordinate (seed ${seeds%% *}):"
  echo
  echo "| pair | class | identity | Gaussian | data | Gaussian, no bias | whole, Gaussian | Monte Carlo ± s.e. |"
  echo "|---|---:|---:|---:|---:|---:|---:|---|"
  awk -F, 'NR > 1 { printf "| %s | %s | %.3f | %.3f | %.3f | %.3f | %.4f | %.4f ± %.4f |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' "$out/metrics.csv"
} > "$out/study.md.tmp"
mv "$out/study.md.tmp" "$out/study.md"
cat "$out/study.md"
