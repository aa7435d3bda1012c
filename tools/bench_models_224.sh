#!/bin/sh
# The 224-pixel table beside PyTorch: for each thread count and model, ours then the peer
# back to back, on wall time, with the load at the start of each pair. Run it with nothing
# else busy: on a 2-core machine one busy process takes a whole core from either side.
# The figures are in docs/benchmarks.md; the README's table is their summary.
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
  memory=""; [ "$t" = 1 ] && memory=--memory   # peak memory once: it does not depend on threads
  for m in resnet50 vgg16_bn vit_b_16 pvt_v2_b1; do
    echo "== $m, $t threads, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/log.txt"
    "$adjoint" --threads "$t" bench models --imagenet --only "$m" --workloads $workloads --repeats 3 \
      --clock wall --out "$out/${m}_$t.json" >> "$out/log.txt" 2>&1
    /usr/bin/python3 tools/bench_models_torch.py --threads "$t" --clock wall --size 224 --only "$m" \
      --workloads $workloads --repeats 3 $memory --ours "$out/${m}_$t.json" | tee -a "$out/log.txt"
  done
done
