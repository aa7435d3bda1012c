#!/usr/bin/env bash
# The soft-ReLU temperature sweep of the results: the soft pullback at each τ, scored with
# the same perturbations (same --seed) on the same images, one `adjoint explain` run per τ,
# gathered into OUT/tau_sweep.csv and OUT/tau_sweep.md.
#
#   analysis/experiments/tau_sweep.sh CHECKPOINT OUT [COUNT] [TAUS]
#
# COUNT test images (default 200; max-sensitivity on the first 100), TAUS a space-separated
# list (default "0.1 0.2 0.4 0.6 1 2"). A gradient run on the same images is the reference
# row: as τ → 0 the soft pullback tends to the pullback, which for a ReLU/max-pool network
# in eval mode (statistics fixed) is the gradient itself.
set -euo pipefail
checkpoint=${1:?usage: tau_sweep.sh CHECKPOINT OUT [COUNT] [TAUS]}
out=${2:?usage: tau_sweep.sh CHECKPOINT OUT [COUNT] [TAUS]}
count=${3:-200}
taus=${4:-0.1 0.2 0.4 0.6 1 2}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
metrics=infidelity,max_sensitivity,random_logit,sparseness,complexity
mkdir -p "$out"
common=(--checkpoint "$checkpoint" --count "$count" --expensive-count 100 --metrics "$metrics"
        --examples 0 --no-attributions --seed 0)
"$adjoint" explain "${common[@]}" --methods gradient --out "$out/gradient"
for tau in $taus; do
  "$adjoint" explain "${common[@]}" --methods soft_pullback --tau-relu "$tau" --out "$out/tau_$tau"
done

# One row per run and metric: method, τ, metric, direction, mean, CI.
{
  echo "method,tau_relu,metric,direction,mean,ci_low,ci_high,count"
  awk -F, 'FNR > 1 { print $1 ",," $2 "," $3 "," $5 "," $7 "," $8 "," $9 }' "$out/gradient/metrics.csv"
  for tau in $taus; do
    awk -F, -v tau="$tau" 'FNR > 1 { print $1 "," tau "," $2 "," $3 "," $5 "," $7 "," $8 "," $9 }' "$out/tau_$tau/metrics.csv"
  done
} > "$out/tau_sweep.csv.tmp" && mv "$out/tau_sweep.csv.tmp" "$out/tau_sweep.csv"

# Markdown: one row per method/τ, one column per metric, mean [95% CI].
awk -F, -v metrics="$metrics" '
  NR == 1 { next }
  { key = ($2 == "" ? $1 : $1 " τ=" $2); if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    cell[key, $3] = sprintf("%.3g [%.3g, %.3g]", $5, $6, $7); dir[$3] = $4 }
  END {
    m = split(metrics, names, ",")
    line = "| method |"; rule = "|---|"
    for (j = 1; j <= m; ++j) { line = line " " names[j] " (" dir[names[j]] ") |"; rule = rule "---|" }
    print line; print rule
    for (i = 1; i <= n; ++i) {
      line = "| " order[i] " |"
      for (j = 1; j <= m; ++j) line = line " " cell[order[i], names[j]] " |"
      print line
    }
  }' "$out/tau_sweep.csv" > "$out/tau_sweep.md.tmp" && mv "$out/tau_sweep.md.tmp" "$out/tau_sweep.md"
echo "wrote $out/tau_sweep.csv and $out/tau_sweep.md"
