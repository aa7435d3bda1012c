"""Goldens for the explanation methods (analysis/pullbacks/explain.h, docs/methods.md §1.3).

Two tiny models with their weights in the fixture:
  cnn  conv-BN(eval)-ReLU-maxpool ×2, conv-BN-ReLU, global average pool, linear
       (blocks "conv1", "conv2", "conv3", "head"; tests/test_explain.cpp builds the same)
  vit  the model zoo's vit_custom: dim 16, depth 2, 2 heads, patch 4, image 8, MLP ratio 2
       (timm's names and order of operations, GELU, pre-LN)
Each method is computed here from its definition, in float64, by PyTorch autograd:
  gradient / input×gradient / ascents / IG  plain autograd (IG: Riemann-trapezoid and
      Gauss-Legendre sums, nodes from numpy's leggauss)
  pullback, soft pullback  the published rules as surrogates with detached gates:
      z·g.detach() for activations, unfold + softmax(window/τ).detach() for max-pool,
      (x − μ.detach())/σ.detach() for LayerNorm, softmax(QKᵀs/τ).detach()·V for attention,
      each added to the detached difference to the true forward so values are unchanged
  guided backprop  an autograd.Function: relu(u)·f'(z)
  DeepLift  an autograd.Function on the batch [x; x0]: multiplier (f(z)−f(z0))/(z−z0)
  Grad-CAM  gradient at a block's output, channel means, ReLU, F.interpolate (bilinear,
      align_corners=False), repeated over the input channels

Run: /usr/bin/python3 tests/goldens/gen_explain.py
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fixture_io import save, seeded

gen = seeded(20250731)
DEFAULT_TAU = {"relu": 0.6, "gelu": 1.0, "max_pool": 0.3, "attention": 1.0}
ALL_05 = {"relu": 0.5, "gelu": 0.5, "max_pool": 0.5, "attention": 0.5}

# The transport every nonlinearity below follows: gradient | pullback | soft | guided | deeplift.
MODE = {"kind": "gradient", "tau": DEFAULT_TAU}


def Phi(z):
    return 0.5 * (1 + torch.erf(z / math.sqrt(2)))


def phi(z):
    return torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


ACT = {"relu": torch.relu, "gelu": F.gelu}
DERIV = {"relu": lambda z: (z > 0).to(z.dtype), "gelu": lambda z: Phi(z) + z * phi(z)}
FROZEN_GATE = {"relu": lambda z: (z > 0).to(z.dtype), "gelu": Phi}


def with_value(y, s):
    """The value of y with the gradient of the surrogate s."""
    return (y - s).detach() + s


class GuidedAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, kind):
        ctx.save_for_backward(z)
        ctx.kind = kind
        return ACT[kind](z)

    @staticmethod
    def backward(ctx, u):
        (z,) = ctx.saved_tensors
        return DERIV[ctx.kind](z) * u.clamp(min=0), None


class RescaleAct(torch.autograd.Function):
    """DeepLift's rescale rule on [x; x0], as Captum's nonlinear hook."""

    @staticmethod
    def forward(ctx, z, kind):
        ctx.save_for_backward(z)
        ctx.kind = kind
        return ACT[kind](z)

    @staticmethod
    def backward(ctx, u):
        (z,) = ctx.saved_tensors
        f, d = ACT[ctx.kind], DERIV[ctx.kind]
        x, x0 = z.chunk(2)
        dx = x - x0
        small = dx.abs() < 1e-6
        m = (f(x) - f(x0)) / torch.where(small, torch.ones_like(dx), dx)
        mult = torch.cat([torch.where(small, d(x), m), torch.where(small, d(x0), m)])
        return mult * u, None


def activation(z, kind):
    mode = MODE["kind"]
    y = ACT[kind](z)
    if mode == "pullback":
        return with_value(y, z * FROZEN_GATE[kind](z).detach())
    if mode == "soft":
        return with_value(y, z * Phi(z / MODE["tau"][kind]).detach())
    if mode == "guided":
        return GuidedAct.apply(z, kind)
    if mode == "deeplift":
        return RescaleAct.apply(z, kind)
    return y


def max_pool(x, k):
    y = F.max_pool2d(x, k, k)
    if MODE["kind"] != "soft":
        return y  # the arg-max routing is the gradient
    N, C, H, W = x.shape
    win = F.unfold(x.reshape(N * C, 1, H, W), k, stride=k)  # (N·C, k·k, windows)
    w = torch.softmax(win / MODE["tau"]["max_pool"], dim=1).detach()
    return with_value(y, (w * win).sum(1).reshape(y.shape))


def layer_norm(x, ln):
    if MODE["kind"] in ("pullback", "soft"):
        mu = x.mean(-1, keepdim=True)
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)
        return with_value(F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps),
                          (x - mu.detach()) / sigma.detach() * ln.weight + ln.bias)
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def attend(q, k, v, scale):
    scores = q @ k.transpose(-2, -1) * scale
    y = torch.softmax(scores, dim=-1) @ v
    if MODE["kind"] == "pullback":
        return with_value(y, torch.softmax(scores, dim=-1).detach() @ v)
    if MODE["kind"] == "soft":
        return with_value(y, torch.softmax(scores / MODE["tau"]["attention"], dim=-1).detach() @ v)
    return y


# ---- models ----------------------------------------------------------------------------
class TinyCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, 5)
        self.block_names = ["conv1", "conv2", "conv3", "head"]

    def unit(self, x, i, pool):
        conv, bn = self.features[i], self.features[i + 1]
        h = activation(bn(conv(x)), "relu")
        return max_pool(h, 2) if pool else h

    def block(self, i, x):
        if i == 0:
            return self.unit(x, 0, True)
        if i == 1:
            return self.unit(x, 4, True)
        if i == 2:
            return self.unit(x, 8, False)
        return self.fc(x.mean(dim=(2, 3)))


class Vit(nn.Module):
    def __init__(self, img=8, p=4, c=3, classes=5, dim=16, depth=2, heads=2, ratio=2):
        super().__init__()
        self.heads = heads
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(c, dim, p, p)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim, generator=gen) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, (img // p) ** 2 + 1, dim, generator=gen) * 0.5)
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            b = nn.Module()
            b.norm1 = nn.LayerNorm(dim, eps=1e-6)
            b.attn = nn.Module()
            b.attn.qkv = nn.Linear(dim, 3 * dim)
            b.attn.proj = nn.Linear(dim, dim)
            b.norm2 = nn.LayerNorm(dim, eps=1e-6)
            b.mlp = nn.Module()
            b.mlp.fc1 = nn.Linear(dim, ratio * dim)
            b.mlp.fc2 = nn.Linear(ratio * dim, dim)
            self.blocks.append(b)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)
        self.block_names = ["patch_embed"] + [f"blocks.{i}" for i in range(depth)] + ["head"]

    def attention(self, b, x):
        B, T, C = x.shape
        qkv = b.attn.qkv(x).reshape(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        o = attend(q, k, v, (C // self.heads) ** -0.5)
        return b.attn.proj(o.transpose(1, 2).reshape(B, T, C))

    def block(self, i, x):
        if i == 0:
            t = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
            t = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), t], dim=1)
            return t + self.pos_embed
        if i <= len(self.blocks):
            b = self.blocks[i - 1]
            h = x + self.attention(b, layer_norm(x, b.norm1))
            return h + b.mlp.fc2(activation(b.mlp.fc1(layer_norm(h, b.norm2)), "gelu"))
        return self.head(layer_norm(x, self.norm)[:, 0])


def run(model, x, start=0, stop=None):
    stop = len(model.block_names) if stop is None else stop
    for i in range(start, stop):
        x = model.block(i, x)
    return x


def randomise(model):
    """Weights drawn from the fixture's generator; BN running statistics away from 0/1."""
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var") or (t.dim() == 1 and name.endswith("weight")):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            elif name.endswith("running_mean") or name.endswith("bias"):
                t.copy_((torch.rand(t.shape, generator=gen) - 0.5) * 0.4)
            elif not (name.endswith("cls_token") or name.endswith("pos_embed")):
                fan_in = t[0].numel()
                t.copy_((torch.rand(t.shape, generator=gen) * 2 - 1) * math.sqrt(3.0 / fan_in))


# ---- the methods -------------------------------------------------------------------------
def one_hot(targets, rows, classes):
    u = torch.zeros(rows, classes, dtype=torch.float64)
    for r, c in enumerate(targets):
        u[r, c] = 1.0
    return u


def input_cotangent(model, x, targets, kind="gradient", tau=DEFAULT_TAU):
    MODE["kind"], MODE["tau"] = kind, tau
    leaf = x.detach().clone().requires_grad_()
    logits = run(model, leaf)
    (g,) = torch.autograd.grad(logits, leaf, one_hot(targets, logits.shape[0], logits.shape[1]))
    MODE["kind"], MODE["tau"] = "gradient", DEFAULT_TAU
    return g


def ascent(model, x, targets, kind, steps, alpha, clip=None):
    xt = x.clone()
    for _ in range(steps):
        nu = input_cotangent(model, xt, targets, kind)
        norm = nu.flatten(1).norm(dim=1).view(-1, *[1] * (x.dim() - 1))
        xt = xt + alpha * nu / norm
        if clip:
            xt = xt.clamp(*clip)
    return xt - x, xt


def integrated_gradients(model, x, targets, nodes, weights, x0):
    total = torch.zeros_like(x)
    for a, w in zip(nodes, weights):
        total += w * input_cotangent(model, x0 + a * (x - x0), targets)
    return (x - x0) * total


def trapezoid(n):
    return np.linspace(0, 1, n), np.array([0.5 if k in (0, n - 1) else 1.0 for k in range(n)]) / (n - 1)


def gauss_legendre(n):
    t, w = np.polynomial.legendre.leggauss(n)
    return (t + 1) / 2, w / 2


def deeplift(model, x, targets, x0):
    MODE["kind"] = "deeplift"
    leaf = torch.cat([x, x0]).requires_grad_()
    logits = run(model, leaf)
    u = torch.zeros_like(logits)
    u[: x.shape[0]] = one_hot(targets, x.shape[0], logits.shape[1])
    (g,) = torch.autograd.grad(logits, leaf, u)
    MODE["kind"] = "gradient"
    return (x - x0) * g[: x.shape[0]]


def gradcam(model, x, targets, block):
    b = model.block_names.index(block)
    feats = run(model, x, 0, b + 1).detach().requires_grad_()
    logits = run(model, feats, b + 1)
    (g,) = torch.autograd.grad(logits, feats, one_hot(targets, *logits.shape))
    if feats.dim() == 3:  # tokens: drop the class token, (N, h·w, D) → (N, D, h, w)
        side = int(round(math.sqrt(feats.shape[1] - 1)))
        to_grid = lambda t: t[:, 1:].transpose(1, 2).reshape(t.shape[0], -1, side, side)
        feats, g = to_grid(feats), to_grid(g)
    w = g.mean(dim=(2, 3), keepdim=True)
    cam = torch.relu((w * feats).sum(1, keepdim=True))
    up = F.interpolate(cam, size=x.shape[2:], mode="bilinear", align_corners=False)
    return up.expand(-1, x.shape[1], -1, -1).detach(), cam[:, 0].detach()


out = {}


def record(prefix, model, x, targets, gradcam_blocks):
    model.eval()
    for name, t in model.state_dict().items():
        out[f"{prefix}.weights.{name}"] = t
    model.double()
    x = x.double()
    N = x.shape[0]
    D = x[0].numel()
    alpha = 20 * math.sqrt(D / 150528)  # range [-1, 1]
    baseline = (torch.rand(x.shape[1:], generator=gen) * 2 - 1).double() * 0.5
    out[f"{prefix}.x"] = x
    out[f"{prefix}.targets"] = torch.tensor(targets, dtype=torch.float32)
    out[f"{prefix}.baseline"] = baseline
    out[f"{prefix}.alpha"] = torch.tensor([alpha])
    with torch.no_grad():
        out[f"{prefix}.logits"] = run(model, x)
    g = input_cotangent(model, x, targets)
    out[f"{prefix}.gradient"] = g
    out[f"{prefix}.input_x_gradient"] = x * g
    out[f"{prefix}.pullback"] = input_cotangent(model, x, targets, "pullback")
    out[f"{prefix}.soft_pullback"] = input_cotangent(model, x, targets, "soft")
    out[f"{prefix}.soft_pullback_tau05"] = input_cotangent(model, x, targets, "soft", ALL_05)
    out[f"{prefix}.guided_backprop"] = input_cotangent(model, x, targets, "guided")
    out[f"{prefix}.pullback_ascent"], out[f"{prefix}.pullback_ascent_xK"] = ascent(model, x, targets, "soft", 5, alpha)
    out[f"{prefix}.gradient_ascent"], _ = ascent(model, x, targets, "gradient", 5, alpha)
    out[f"{prefix}.pullback_ascent_clip"], _ = ascent(model, x, targets, "soft", 3, 2.0, clip=(-1.0, 1.0))
    zero = torch.zeros_like(x)
    out[f"{prefix}.ig_trapezoid"] = integrated_gradients(model, x, targets, *trapezoid(7), zero)
    out[f"{prefix}.ig_gauss_legendre"] = integrated_gradients(model, x, targets, *gauss_legendre(7), zero)
    out[f"{prefix}.ig_gauss_legendre_baseline"] = integrated_gradients(
        model, x, targets, *gauss_legendre(7), baseline.expand_as(x))
    out[f"{prefix}.deeplift"] = deeplift(model, x, targets, zero)
    out[f"{prefix}.deeplift_baseline"] = deeplift(model, x, targets, baseline.expand_as(x).clone())
    for i, block in enumerate(gradcam_blocks):
        cam, low = gradcam(model, x, targets, block)
        out[f"{prefix}.gradcam{i}"] = cam
        out[f"{prefix}.gradcam{i}_map"] = low
        if i == 0:
            out[f"{prefix}.guided_gradcam"] = cam * out[f"{prefix}.guided_backprop"]


torch.manual_seed(0)  # only module constructors draw from the global generator; weights are overwritten
cnn = TinyCnn()
randomise(cnn)
record("cnn", cnn, torch.rand(2, 3, 12, 12, generator=gen) * 2 - 1, [1, 4], ["conv3", "conv2"])

vit = Vit()
randomise(vit)
record("vit", vit, torch.rand(2, 3, 8, 8, generator=gen) * 2 - 1, [2, 3], ["blocks.0", "blocks.1"])

# Bilinear resampling at non-integer scales, up and down.
maps = torch.rand(2, 3, 5, generator=gen).double()
out["resize.in"] = maps
out["resize.up"] = F.interpolate(maps[:, None], size=(7, 11), mode="bilinear", align_corners=False)[:, 0]
out["resize.down"] = F.interpolate(maps[:, None], size=(2, 3), mode="bilinear", align_corners=False)[:, 0]

# Gauss-Legendre nodes and weights on [0, 1].
for n in (1, 2, 5, 12):
    nodes, weights = gauss_legendre(n)
    out[f"gl{n}.nodes"] = torch.from_numpy(nodes)
    out[f"gl{n}.weights"] = torch.from_numpy(weights)

save("explain", out)
