"""PyTorch's side of `adjoint bench models`: the same models, batch and thread count,
training (SGD step: forward, cross-entropy, backward, update) and inference throughput.

  adjoint --threads 2 bench models --out ours.json
  /usr/bin/python3 tools/bench_models_torch.py --threads 2 --ours ours.json

prints both with the ratio ours/PyTorch (> 1: adjoint is faster). With --ours, each side's
achieved GFLOP/s is also printed as a share of the sgemm rate that `adjoint bench models`
measured in its run (its FLOP counts, engine/flops.h: training counts 3x forward). With
--clock cpu (1 thread only, as adjoint's --clock cpu) steps are timed in process CPU time,
steady on a busy machine. With --memory, the peak memory of each model's training step is
the process's max RSS growth, measured in a child process per model. Where the JSON holds
the time adjoint's steps spent in OpenBLAS (the kernels both sides share), each ratio's bound
is printed beside it: PyTorch's step time over that time.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402

torch_peer.use_best_blas()  # before torch loads OpenBLAS: the engine's kernel choice

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_models  # noqa: E402


def models(classes=10):
    return {
        "resnet18": lambda: torch_models.small_stem_resnet("resnet18", classes, 3),
        "vgg11_bn": lambda: torch_models.small_vgg("vgg11_bn", classes, 3),
        "vgg16_bn": lambda: torch_models.small_vgg("vgg16_bn", classes, 3),
        "vit_tiny": lambda: torch_models.vit_tiny(32, 4, 3, classes),
        "bilinear_lm": lambda: torch_models.BilinearLm(256, 256, 2, 4, 64),
    }


def batch_for(name, batch):
    g = torch.Generator().manual_seed(0)
    if name == "bilinear_lm":
        x = torch.randint(0, 256, (32, 64), generator=g)
        return x, torch.randint(0, 256, (32 * 64,), generator=g)
    return torch.rand(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)


def time_steps(fn, repeats, clock, warmup=2):
    return torch_peer.time_runs(repeats, fn, clock, warmup=warmup)[0]


def training_step(model, x, y):
    """One SGD step (forward, cross-entropy, backward, update) of `model` on (x, y)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y).backward()
        opt.step()
    return step


def bench(name, batch, repeats, clock):
    model = models()[name]()
    x, y = batch_for(name, batch)
    n = x.shape[0]
    train_step = training_step(model, x, y)

    def infer():
        with torch.no_grad():
            model(x)

    model.train()
    t_train = time_steps(train_step, repeats, clock)
    model.eval()
    t_infer = time_steps(infer, repeats, clock)
    return {"model": name, "batch": n, "train_samples_per_s": n / t_train, "infer_samples_per_s": n / t_infer}


def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_rss_step(name, batch):
    """Peak RSS growth (MiB) over one training step of model `name` after a warm-up step:
    the kernel's high-water mark is reset through /proc/self/clear_refs, then read as VmHWM.
    Runs in a child started with MALLOC_MMAP_THRESHOLD_=131072, as `adjoint bench models`
    measures: every large buffer is then mapped when allocated and unmapped when freed, so
    the resident set follows live memory (glibc's adaptive threshold would keep freed
    buffers resident and hide part of the step's peak)."""
    model = models()[name]()
    x, y = batch_for(name, batch)
    step = training_step(model, x, y)
    step()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = vm_kib("VmRSS")
    step()
    return (vm_kib("VmHWM") - before) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--ours", help="JSON written by `adjoint bench models --out`")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or process CPU time (--threads 1 only)")
    ap.add_argument("--memory", action="store_true", help="also print each model's step peak RSS growth")
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu measures durations only with --threads 1")
    clock = torch_peer.CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.memory_child:
        print(f"{peak_rss_step(args.memory_child, args.batch):.1f}")
        return
    names = args.only.split(",") if args.only else list(models())
    ours, ours_blas, ours_conv, sgemm = {}, None, None, None
    if args.ours:
        with open(args.ours) as f:
            doc = json.load(f)
        ours, ours_blas, sgemm = {r["model"]: r for r in doc["models"]}, doc.get("blas"), doc.get("sgemm_gflops")
        ours_conv = doc.get("conv_gemm", ours_blas)
        if doc.get("threads") != args.threads or doc.get("clock", "wall") != args.clock:
            ap.error(f"{args.ours} was measured at {doc.get('threads')} threads, {doc.get('clock', 'wall')} clock; "
                     f"this run is {args.threads} threads, {args.clock} clock")
    peer = torch_peer.describe(torch)
    print(f"PyTorch {torch.__version__}, {args.threads} threads, batch {args.batch} (bilinear_lm: 32x64 tokens); "
          f"PyTorch: OpenBLAS {peer['blas']}, ATen {peer['cpu_capability']}, oneDNN {peer['onednn']}, "
          f"OpenMP wait {peer['omp_wait_policy']}, OpenBLAS threads {peer['blas_threads']}"
          + (f"; adjoint: OpenBLAS {ours_blas}, convolutions {ours_conv}" if ours_blas else ""))
    if ours and not torch_peer.fair(peer, ours_blas):
        ours = {}
    if sgemm:
        print(f"share = achieved GFLOP/s / the sgemm rate of adjoint's run ({sgemm:.1f} GFLOP/s), torch and ours")
    bounded = any("train_blas_cpu_seconds" in o for o in ours.values())
    if bounded:
        print("bound = PyTorch's step time / the time adjoint's step spends in OpenBLAS (CPU time over threads): "
              "the highest ratio adjoint could reach if everything outside the kernels both sides share cost nothing")
    print(f"{'model':<12} {'train/s torch':>14} {'ours':>10} {'ratio':>7} {'infer/s torch':>14} {'ours':>10} {'ratio':>7}"
          + (f" {'train share':>15} {'infer share':>15}" if sgemm else "")
          + (f" {'bound t/i':>13}" if bounded else ""))
    for name in names:
        r = bench(name, args.batch, args.repeats, clock)
        o = ours.get(name, {})
        ot, oi = o.get("train_samples_per_s"), o.get("infer_samples_per_s")
        fmt = lambda v: f"{v:10.1f}" if v else f"{'-':>10}"
        rat = lambda a, b: f"{a / b:7.2f}" if a else f"{'-':>7}"
        line = (f"{name:<12} {r['train_samples_per_s']:14.1f} {fmt(ot)} {rat(ot, r['train_samples_per_s'])} "
                f"{r['infer_samples_per_s']:14.1f} {fmt(oi)} {rat(oi, r['infer_samples_per_s'])}")
        if sgemm and "forward_gflop_per_sample" in o:
            def shares(torch_per_s, passes, ours_share):
                return f"{torch_per_s * passes * o['forward_gflop_per_sample'] / sgemm:7.0%} {ours_share:7.0%}"
            line += (f" {shares(r['train_samples_per_s'], doc.get('training_passes', 3), o['train_sgemm_share'])}"
                     f" {shares(r['infer_samples_per_s'], 1, o['infer_sgemm_share'])}")
        if bounded and o.get("train_blas_cpu_seconds") and o.get("infer_blas_cpu_seconds"):
            def bound(torch_per_s, blas_seconds):  # above 10: the step is not bound by OpenBLAS ("-")
                b = (r["batch"] / torch_per_s) / (blas_seconds / args.threads)
                return f"{b:6.2f}" if b < 10 else f"{'-':>6}"
            line += (f" {bound(r['train_samples_per_s'], o['train_blas_cpu_seconds'])}"
                     f" {bound(r['infer_samples_per_s'], o['infer_blas_cpu_seconds'])}")
        print(line, flush=True)
    if args.memory:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
        print(f"{'model':<12} {'step peak RSS growth, MiB: torch':>33} {'ours':>8}")
        for name in names:
            child = subprocess.run([sys.executable, __file__, "--memory-child", name, "--threads", str(args.threads),
                                    "--batch", str(args.batch)], capture_output=True, text=True, check=True, env=env)
            mine = ours.get(name, {}).get("peak_rss_step_mib")
            print(f"{name:<12} {float(child.stdout.strip()):33.1f} " + (f"{mine:8.1f}" if mine else f"{'-':>8}"),
                  flush=True)


if __name__ == "__main__":
    main()
