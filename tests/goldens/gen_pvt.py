"""Goldens for PVT-v2 (models/pvt.cpp): logits and the input cotangents of one logit under
the gradient, the pullback and the soft pullback, from a PyTorch PVT-v2 written here from
the architecture (timm is not a Debian package), with timm's parameter names and layout.

The model is pvt_v2_b0 reduced as ModelConfig reduces it (every head 4 wide instead of 32,
two blocks a stage) on grey 64×64 images, so that every stage's attention reduces its map to
2×2 keys. Its random weights are saved beside the results, under "weights.<name>".

The pullbacks are built the PyTorch way (as gen_transport.py does for single ops), with
surrogates whose forward value is the network's own and whose backward applies the rule:
    f(z).detach() + g·z − (g·z).detach()   with the gate g detached (GELU: Φ(z), Φ(z/τ)),
    the attention's output with its pattern detached (A, or A recomputed at τ), through V,
    LayerNorm with its mean and deviation detached.
Run: /usr/bin/python3 tests/goldens/gen_pvt.py
Import pvt_v2 from here for a PyTorch PVT-v2 of any variant (the benchmark peer).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fixture_io import save, seeded

HEADS, REDUCTION = (1, 2, 5, 8), (8, 4, 2, 1)
# timm's variants: (dims, depths, MLP ratios).
VARIANTS = {
    "pvt_v2_b0": ((32, 64, 160, 256), (2, 2, 2, 2), (8, 8, 4, 4)),
    "pvt_v2_b1": ((64, 128, 320, 512), (2, 2, 2, 2), (8, 8, 4, 4)),
    "pvt_v2_b2": ((64, 128, 320, 512), (3, 4, 6, 3), (8, 8, 4, 4)),
    "pvt_v2_b3": ((64, 128, 320, 512), (3, 4, 18, 3), (8, 8, 4, 4)),
    "pvt_v2_b4": ((64, 128, 320, 512), (3, 8, 27, 3), (8, 8, 4, 4)),
    "pvt_v2_b5": ((64, 128, 320, 512), (3, 6, 40, 3), (4, 4, 4, 4)),
}


class Rule:
    """How a transport treats the ops whose backward it changes."""

    def __init__(self, kind="gradient", tau_gelu=1.0, tau_attention=1.0):
        self.kind, self.tau_gelu, self.tau_attention = kind, tau_gelu, tau_attention

    def gelu(self, z):
        y = F.gelu(z)
        if self.kind == "gradient":
            return y
        tau = self.tau_gelu if self.kind == "soft" else 1.0
        g = (0.5 * (1 + torch.erf(z / tau / math.sqrt(2)))).detach()
        return y.detach() + g * z - (g * z).detach()

    def layer_norm(self, norm, x):
        if self.kind == "gradient":
            return norm(x)
        mu = x.mean(-1, keepdim=True).detach()
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps).detach()
        return (x - mu) / sigma * norm.weight + norm.bias

    def attention(self, q, k, v):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        y = torch.softmax(scores, -1) @ v
        if self.kind == "gradient":
            return y
        tau = self.tau_attention if self.kind == "soft" else 1.0
        pattern = torch.softmax(scores / tau, -1).detach()
        return y.detach() + pattern @ v - (pattern @ v).detach()


def tokens(m):  # (B, C, H, W) → (B, H·W, C)
    return m.flatten(2).transpose(1, 2)


def grid(t, h, w):  # (B, H·W, C) → (B, C, H, W)
    return t.transpose(1, 2).reshape(t.shape[0], -1, h, w)


class OverlapPatchEmbed(nn.Module):
    def __init__(self, kernel, stride, cin, dim):
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, kernel, stride, kernel // 2)
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x, rule):
        m = self.proj(x)
        return grid(rule.layer_norm(self.norm, tokens(m)), m.shape[2], m.shape[3])


class Attention(nn.Module):
    def __init__(self, dim, heads, reduction):
        super().__init__()
        self.heads = heads
        self.q, self.kv, self.proj = nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)
        if reduction > 1:
            self.sr = nn.Conv2d(dim, dim, reduction, reduction)
            self.norm = nn.LayerNorm(dim, eps=1e-5)
        else:
            self.sr = None

    def forward(self, x, h, w, rule):
        B, N, C = x.shape
        q = self.q(x).reshape(B, N, self.heads, -1).transpose(1, 2)
        if self.sr is not None:
            x = rule.layer_norm(self.norm, tokens(self.sr(grid(x, h, w))))
        kv = self.kv(x).reshape(B, -1, 2, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = rule.attention(q, kv[0], kv[1])
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)

    def forward(self, x, h, w, rule):
        return self.fc2(rule.gelu(tokens(self.dwconv(grid(self.fc1(x), h, w)))))


class Block(nn.Module):
    def __init__(self, dim, heads, reduction, mlp_ratio):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads, reduction)
        self.mlp = Mlp(dim, dim * mlp_ratio)

    def forward(self, x, h, w, rule):
        x = x + self.attn(rule.layer_norm(self.norm1, x), h, w, rule)
        return x + self.mlp(rule.layer_norm(self.norm2, x), h, w, rule)


class Stage(nn.Module):
    def __init__(self, i, cin, dim, depth, mlp_ratio):
        super().__init__()
        self.downsample = OverlapPatchEmbed(3, 2, cin, dim) if i > 0 else None
        self.blocks = nn.ModuleList(Block(dim, HEADS[i], REDUCTION[i], mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, m, rule):
        if self.downsample is not None:
            m = self.downsample(m, rule)
        h, w = m.shape[2], m.shape[3]
        x = tokens(m)
        for block in self.blocks:
            x = block(x, h, w, rule)
        return grid(rule.layer_norm(self.norm, x), h, w)


class PvtV2(nn.Module):
    def __init__(self, cin, classes, dims, depths, mlp_ratios):
        super().__init__()
        self.patch_embed = OverlapPatchEmbed(7, 4, cin, dims[0])
        self.stages = nn.ModuleList(Stage(i, dims[max(i - 1, 0)], dims[i], depths[i], mlp_ratios[i]) for i in range(4))
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x, rule=Rule()):
        m = self.patch_embed(x, rule)
        for stage in self.stages:
            m = stage(m, rule)
        return self.head(m.mean((2, 3)))


def pvt_v2(variant, classes=1000, in_channels=3, width=1.0, depth=0):
    """A variant as models/pvt.cpp's make_pvt builds it: `width` scales each head's width,
    `depth` (when set) is every stage's block count. Importable: the PyTorch peer's model."""
    dims, depths, mlp_ratios = VARIANTS[variant]
    dims = [h * max(1, math.floor(d // h * width + 0.5)) for d, h in zip(dims, HEADS)]  # as std::lround
    return PvtV2(in_channels, classes, dims, [depth or d for d in depths], mlp_ratios)


def main():
    classes, channels, image, width, depth = 10, 1, 64, 0.125, 2
    torch.manual_seed(37)
    model = pvt_v2("pvt_v2_b0", classes, channels, width, depth).eval()
    with torch.no_grad():  # norms away from the identity, so that a misplaced γ or β shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1.0 + 0.2 * (torch.rand(p.shape) - 0.5)) if name.endswith("weight") else 0.1 * torch.randn(p.shape))

    x = (torch.rand(2, channels, image, image, generator=seeded(64)) * 2 - 1).requires_grad_()
    out = {"input": x, "logits": model(x)}
    target = 3
    u = torch.zeros(2, classes)
    u[:, target] = 1
    out["target"] = torch.tensor([float(target)])
    # The gradient also reaches the weights of each kind of layer (a grouped convolution's
    # among them); the pullbacks are checked at the input.
    checked = ["patch_embed.proj.weight", "stages.0.blocks.1.mlp.dwconv.weight", "stages.1.blocks.0.attn.sr.weight",
               "stages.2.downsample.norm.weight", "stages.3.blocks.0.attn.kv.weight", "stages.3.norm.bias"]
    params = dict(model.named_parameters())
    for label, rule in [("gradient", Rule()), ("pullback", Rule("pullback")),
                        ("soft_hot", Rule("soft", tau_gelu=0.5, tau_attention=2.0))]:
        y = model(x, rule)
        (out[label],) = torch.autograd.grad(y, x, u, retain_graph=True)
        if label == "gradient":
            for name, g in zip(checked, torch.autograd.grad(y, [params[n] for n in checked], u)):
                out["gradient." + name] = g
    for name, p in model.state_dict().items():
        out["weights." + name] = p
    save("pvt", out, {"config": f"pvt_v2_b0 width {width} depth {depth}, {channels}x{image}x{image} images, "
                                "soft_hot: gelu 0.5, attention 2"})


if __name__ == "__main__":
    main()
