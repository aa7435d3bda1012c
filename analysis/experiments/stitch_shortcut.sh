#!/usr/bin/env bash
# The shortcut experiment of METHODS.md §2.4, end to end, over seeds: does stitching tell
# a model that reads a pixel shortcut from one that reads the garment?
#
#   analysis/experiments/stitch_shortcut.sh OUT [SEEDS] [EPOCHS]
#
# Per seed s: four VGG-11-BN at width 1/4, EPOCHS epochs each (default 1: 469 AdamW steps of 128):
# C1, C2 on Fashion-MNIST and S1, S2 on fashion-mnist+shortcut (a bright 2×2 patch whose
# position codes the class, in every training and test image). Then the same-bias pairs
# C1→C2, S1→S2 and the cross-bias pairs C1→S1, S1→C1 are stitched after block 3
# (`features.11`, 64×3×3) and block 7 (`features.25`, the last before the head) with the
# slm objective under the standard protocol (5000 real images), the control (the 256 natural
# images the IRIs imitate: the set's size alone) and the invariance-aware one (the front's
# IRIs of those 256 images, 300 normalised-L2 steps: closer IRIs moved no score by more than
# 0.03 at block 7, see analysis/results/stitch_shortcut.md); stitch training and test set
# are fashion-mnist+shortcut. OUT/stitch_shortcut.{csv,md} gather every seed; the
# Markdown gives the mean over seeds with the smallest and largest value.
#
# Sizes: 12 models of about a minute each and 24 stitch cells per seed; about 45 minutes
# for three seeds on 2 cores. Every finished model and cell is kept, so a rerun continues.
set -euo pipefail
out=${1:?usage: stitch_shortcut.sh OUT [SEEDS] [EPOCHS]}
seeds=${2:-0 1 2}
epochs=${3:-1}
adjoint=${ADJOINT:-$(dirname "$0")/../../build/tools/adjoint}
threads=${THREADS:-2}
mkdir -p "$out"

train() {  # name seed data model-seed
  local run="$out/seed$2/$1"
  [ -f "$run/checkpoint.safetensors" ] && return
  "$adjoint" train --overwrite --model vgg11_bn --width 0.25 --data "$3" --epochs "$epochs" \
    --batch 128 --optimizer adamw --lr 2e-3 --no-augment --seed "$4" \
    --threads "$threads" --out "$run" > "$run.log"
}

stitch() {  # seed front end
  local dir="$out/seed$1" cell="$out/seed$1/$2_$3"
  # The IRI set depends on the front model alone: a second end reuses the first one's.
  if [ ! -d "$cell/iris" ]; then
    for done in "$dir/$2"_*/iris; do [ -d "$done" ] && { mkdir -p "$cell"; cp -r "$done" "$cell/"; break; }; done
  fi
  "$adjoint" stitch --front "$dir/$2/checkpoint.safetensors" --end "$dir/$3/checkpoint.safetensors" \
    --data fashion-mnist+shortcut --blocks 3,7 --objectives slm --protocol standard,control,invariance \
    --train-images 5000 --iri-images 256 --iri-steps 300 --epochs 3 --seed "$1" --threads "$threads" \
    --out "$cell" > "$cell.log" 2>&1
}

# A column of a CSV by its header name, so that added columns do not break the script.
column() { awk -F, -v name="$1" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next } { print $c }' "$2"; }

echo "seed,pair,bias,block,protocol,stitched_accuracy,end_accuracy,relative_score,end_agrees_on_iris,iri_median_distance" \
  > "$out/stitch_shortcut.csv.tmp"
: > "$out/models.txt.tmp"
for seed in $seeds; do
  mkdir -p "$out/seed$seed"
  train C1 "$seed" fashion-mnist $((10 * seed + 1))
  train C2 "$seed" fashion-mnist $((10 * seed + 2))
  train S1 "$seed" fashion-mnist+shortcut $((10 * seed + 3))
  train S2 "$seed" fashion-mnist+shortcut $((10 * seed + 4))
  for pair in C1:C2:same S1:S2:same C1:S1:cross S1:C1:cross; do
    IFS=: read -r front end bias <<< "$pair"
    stitch "$seed" "$front" "$end"
    csv="$out/seed$seed/${front}_${end}/results.csv"
    paste -d, <(column front_block "$csv") <(column protocol "$csv") <(column stitched_accuracy "$csv") \
      <(column end_accuracy "$csv") <(column relative_score "$csv") <(column end_agrees_on_iris "$csv") \
      <(column iri_median_distance "$csv") |
      awk -F, -v s="$seed" -v p="$front→$end" -v b="$bias" '{ print s "," p "," b "," $0 }' >> "$out/stitch_shortcut.csv.tmp"
  done
  for model in C1 C2 S1 S2; do
    echo "seed $seed $model: $("$adjoint" eval --checkpoint "$out/seed$seed/$model/checkpoint.safetensors" \
      --data fashion-mnist | sed -nE 's/.*accuracy ([0-9.]+)%.*/\1/p')% on the clean test set, $("$adjoint" eval \
      --checkpoint "$out/seed$seed/$model/checkpoint.safetensors" --data fashion-mnist+shortcut |
      sed -nE 's/.*accuracy ([0-9.]+)%.*/\1/p')% on the shortcut test set"
  done >> "$out/models.txt.tmp"
done
mv "$out/stitch_shortcut.csv.tmp" "$out/stitch_shortcut.csv"
mv "$out/models.txt.tmp" "$out/models.txt"

{
  echo "# Shortcut stitching over seeds ($(echo $seeds | wc -w) seeds; VGG-11-BN width 1/4, $epochs epoch(s))"
  echo
  echo "Relative score = stitched / end accuracy on the fashion-mnist+shortcut test set: mean over seeds"
  echo "[smallest, largest]. \"B on IRIs\": the end model's accuracy against y(x) on the front's IRIs."
  echo
  echo "| pair | bias | block | standard | control | invariance-aware | invariance / standard | B on IRIs | IRI median dist. |"
  echo "|---|---|---|---|---|---|---|---|---|"
  awk -F, '
    # "mean [smallest, largest]" of a cell over seeds, or a dash where it never ran.
    function spread(key) {
      return cnt[key] ? sprintf("%.3f [%.3f, %.3f]", sum[key] / cnt[key], lo[key], hi[key]) : "–"
    }
    NR > 1 {
      k = $2 "|" $3 "|" $4
      if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      v = $8; key = k "|" $5
      sum[key] += v; cnt[key]++
      if (!(key in lo) || v < lo[key]) lo[key] = v
      if (!(key in hi) || v > hi[key]) hi[key] = v
      if ($5 == "invariance") { agree[k] += $9; dist[k] += $10; inv[k, $1] = v }
      if ($5 == "standard") std[k, $1] = v
      seeds[$1] = 1
    }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]; split(k, f, "|"); v = k "|invariance"
        r = 0; m = 0
        for (sd in seeds) if ((k, sd) in std && (k, sd) in inv && std[k, sd] > 0) { r += inv[k, sd] / std[k, sd]; m++ }
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], spread(k "|standard"),
          spread(k "|control"), spread(v), m ? sprintf("%.2f", r / m) : "–",
          cnt[v] ? sprintf("%.1f%%", 100 * agree[k] / cnt[v]) : "–", cnt[v] ? sprintf("%.3f", dist[k] / cnt[v]) : "–"
      }
    }' "$out/stitch_shortcut.csv"
  echo
  echo "Models (test accuracy):"
  echo
  sed 's/^/- /' "$out/models.txt"
} > "$out/stitch_shortcut.md.tmp"
mv "$out/stitch_shortcut.md.tmp" "$out/stitch_shortcut.md"
cat "$out/stitch_shortcut.md"
