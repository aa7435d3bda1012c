"""PyTorch's side of `adjoint bench stitch`: the same two loops of model stitching on the same
architectures, weight shapes, batch, block and thread count, side by side with ours.

  adjoint --threads 2 bench stitch --out ours.json
  /usr/bin/python3 tools/bench_stitch_torch.py --threads 2 --ours ours.json

The settings come from that file (or the options without it). Both loops mirror the
analysis code step for step (analysis/stitching/iri.cpp, input_search.cpp,
stitching_train.cpp, stitching_objectives.cpp):

  iri    one find_iris call of `steps` steps on one batch: A's features of the targets
         without autograd, then steps + 1 evaluations of the per-example relative distance
         ||A(x') - A(x)|| / ||A(x)|| with the input alone requiring grad (the best iterate
         kept), and `steps` normalised L2 steps along the gradient, clamped to [0, 1].
  train  one epoch of `steps` stitch-training batches with the slm objective: a shuffled
         batch, A to block i and B's whole path under no_grad, the 1x1-conv stitch and B's
         remaining blocks recorded, the gradient of the stitch's weight and bias alone, AdamW.

Models are in eval mode and frozen (requires_grad off). Times are per step: the median and
range of the repeats after one warm-up run. The ratio is torch ms / ours ms, as in
tools/bench_torch.py and tools/bench_models_torch.py: above 1 adjoint is faster.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402

torch_peer.use_best_blas()  # before torch loads OpenBLAS: the engine's kernel choice

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_models  # noqa: E402

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST's, as the benchmark's endpoints normalise
ARCHITECTURES = {
    "vgg11_bn": lambda width: torch_models.small_vgg("vgg11_bn", 10, 1, width),
    "resnet18": lambda width: torch_models.small_stem_resnet("resnet18", 10, 1, width),
}


def frozen_blocks(arch, width, seed):
    """The blocks of a fresh model in eval mode whose parameters require no gradient."""
    torch.manual_seed(seed)
    model = ARCHITECTURES[arch](width).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return torch_models.blocks(model)


def normalised(raw):
    return (raw - MEAN) * (1.0 / STD)


def relative_distance(f, target):
    """||f - target|| / ||target|| per example (stitching_iri.cpp), clamped as there."""
    d = f - target
    distance = (d * d).flatten(1).sum(1).clamp(1e-30, 3.0e38).sqrt()
    scale = (target * target).flatten(1).sum(1).clamp(1e-30, 3.0e38).sqrt()
    return distance / scale


def find_iris(blocks, block, images, steps, step_size, generator):
    """find_iris on one batch with the derangement start and normalised L2 steps."""
    n = images.shape[0]
    cycle = torch.randperm(n, generator=generator)
    start = torch.empty(n, dtype=torch.long)
    start[cycle] = cycle.roll(-1)  # each image starts from its successor in a random cycle
    front = lambda raw: torch_models.run_blocks(blocks, normalised(raw), 0, block + 1)  # noqa: E731
    with torch.no_grad():
        target = front(images)
    x = images[start].clamp(0, 1)
    best, best_loss = x.clone(), torch.full((n,), float("inf"))
    for step in range(steps + 1):
        leaf = x.detach().requires_grad_()
        loss = relative_distance(front(leaf), target)
        with torch.no_grad():
            better = loss < best_loss
            best_loss = torch.where(better, loss, best_loss)
            best[better] = x[better]
        if step == steps:
            break
        (g,) = torch.autograd.grad(loss.sum(), [leaf])
        with torch.no_grad():
            norm = g.flatten(1).double().norm(dim=1)
            scale = torch.where(norm > 0, -step_size / norm, torch.zeros_like(norm)).float()
            x = (x + scale.view(-1, 1, 1, 1) * g).clamp_(0, 1)
    return best, best_loss


def train_stitch(a_blocks, b_blocks, block, weight, bias, images, labels, batch):
    """One epoch of train_stitch with the slm objective (T = 1) and AdamW (lr 1e-3, no decay)."""
    optimizer = torch.optim.AdamW([weight, bias], lr=1e-3, weight_decay=0.0)
    order = torch.randperm(images.shape[0])
    for begin in range(0, images.shape[0], batch):
        indices = order[begin:begin + batch]
        batch_labels = labels[indices]  # noqa: F841  (hlm would read them; train_stitch gathers them)
        with torch.no_grad():
            front = torch_models.run_blocks(a_blocks, normalised(images[indices]), 0, block + 1)
            end = torch_models.run_blocks(b_blocks, normalised(images[indices]), 0, block + 1)
            targets = [end] + torch_models.trace_blocks(b_blocks, end, block + 1, len(b_blocks))
        s = F.conv2d(front, weight[:, :, None, None], bias)
        path = [s] + torch_models.trace_blocks(b_blocks, s, block + 1, len(b_blocks))
        loss = -(F.softmax(targets[-1], 1) * F.log_softmax(path[-1], 1)).sum(1).mean()
        weight.grad, bias.grad = torch.autograd.grad(loss, [weight, bias])
        optimizer.step()
        loss.item()


def bench(arch, s):
    width, size, batch, block, steps = s["width"], s["image_size"], s["batch"], s["block"], s["steps"]
    a_blocks, b_blocks = frozen_blocks(arch, width, 1), frozen_blocks(arch, width, 2)
    g = torch.Generator().manual_seed(3)
    images = torch.rand(batch, 1, size, size, generator=g)
    step_size = 0.5 * (size * size / 3072) ** 0.5  # default_iri_step
    clock = torch_peer.CLOCKS[s["clock"]]
    iri = torch_peer.time_runs(s["repeats"], lambda: find_iris(a_blocks, block, images, steps, step_size, g), clock)

    train_images = torch.rand(batch * steps, 1, size, size, generator=g)
    labels = torch.randint(0, 10, (batch * steps,), generator=g)
    with torch.no_grad():
        c_in = torch_models.run_blocks(a_blocks, normalised(images[:1]), 0, block + 1).shape[1]
        c_out = torch_models.run_blocks(b_blocks, normalised(images[:1]), 0, block + 1).shape[1]
    weight = ((torch.rand(c_out, c_in, generator=g) * 2 - 1) / c_in ** 0.5).requires_grad_()
    bias = torch.zeros(c_out, requires_grad=True)
    train = torch_peer.time_runs(
        s["repeats"], lambda: train_stitch(a_blocks, b_blocks, block, weight, bias, train_images, labels, batch), clock)
    return {"iri": [t / steps for t in iri], "train": [t / steps for t in train]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", help="JSON written by `adjoint bench stitch --out`: its settings are used")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch's threads and OpenBLAS's (with --ours: "
                    "the same as the file's)")
    ap.add_argument("--batch", type=int, default=128, help="without --ours")
    ap.add_argument("--block", type=int, default=3, help="without --ours")
    ap.add_argument("--steps", type=int, default=10, help="without --ours")
    ap.add_argument("--repeats", type=int, default=5, help="without --ours")
    ap.add_argument("--clock", choices=sorted(torch_peer.CLOCKS), default="wall",
                    help="without --ours: wall, or cpu (process CPU time, steady on a busy machine; 1 thread only)")
    ap.add_argument("--only", default=",".join(ARCHITECTURES), help="without --ours: comma-separated models")
    ap.add_argument("--out", help="write both sides' figures as JSON")
    args = ap.parse_args()
    if args.ours:
        with open(args.ours) as f:
            ours = json.load(f)
        settings = {k: ours[k] for k in ("threads", "clock", "width", "image_size", "batch", "block", "steps", "repeats")}
        rows = {(r["model"], r["loop"]): r for r in ours["results"]}
        models = list(dict.fromkeys(r["model"] for r in ours["results"]))
    else:
        ours, rows, models = None, {}, args.only.split(",")
        settings = dict(threads=args.threads, width=0.25, image_size=28, batch=args.batch, block=args.block,
                        steps=args.steps, repeats=args.repeats, clock=args.clock)
        for m in models:
            if m not in ARCHITECTURES:
                ap.error(f"--only expects models among {', '.join(ARCHITECTURES)}; got '{m}'")
    if settings["threads"] != args.threads:
        # torch_peer gave OpenBLAS the command line's --threads when torch loaded.
        ap.error(f"--threads {args.threads} differs from the {settings['threads']} threads of {args.ours}; "
                 f"run with --threads {settings['threads']}")
    if settings["clock"] == "cpu" and settings["threads"] != 1:
        ap.error("--clock cpu measures durations only at 1 thread")
    torch.set_num_threads(settings["threads"])
    peer = torch_peer.describe(torch)
    print(f"PyTorch {torch.__version__}: {settings['threads']} threads, width {settings['width']} on "
          f"1x{settings['image_size']}x{settings['image_size']}, batch {settings['batch']}, block {settings['block']}, "
          f"{settings['steps']} steps per run, median and range of {settings['repeats']} runs ({settings['clock']} clock), "
          f"ms per step; "
          f"PyTorch: OpenBLAS {peer['blas']}, ATen {peer['cpu_capability']}, oneDNN {peer['onednn']}, "
          f"OpenMP wait {peer['omp_wait_policy']}, OpenBLAS threads {peer['blas_threads']}"
          + (f"; adjoint: OpenBLAS {ours['blas']}, convolutions {ours.get('conv_gemm', ours['blas'])}" if ours else ""))
    if ours and not torch_peer.fair(peer, ours.get("blas")):
        rows = {}  # the times are still printed, the ratios are not
    print(f"{'model':<10} {'loop':<6} {'torch ms':>9} {'torch range':>17} {'ours ms':>9} {'ours range':>17} "
          f"{'torch/ours':>10}")
    records = []
    for arch in models:
        timed = bench(arch, settings)
        for loop in ("iri", "train"):
            median, fastest, slowest = (1e3 * t for t in timed[loop])
            line = f"{arch:<10} {loop:<6} {median:9.2f} {fastest:8.2f} - {slowest:6.2f}"
            record = dict(model=arch, loop=loop, torch_ms=median, torch_fastest=fastest, torch_slowest=slowest)
            mine = rows.get((arch, loop))
            if mine:
                line += (f" {mine['ms_per_step']:9.2f} {mine['ms_fastest']:8.2f} - {mine['ms_slowest']:6.2f}"
                         f" {median / mine['ms_per_step']:10.2f}")
                record.update(ours_ms=mine["ms_per_step"], ours_fastest=mine["ms_fastest"],
                              ours_slowest=mine["ms_slowest"], torch_over_ours=median / mine["ms_per_step"])
            print(line, flush=True)
            records.append(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(settings, torch=torch.__version__, peer=peer, ours_blas=ours["blas"] if ours else None,
                           results=records), f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
