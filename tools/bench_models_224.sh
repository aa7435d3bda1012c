#!/bin/sh
# The 224-pixel table beside PyTorch: for each thread count and model, ours then the peer
# back to back, on wall time, with the load at the start of each pair. Run it with nothing
# else busy: on a 2-core machine one busy process takes a whole core from either side.
# The figures are in docs/benchmarks.md; the README's table is their summary.
# Then, at 1 thread, the peak memory of every cell on both sides, each in a fresh process
# (`bench models --memory`, bench_models_torch.py --memory: RSS growth over the model and its
# inputs; each cell is also timed once on the way): OUTDIR/memory.csv and its Markdown table
# OUTDIR/memory.md. MEMORY_WORKLOADS chooses those cells (empty: none); SAMPLES the count of
# SmoothGrad's samples and IG's steps there.
#
#   tools/bench_models_224.sh OUTDIR [THREADS...]      (default threads: 1 2)
set -eu
out=$1; shift
threads=${*:-1 2}
adjoint=${ADJOINT:-build/tools/adjoint}
workloads=train,infer,gradient,soft_pullback
mkdir -p "$out"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u)" | tee "$out/log.txt"
for t in $threads; do
  for m in resnet50 vgg16_bn vit_b_16 pvt_v2_b1; do
    echo "== $m, $t threads, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    "$adjoint" --threads "$t" bench models --imagenet --only "$m" --workloads $workloads --repeats 3 \
      --clock wall --out "$out/${m}_$t.json" >> "$out/log.txt" 2>&1
    /usr/bin/python3 tools/bench_models_torch.py --threads "$t" --clock wall --size 224 --only "$m" \
      --workloads $workloads --repeats 3 --ours "$out/${m}_$t.json" | tee -a "$out/log.txt"
  done
done
memory_workloads=${MEMORY_WORKLOADS-train,infer,gradient,soft_pullback,pullback_ascent,smoothgrad,integrated_gradients}
samples=${SAMPLES:-50}
[ -n "$memory_workloads" ] || exit 0
for m in resnet50 vgg16_bn vit_b_16 pvt_v2_b1; do
  echo "== $m memory, 1 thread, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
  "$adjoint" --threads 1 bench models --imagenet --only "$m" --workloads "$memory_workloads" --samples "$samples" \
    --repeats 1 --memory --clock wall --out "$out/${m}_memory.json" >> "$out/log.txt" 2>&1
  /usr/bin/python3 tools/bench_models_torch.py --threads 1 --clock wall --size 224 --only "$m" \
    --workloads "$memory_workloads" --samples "$samples" --repeats 1 --memory --memory-csv "$out/${m}_memory.csv" \
    --ours "$out/${m}_memory.json" | tee -a "$out/log.txt"
done
{ echo "model,threads,workload,torch_peak_rss_mib,ours_peak_rss_mib,torch_over_ours"
  for m in resnet50 vgg16_bn vit_b_16 pvt_v2_b1; do tail -n +2 "$out/${m}_memory.csv"; done; } > "$out/memory.csv"
{ echo "| model | workload | PyTorch MiB | adjoint MiB | PyTorch / adjoint |"
  echo "|---|---|---|---|---|"
  tail -n +2 "$out/memory.csv" | awk -F, '{ printf "| %s | %s | %s | %s | %s |\n", $1, $3, $4, $5, $6 }'; } > "$out/memory.md"
cat "$out/memory.md"
