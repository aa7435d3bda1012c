"""PyTorch's side of `adjoint bench models`: the same models, batch and thread count,
training (SGD step: forward, cross-entropy, backward, update) and inference throughput.

  adjoint --threads 2 bench models --out ours.json
  /usr/bin/python3 tools/bench_models_torch.py --threads 2 --ours ours.json

prints both with the ratio ours/PyTorch (> 1: adjoint is faster). With --size S (as
`adjoint bench models --size S` or --imagenet), the models are torchvision's ResNet-50,
VGG-16-BN and ViT-B/16 and the goldens' plain-PyTorch PVT-v2-b1 (tests/goldens/gen_pvt.py)
at S pixels with 1000 classes, batch 8, each one with convolutions run in the faster of the
two memory formats (contiguous or channels-last, chosen by its inference), and the
explanation workloads per image are timed beside ours: gradient, soft pullback and pullback
ascent (K=5) through surrogate ops (soft_pullback_model), SmoothGrad and integrated gradients. With --ours, each side's
achieved GFLOP/s is also printed as a share of the sgemm rate that `adjoint bench models`
measured in its run (its FLOP counts, engine/flops.h: training counts 3x forward). With
--clock cpu (1 thread only, as adjoint's --clock cpu) steps are timed in process CPU time,
steady on a busy machine. With --memory, the peak memory of every chosen workload (training
step, inference, each explanation) is the process's max RSS growth over its model and inputs,
measured in a fresh child process per cell (peak_rss_cell), printed beside adjoint's own
(`adjoint bench models --memory`, the same measure) with PyTorch's over ours; --memory-csv
also writes those rows. The explanations run as they are timed: one pass of the batch per
point (SmoothGrad's noisy copies, IG's steps), parameters left as the model makes them. Where the JSON holds
the time adjoint's steps spent in OpenBLAS (the kernels both sides share), each ratio's bound
is printed beside it: PyTorch's step time over that time.
"""
import argparse
import copy
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402

torch_peer.use_best_blas()  # before torch loads OpenBLAS: the engine's kernel choice

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_models  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "goldens"))
import gen_pvt  # noqa: E402  (a plain-PyTorch PVT-v2, the goldens' model)


def models(classes=10):
    return {
        "resnet18": lambda: torch_models.small_stem_resnet("resnet18", classes, 3),
        "vgg11_bn": lambda: torch_models.small_vgg("vgg11_bn", classes, 3),
        "vgg16_bn": lambda: torch_models.small_vgg("vgg16_bn", classes, 3),
        "vit_tiny": lambda: torch_models.vit_tiny(32, 4, 3, classes),
        "bilinear_lm": lambda: torch_models.BilinearLm(256, 256, 2, 4, 64),
    }


def imagenet_models(size):
    import torchvision
    return {
        "resnet50": lambda: torchvision.models.resnet50(num_classes=1000),
        "vgg16_bn": lambda: torchvision.models.vgg16_bn(num_classes=1000),
        "vit_b_16": lambda: torchvision.models.vit_b_16(image_size=size, num_classes=1000),
        "pvt_v2_b1": lambda: gen_pvt.pvt_v2("pvt_v2_b1"),
    }


# The soft pullback's temperatures, as adjoint's defaults (engine/transport.h).
TAU = {"relu": 0.6, "gelu": 1.0, "max_pool": 0.3, "attention": 1.0}


def surrogate(value, gate, z):
    """value in the forward pass; u ↦ gate·u in the backward pass (gate detached)."""
    g = gate.detach()
    return value.detach() + g * z - (g * z).detach()


class SoftRelu(nn.Module):
    def forward(self, z):
        return surrogate(F.relu(z), 0.5 * (1 + torch.erf(z / TAU["relu"] / math.sqrt(2))), z)


class SoftGelu(nn.Module):
    def forward(self, z):
        return surrogate(F.gelu(z), 0.5 * (1 + torch.erf(z / TAU["gelu"] / math.sqrt(2))), z)


class SoftMaxPool(nn.Module):
    """Max-pooling whose backward spreads u over each window by softmax(window/τ)."""
    def __init__(self, pool):
        super().__init__()
        self.pool = pool

    def forward(self, z):
        k, s, p = self.pool.kernel_size, self.pool.stride, self.pool.padding
        B, C, H, W = z.shape
        y = self.pool(z)
        padded = F.pad(z, (p, p, p, p), value=-1e30) if p else z
        windows = F.unfold(padded.reshape(B * C, 1, H + 2 * p, W + 2 * p), k, stride=s)  # (B·C, k·k, positions)
        spread = (torch.softmax(windows / TAU["max_pool"], 1).detach() * windows).sum(1).reshape(y.shape)
        return y.detach() + spread - spread.detach()


class FrozenLayerNorm(nn.Module):
    """LayerNorm with its mean and deviation detached (the pullbacks' rule)."""
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        mu = x.mean(-1, keepdim=True).detach()
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.norm.eps).detach()
        return (x - mu) / sigma * self.norm.weight + self.norm.bias


class FrozenPatternAttention(nn.Module):
    """torchvision's self-attention with its pattern (at τ = 1) detached: through V only."""
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, query, key, value, need_weights=False):
        m, (B, N, C) = self.mha, query.shape
        heads = m.num_heads
        q, k, v = F.linear(query, m.in_proj_weight, m.in_proj_bias).reshape(B, N, 3, heads, C // heads).permute(
            2, 0, 3, 1, 4)
        pattern = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(C // heads) / TAU["attention"], -1).detach()
        return m.out_proj((pattern @ v).transpose(1, 2).reshape(B, N, C)), None


def soft_pullback_model(model):
    """A copy of `model` whose backward pass is the soft pullback: each ReLU, GELU, max-pool,
    LayerNorm and attention replaced by its surrogate (the forward values are the model's)."""
    if isinstance(model, gen_pvt.PvtV2):
        rule = gen_pvt.Rule("soft", tau_gelu=TAU["gelu"], tau_attention=TAU["attention"])
        return lambda x: model(x, rule)
    soft = copy.deepcopy(model)
    for parent in list(soft.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.ReLU):
                setattr(parent, name, SoftRelu())
            elif isinstance(child, nn.GELU):
                setattr(parent, name, SoftGelu())
            elif isinstance(child, nn.MaxPool2d):
                setattr(parent, name, SoftMaxPool(child))
            elif isinstance(child, nn.LayerNorm):
                setattr(parent, name, FrozenLayerNorm(child))
            elif isinstance(child, nn.MultiheadAttention):
                setattr(parent, name, FrozenPatternAttention(child))
    return soft


def batch_for(name, batch, size=0):
    g = torch.Generator().manual_seed(0)
    if size:
        return torch.rand(batch, 3, size, size, generator=g), torch.randint(0, 1000, (batch,), generator=g)
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


def weighted_gradients(model, x, targets, points):
    """Σ_k w_k ∂f_target/∂x at points(k) = (point, w_k): one pass of the batch per point, as
    adjoint runs its passes at ImageNet's size."""
    total = torch.zeros_like(x)
    for point, w in points:
        leaf = point.detach().requires_grad_()
        logits = model(leaf)
        (g,) = torch.autograd.grad(logits.gather(1, targets[:, None]).sum(), leaf)
        total += w * g
    return total


def explanation_workloads(samples):
    """The explanations, as functions of (model, x, targets); the soft pullback's through a
    copy of the model with surrogate ops (soft_pullback_model), made once beforehand."""
    def gradient(model, x, targets):
        return weighted_gradients(model, x, targets, [(x, 1.0)])

    def soft_pullback(soft, x, targets):
        return weighted_gradients(soft, x, targets, [(x, 1.0)])

    def pullback_ascent(soft, x, targets, steps=5):
        alpha = 20 * math.sqrt(x[0].numel() / 150528)  # adjoint's step for inputs in [-1, 1]
        xt = x
        for _ in range(steps):
            nu = weighted_gradients(soft, xt, targets, [(xt, 1.0)])
            xt = xt + alpha * nu / nu.flatten(1).norm(dim=1).clamp_min(1e-30).reshape(-1, 1, 1, 1)
        return xt - x

    def smoothgrad(model, x, targets):
        g = torch.Generator().manual_seed(0)
        return weighted_gradients(model, x, targets,
                                  ((x + 0.15 * torch.randn(x.shape, generator=g), 1.0 / samples) for _ in range(samples)))

    def integrated_gradients(model, x, targets):
        alphas = [k / (samples - 1) for k in range(samples)]
        return x * weighted_gradients(model, x, targets, ((a * x, 1.0 / samples) for a in alphas))
    return {"gradient": gradient, "soft_pullback": soft_pullback, "pullback_ascent(K=5)": pullback_ascent,
            f"smoothgrad({samples})": smoothgrad, f"integrated_gradients({samples})": integrated_gradients}


EXPLANATIONS = ("gradient", "soft_pullback", "pullback_ascent", "smoothgrad", "integrated_gradients")


def bench(name, batch, repeats, clock, size=0, workloads=("train", "infer"), samples=50):
    model = (imagenet_models(size) if size else models())[name]()
    x, y = batch_for(name, batch, size)
    n = x.shape[0]
    result = {"model": name, "batch": n, "train_samples_per_s": 0, "infer_samples_per_s": 0, "explanations": {}}

    def infer():
        with torch.no_grad():
            model(x)

    model.eval()
    if size and name != "vit_b_16":  # the faster memory format for this model with convolutions
        t_plain = time_steps(infer, 1, clock, warmup=1)
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
        if time_steps(infer, 1, clock, warmup=1) > t_plain:
            model, x = model.to(memory_format=torch.contiguous_format), x.contiguous()
        else:
            result["channels_last"] = True
    if "train" in workloads:
        model.train()
        result["train_samples_per_s"] = n / time_steps(training_step(model, x, y), repeats, clock)
        model.eval()
    if "infer" in workloads:
        result["infer_samples_per_s"] = n / time_steps(infer, repeats, clock)
    explained = [w for w in workloads if w in EXPLANATIONS]
    if explained:
        with torch.no_grad():
            targets = model(x).argmax(1)
        soft = soft_pullback_model(model) if {"soft_pullback", "pullback_ascent"} & set(explained) else None
        for label, fn in explanation_workloads(samples).items():
            if label.split("(")[0] not in explained:
                continue
            many = label.startswith(("smoothgrad", "integrated_gradients"))
            net = soft if label.startswith(("soft_pullback", "pullback_ascent")) else model
            seconds = time_steps(lambda: fn(net, x, targets), 1 if many else repeats, clock, warmup=0 if many else 2)
            result["explanations"][label] = seconds * 1e3 / n
    return result


def vm_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def peak_rss_cell(name, batch, size, workload, samples, channels_last):
    """Peak RSS growth (MiB) of one workload of model `name` over its model and inputs: the
    training step after a warm-up step (which makes the optimizer's state), anything else at
    its first run (as a fresh process would run it), in the memory format it was timed in.
    The kernel's high-water mark is reset through /proc/self/clear_refs, then read as VmHWM.
    Runs in a child started with MALLOC_MMAP_THRESHOLD_=131072, as `adjoint bench models`
    measures: every large buffer is then mapped when allocated and unmapped when freed, so
    the resident set follows live memory (glibc's adaptive threshold would keep freed
    buffers resident and hide part of the peak). The explanations' targets are the batch's
    fixed labels, as adjoint's, so that no forward pass runs before."""
    model = (imagenet_models(size) if size else models())[name]()
    x, y = batch_for(name, batch, size)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    if workload == "train":
        run = training_step(model, x, y)
        run()
    elif workload == "infer":
        model.eval()

        def run():
            with torch.no_grad():
                model(x)
    else:
        model.eval()
        net = soft_pullback_model(model) if workload in ("soft_pullback", "pullback_ascent") else model
        fn = next(f for label, f in explanation_workloads(samples).items() if label.split("(")[0] == workload)

        def run():
            fn(net, x, y)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = vm_kib("VmRSS")
    run()
    return (vm_kib("VmHWM") - before) / 1024


def ours_peak_rss(row, workload, label):
    """adjoint's figure for the same cell from its JSON row (bench models --memory), or None."""
    if workload == "train":
        return row.get("peak_rss_step_mib")
    if workload == "infer":
        return row.get("peak_rss_infer_mib")
    return next((e.get("peak_rss_mib") for e in row.get("explanations", []) if e["workload"] == label), None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=None, help="64; 8 with --size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--ours", help="JSON written by `adjoint bench models --out`")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or process CPU time (--threads 1 only)")
    ap.add_argument("--memory", action="store_true",
                    help="also print each chosen workload's peak RSS growth, a fresh process per cell")
    ap.add_argument("--memory-csv", help="with --memory: also write its rows to this CSV file")
    ap.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--memory-child", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=0, help="torchvision's ImageNet models at this size (batch 8)")
    ap.add_argument("--workloads", default="", help="comma-separated, as adjoint bench models --workloads")
    ap.add_argument("--samples", type=int, default=50, help="SmoothGrad samples and IG steps")
    args = ap.parse_args()
    if args.batch is None:
        args.batch = 8 if args.size else 64
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu measures durations only with --threads 1")
    clock = torch_peer.CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.memory_child:
        print(f"{peak_rss_cell(args.memory_child, args.batch, args.size, args.workloads or 'train', args.samples, args.channels_last):.1f}")
        return
    if args.ours and not args.size:
        with open(args.ours) as f:
            if json.load(f).get("image_size", 32) != 32:
                ap.error(f"{args.ours} holds the ImageNet models: pass --size as adjoint was run")
    workloads = args.workloads.split(",") if args.workloads else (
        ["train", "infer", *EXPLANATIONS] if args.size else ["train", "infer"])
    names = args.only.split(",") if args.only else list(imagenet_models(args.size) if args.size else models())
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
    formats = {}
    for name in names:
        r = bench(name, args.batch, args.repeats, clock, args.size, workloads, args.samples)
        formats[name] = r.get("channels_last", False)
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
        ours_explained = {e["workload"]: e for e in o.get("explanations", [])}
        for label, ms in r["explanations"].items():
            mine = ours_explained.get(label, {}).get("ms_per_image")
            print(f"  {label:<26} ms/image torch {ms:10.1f} ours " + (f"{mine:10.1f} ratio {ms / mine:6.2f}" if mine else "-"),
                  flush=True)
    if args.memory:
        memory_table(args, names, workloads, formats, ours)


def memory_table(args, names, workloads, formats, ours):
    """Each cell's peak RSS growth, PyTorch's in a fresh child per cell, beside adjoint's."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    labels = {w: w for w in ("train", "infer")}
    labels.update({label.split("(")[0]: label for label in explanation_workloads(args.samples)})
    print(f"peak RSS growth over the model and inputs, MiB, a fresh process per cell "
          f"(PyTorch / ours above 1: ours holds less)")
    print(f"{'model':<12} {'workload':<28} {'torch':>10} {'ours':>10} {'torch/ours':>11}")
    rows = []
    for name in names:
        for workload in [w for w in ("train", "infer", *EXPLANATIONS) if w in workloads]:
            command = [sys.executable, os.path.abspath(__file__), "--memory-child", name, "--workloads", workload,
                       "--threads", str(args.threads), "--batch", str(args.batch), "--size", str(args.size),
                       "--samples", str(args.samples)] + (["--channels-last"] if formats.get(name) else [])
            child = subprocess.run(command, capture_output=True, text=True, env=env)
            if child.returncode != 0:
                sys.exit(f"bench_models_torch.py: the memory measurement of {name} {workload} failed: "
                         f"{child.stderr.strip().splitlines()[-1:] or child.returncode}")
            peer = float(child.stdout.strip())
            mine = ours_peak_rss(ours.get(name, {}), workload, labels[workload])
            ratio = peer / mine if mine else None
            print(f"{name:<12} {labels[workload]:<28} {peer:10.1f} " + (f"{mine:10.1f} {ratio:11.2f}" if mine else f"{'-':>10} {'-':>11}"),
                  flush=True)
            rows.append((name, args.threads, labels[workload], peer, mine, ratio))
    if args.memory_csv:
        with open(args.memory_csv, "w") as f:
            f.write("model,threads,workload,torch_peak_rss_mib,ours_peak_rss_mib,torch_over_ours\n")
            for name, threads, label, peer, mine, ratio in rows:
                f.write(f"{name},{threads},{label},{peer:.1f}," + (f"{mine:.1f},{ratio:.3f}" if mine else ",") + "\n")

if __name__ == "__main__":
    main()
