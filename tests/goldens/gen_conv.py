"""Goldens for ops/matmul, ops/conv and ops/pool: forward values and the gradients of
<u, f(...)> for a fixed random cotangent u, for every operand.

Also the soft max-pool pullback (docs/methods.md §1.2): u spread over each window with weights
softmax(window/tau), held fixed (detached), padding excluded, overlapping windows adding up.
It is written here independently of the C++ rule: unfold (padding = -inf), softmax, fold.

Run: /usr/bin/python3 tests/goldens/gen_conv.py
"""
import torch
import torch.nn.functional as F

from fixture_io import save, seeded

out = {}


def rand(gen, *shape, lo=-1.0, hi=1.0):
    return torch.rand(*shape, generator=gen) * (hi - lo) + lo


def record(prefix, fn, inputs, gen):
    """Saves the inputs, fn(*inputs), the cotangent u and d<u, fn>/d input for each input."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    u = rand(gen, *y.shape)
    grads = torch.autograd.grad(y, leaves, u)
    for i, t in enumerate(inputs):
        out[f"{prefix}.in{i}"] = t
        out[f"{prefix}.grad{i}"] = grads[i]
    out[f"{prefix}.out"] = y.detach()
    out[f"{prefix}.u"] = u


g = seeded(20240601)

# matmul: plain, batched, folded (2-D b with 3-D a)
record("matmul.plain", torch.matmul, [rand(g, 7, 5), rand(g, 5, 4)], g)
record("matmul.batched", torch.matmul, [rand(g, 2, 3, 4, 5), rand(g, 2, 3, 5, 6)], g)
record("matmul.folded", torch.matmul, [rand(g, 2, 3, 5), rand(g, 5, 4)], g)

# linear: 3-D input with bias, 1-D input without
record("linear.bias", F.linear, [rand(g, 2, 3, 5), rand(g, 4, 5), rand(g, 4)], g)
record("linear.nobias", F.linear, [rand(g, 5), rand(g, 4, 5)], g)

# conv2d configurations: (name, x shape, weight shape, kwargs)
conv_cases = [
    ("basic", (2, 3, 7, 6), (4, 3, 3, 3), dict(padding=1)),
    ("strided", (2, 3, 9, 8), (4, 3, 3, 2), dict(stride=(2, 1), padding=(1, 1), dilation=(2, 1))),
    ("stride2", (3, 2, 8, 7), (3, 2, 3, 3), dict(stride=2, padding=1)),
    ("groups", (2, 4, 6, 6), (6, 2, 3, 3), dict(groups=2)),
    ("pointwise", (3, 5, 4, 4), (6, 5, 1, 1), dict()),                  # 1x1 fast path, images folded
    ("pointwise_wide", (2, 2, 16, 16), (1, 2, 1, 1), dict()),           # 1x1 fast path, one image per GEMM
    ("wide", (2, 1, 32, 32), (1, 1, 3, 3), dict(padding=1)),            # one image per GEMM, 2 partial sums
    ("strided_1x1", (2, 3, 5, 5), (2, 3, 1, 1), dict(stride=2)),        # 1x1 but not pointwise
    ("depthwise", (2, 3, 5, 5), (3, 1, 3, 3), dict(padding=2, dilation=2, groups=3)),
    ("winograd", (1, 16, 5, 6), (16, 16, 3, 3), dict(padding=1)),     # 3x3 stride 1, >= 16 channels
]
for name, xs, ws, kw in conv_cases:
    record(f"conv.{name}", lambda x, w, b, kw=kw: F.conv2d(x, w, b, **kw),
           [rand(g, *xs), rand(g, *ws), rand(g, ws[0])], g)

# pools (inputs: distinct values, so that no arg-max is ambiguous; ties tested separately)
def distinct(*shape):
    n = torch.tensor(shape).prod().item()
    return (torch.randperm(n, generator=g).float() / n * 2 - 1).reshape(shape)


record("maxpool.k3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1), [distinct(2, 3, 7, 7)], g)
record("maxpool.k2s1", lambda x: F.max_pool2d(x, 2, 1), [distinct(2, 2, 5, 6)], g)
# ties: small integers, overlapping windows: PyTorch keeps the first maximum in row-major order
record("maxpool.ties", lambda x: F.max_pool2d(x, 3, 1, 1),
       [torch.randint(0, 3, (2, 2, 6, 6), generator=g).float()], g)
record("avgpool.k3s2p1", lambda x: F.avg_pool2d(x, 3, 2, 1), [rand(g, 2, 3, 7, 7)], g)
record("avgpool.k2s2", lambda x: F.avg_pool2d(x, 2, 2), [rand(g, 2, 3, 6, 5)], g)
record("adaptive.7x5to3x2", lambda x: F.adaptive_avg_pool2d(x, (3, 2)), [rand(g, 2, 3, 7, 5)], g)


def soft_maxpool_pullback(x, u, k, s, p, tau):
    """u spread over each window with softmax(window/tau) weights (detached; padding gets none)."""
    n, c, h, w = x.shape
    xp = F.pad(x, (p, p, p, p), value=float("-inf"))
    cols = F.unfold(xp, k, stride=s).reshape(n, c, k * k, -1)    # (N, C, k*k, L)
    weights = torch.softmax(cols / tau, dim=2).detach()
    spread = (weights * u.reshape(n, c, 1, -1)).reshape(n, c * k * k, -1)
    dxp = F.fold(spread, (h + 2 * p, w + 2 * p), k, stride=s)
    return dxp[:, :, p:p + h, p:p + w]


for name, (k, s, p), tau in [("k3s2p1_t03", (3, 2, 1), 0.3), ("k3s2p1_t1", (3, 2, 1), 1.0),
                             ("k2s1_t03", (2, 1, 0), 0.3)]:
    x = rand(g, 2, 3, 7, 7)
    y = F.max_pool2d(x, k, s, p)
    u = rand(g, *y.shape)
    out[f"softmax_pool.{name}.in0"] = x
    out[f"softmax_pool.{name}.u"] = u
    out[f"softmax_pool.{name}.grad0"] = soft_maxpool_pullback(x, u, k, s, p, tau)

save("conv", out)
