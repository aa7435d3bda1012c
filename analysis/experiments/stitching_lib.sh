# What the stitching experiments (stitch_*.sh) share: training their models, stitching a
# pair, gathering the cells of every seed into one CSV and summarising it over seeds.
# Sourced, not run; the caller sets $adjoint, $threads and $epochs (and may set $family).

# family_options FAMILY: the model options of a family of the stitching experiments;
# family_name FAMILY: its name in titles.
#   vgg     VGG-11-BN at width 1/4 (the default)
#   resnet  ResNet-18 at width 1/4
#   vit     a ViT of width 64, depth 4, 4 heads, patches of 4 (7×7 tokens and a class token)
family_options() {
  case $1 in
    vgg) echo "--model vgg11_bn --width 0.25" ;;
    resnet) echo "--model resnet18 --width 0.25" ;;
    vit) echo "--model vit_custom --dim 64 --depth 4 --heads 4 --patch 4" ;;
    *) echo "unknown model family '$1' (vgg, resnet, vit)" >&2; exit 2 ;;
  esac
}
family_name() {
  case $1 in
    vgg) echo "VGG-11-BN width 1/4" ;;
    resnet) echo "ResNet-18 width 1/4" ;;
    vit) echo "ViT width 64, depth 4" ;;
  esac
}

# train_model RUN SEED DATA [OPTION...]: a model of the family $family (default vgg), $epochs
# epochs of AdamW (lr $lr, default 2e-3, batch 128, no augmentation), into the folder RUN,
# unless it is there already.
train_model() {
  local run=$1 seed=$2 data=$3
  shift 3
  [ -f "$run/checkpoint.safetensors" ] && return
  # shellcheck disable=SC2046
  "$adjoint" train --overwrite $(family_options "${family:-vgg}") --data "$data" --epochs "$epochs" --batch 128 \
    --optimizer adamw --lr "${lr:-2e-3}" --no-augment --seed "$seed" --threads "$threads" "$@" --out "$run" > "$run.log" 2>&1
}

# stitch_pair DIR FRONT END SEED OPTION...: stitches DIR/FRONT into DIR/END, writing
# DIR/FRONT_END. An IRI set depends on the front model alone, so a second end reuses the
# sets a first one made (the sweep reads back whatever iris/ holds).
stitch_pair() {
  local dir=$1 front=$2 end=$3 seed=$4 cell=$1/$2_$3
  shift 4
  if [ ! -d "$cell/iris" ]; then
    for made in "$dir/$front"_*/iris; do
      [ -d "$made" ] && { mkdir -p "$cell"; cp -r "$made" "$cell/"; break; }
    done
  fi
  "$adjoint" stitch --front "$dir/$front/checkpoint.safetensors" --end "$dir/$end/checkpoint.safetensors" \
    --seed "$seed" --threads "$threads" "$@" --out "$cell" > "$cell.log" 2>&1
}


# The columns collect writes after seed, pair and group.
cell_columns=(front_block objective protocol stitched_accuracy end_accuracy relative_score end_agrees_on_iris
              iri_median_distance raua)

# collect_header: the header of the gathered CSV.
collect_header() { (IFS=,; echo "seed,pair,group,${cell_columns[*]}"); }

# collect SEED PAIR GROUP RESULTS_CSV: one line per cell of a sweep's results.csv, its
# columns picked by name (empty where the sweep did not write one).
collect() {
  (IFS=,; awk -F, -v prefix="$1,$2,$3," -v names="${cell_columns[*]}" '
    NR == 1 { n = split(names, want, ","); for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
      line = prefix
      for (i = 1; i <= n; i++) line = line (want[i] in col ? $col[want[i]] : "") (i < n ? "," : "")
      print line
    }' "$4")
}

# summarise CSV VALUE: Markdown rows, one per pair × objective × block, of the column VALUE under each
# protocol as "mean [smallest, largest]" over seeds (a dash where it never ran), the mean
# ratio invariance / standard, and the end model's agreement with y(x) on the IRIs and the
# IRI median distance (means over seeds).
summarise() {
  awk -F, -v value="$2" '
    function spread(key) {
      return cnt[key] ? sprintf("%.3f [%.3f, %.3f]", sum[key] / cnt[key], lo[key], hi[key]) : "–"
    }
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
      v = $col[value]
      if (v == "" || v == "nan") next
      k = $col["pair"] "|" $col["group"] "|" $col["objective"] "|" $col["front_block"]; p = $col["protocol"]; s = $col["seed"]
      if (!(k in seen)) { seen[k] = 1; order[++n] = k }
      key = k "|" p
      sum[key] += v; cnt[key]++
      if (!(key in lo) || v < lo[key]) lo[key] = v
      if (!(key in hi) || v > hi[key]) hi[key] = v
      at[key, s] = v; seeds[s] = 1
      if (p == "invariance") { agree[k] += $col["end_agrees_on_iris"]; dist[k] += $col["iri_median_distance"] }
    }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]; split(k, f, "|"); st = k "|standard"; inv = k "|invariance"
        r = 0; m = 0
        for (s in seeds) if ((st, s) in at && (inv, s) in at && at[st, s] > 0) { r += at[inv, s] / at[st, s]; m++ }
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f[1], f[2], f[3], f[4], spread(st), spread(k "|control"),
          spread(inv), m ? sprintf("%.2f", r / m) : "–", cnt[inv] ? sprintf("%.1f%%", 100 * agree[k] / cnt[inv]) : "–",
          cnt[inv] ? sprintf("%.3f", dist[k] / cnt[inv]) : "–"
      }
    }' "$1"
}

# summary_header GROUP: the head of summarise's table.
summary_header() {
  echo "| pair | $1 | objective | block | standard | control | invariance-aware | invariance / standard | B on IRIs | IRI median dist. |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
}

# accuracy CHECKPOINT DATA: the checkpoint's test accuracy in percent on DATA.
accuracy() {
  "$adjoint" eval --checkpoint "$1" --data "$2" --threads "$threads" | sed -nE 's/.*accuracy ([0-9.]+)%.*/\1/p'
}
