"""PyTorch's times for the layers of `adjoint bench`, side by side with ours.

    ./build/tools/adjoint bench --threads 2 --out ours.json
    /usr/bin/python3 tools/bench_torch.py --ours ours.json

With --ours, the thread count, batch, repeats and shapes come from that file and the table
shows both times and torch/ours (>= 1.00: adjoint is at least as fast). Without it, the
default shapes of `adjoint bench` are timed in PyTorch alone. Each figure is the median of
the repeats after one warm-up; forward runs under no_grad, forward+backward asks
torch.autograd.grad for every operand (no .grad accumulation), as adjoint bench does.
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


CLOCKS = torch_peer.CLOCKS
clock = CLOCKS["wall"]


def median_seconds(repeats, fn):
    return torch_peer.time_runs(repeats, fn, clock)[0]


def time_op(f, inputs, repeats):
    """(forward seconds, forward+backward seconds) of f over inputs."""
    def forward():
        with torch.no_grad():
            f(*inputs)

    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    u = torch.ones_like(f(*inputs))

    def both():
        y = f(*leaves)
        torch.autograd.grad(y, leaves, u)

    return median_seconds(repeats, forward), median_seconds(repeats, both)


def matmul_times(M, K, N, repeats):
    g = torch.Generator().manual_seed(7)
    a = torch.rand(M, K, generator=g) * 2 - 1
    b = torch.rand(K, N, generator=g) * 2 - 1
    return time_op(torch.matmul, [a, b], repeats)


def conv_times(batch, C, O, S, k, pad, repeats, stride=1):
    g = torch.Generator().manual_seed(11)
    x = torch.rand(batch, C, S, S, generator=g) * 2 - 1
    w = (torch.rand(O, C, k, k, generator=g) * 2 - 1) * 0.1
    b = (torch.rand(O, generator=g) * 2 - 1) * 0.1
    return time_op(lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=pad), [x, w, b], repeats)


def default_shapes(batch):
    shapes = [dict(op="matmul", M=m, K=k, N=n) for m, k, n in
              [(512, 512, 512), (1024, 1024, 1024), (16384, 256, 256), (2048, 2048, 2048), (4096, 1024, 1024),
               (65536, 64, 64)]]
    for k in (3, 1):
        for c, s in [(64, 32), (128, 16), (256, 8), (512, 4)]:
            shapes.append(dict(op="conv2d", N=batch, C=c, O=c, H=s, W=s, k=k, pad=k // 2, stride=1))
    for c, s in [(16, 28), (32, 14), (64, 7), (128, 4)]:
        shapes.append(dict(op="conv2d", N=batch, C=c, O=c, H=s, W=s, k=3, pad=1, stride=1))
    for c, s in [(16, 28), (32, 14), (64, 7)]:
        shapes.append(dict(op="conv2d", N=batch, C=c, O=2 * c, H=s, W=s, k=3, pad=1, stride=2))
    return shapes


def name_of(s):
    if s["op"] == "matmul":
        return f"{s['M']}x{s['K']} * {s['K']}x{s['N']}"
    stride = f" s{s['stride']}" if s.get("stride", 1) > 1 else ""
    return f"{s['C']}->{s['O']} {s['k']}x{s['k']}{stride} @{s['H']}x{s['W']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ours", help="JSON written by `adjoint bench --out FILE.json`")
    parser.add_argument("--threads", type=int, help="torch threads (default: the JSON's, else 1)")
    parser.add_argument("--batch", type=int, default=64, help="conv batch without --ours")
    parser.add_argument("--repeats", type=int, help="timed runs (default: the JSON's, else 7)")
    parser.add_argument("--out", help="write the torch figures (and ours) as JSON")
    parser.add_argument("--clock", choices=sorted(CLOCKS),
                        help="wall, or cpu (process CPU time, steady on a busy machine; 1 thread only); "
                             "default: the JSON's, else wall")
    args = parser.parse_args()

    ours = None
    if args.ours:
        with open(args.ours) as f:
            ours = json.load(f)
    threads = args.threads or (ours["threads"] if ours else 1)
    repeats = args.repeats or (ours["repeats"] if ours else 7)
    torch.set_num_threads(threads)
    global clock
    clock_name = args.clock or (ours.get("clock", "wall") if ours else "wall")
    if clock_name == "cpu" and threads != 1:
        parser.error("--clock cpu measures durations only at 1 thread")
    clock = CLOCKS[clock_name]

    # One entry per layer shape; ours has a row per (shape, pass).
    ours_rows = {}
    shapes = []
    if ours:
        for r in ours["results"]:
            key = (r["op"], r["name"])
            if not any((r["op"], r["name"], p) in ours_rows for p in ("fwd", "fwd+bwd")):
                shapes.append({k: v for k, v in r.items() if k not in ("pass", "ms", "gflops", "sgemm_ms",
                                                                          "sgemm_gflops", "ratio", "name")})
            ours_rows[key + (r["pass"],)] = r
    else:
        shapes = default_shapes(args.batch)

    peer = torch_peer.describe(torch)
    print(f"PyTorch {torch.__version__}: {threads} threads, median {clock_name} time of {repeats} runs; "
          f"PyTorch: OpenBLAS {peer['blas']}, ATen {peer['cpu_capability']}, oneDNN {peer['onednn']}, "
          f"OpenMP wait {peer['omp_wait_policy']}, OpenBLAS threads {peer['blas_threads']}"
          + (f"; adjoint: {ours['threads']} threads, OpenBLAS kernels {ours['blas']}" if ours else ""))
    if ours and not torch_peer.fair(peer, ours.get("blas")):
        ours_rows = {}  # the times are still printed, the ratios are not
    header = f"{'op':8} {'shape':26} {'pass':8} {'torch ms':>10}"
    if ours:
        header += f" {'ours ms':>10} {'torch/ours':>10} {'ours/sgemm':>10}"
    print(header)
    records = []
    for s in shapes:
        if s["op"] == "matmul":
            fwd, both = matmul_times(s["M"], s["K"], s["N"], repeats)
        else:
            fwd, both = conv_times(s["N"], s["C"], s["O"], s["H"], s["k"], s["pad"], repeats, s.get("stride", 1))
        for pass_name, seconds in (("fwd", fwd), ("fwd+bwd", both)):
            line = f"{s['op']:8} {name_of(s):26} {pass_name:8} {seconds * 1e3:10.2f}"
            record = dict(s, name=name_of(s), torch_ms=seconds * 1e3)
            record["pass"] = pass_name
            mine = ours_rows.get((s["op"], name_of(s), pass_name)) if ours else None
            if mine:
                line += f" {mine['ms']:10.2f} {seconds * 1e3 / mine['ms']:10.2f} {mine['ratio']:10.2f}"
                record.update(ours_ms=mine["ms"], torch_over_ours=seconds * 1e3 / mine["ms"], ours_ratio=mine["ratio"])
            print(line, flush=True)
            records.append(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=threads, clock=clock_name, repeats=repeats,
                           results=records), f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
