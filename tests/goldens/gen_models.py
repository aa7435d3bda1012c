"""Golden logits for the model zoo: torchvision ResNet-18/50 and VGG-11-BN, and a
timm-equivalent ViT, written so that no weights need to be committed.

Every state-dict tensor is filled by a formula of its name and element index that the
C++ test (tests/test_models.cpp, `formula_state_dict`) reproduces exactly in integer
arithmetic; the fixture holds only the input, the logits and the names/shapes.
Run: /usr/bin/python3 tests/goldens/gen_models.py  (needs python3-torchvision)
"""
import json

import numpy as np
import torch
import torch.nn as nn
import torchvision

from fixture_io import save, seeded

MASK64 = (1 << 64) - 1


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def formula(name, shape):
    """Values in [-0.5, 0.5) from (name, index), then scaled by the tensor's role."""
    n = int(np.prod(shape)) if len(shape) else 1
    i = np.arange(n, dtype=np.uint64)
    h = np.uint64(fnv1a64(name))
    with np.errstate(over="ignore"):
        bits = (h + i * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    v = bits.astype(np.float64) / float(1 << 24) - 0.5
    if name.endswith("num_batches_tracked"):
        v = np.zeros_like(v)
    elif name.endswith("running_var"):
        v = 1.0 + 0.4 * (v + 0.5)
    elif name.endswith("running_mean") or name.endswith("bias"):
        v = 0.1 * v
    elif len(shape) == 1:  # norm weights
        v = 1.0 + 0.2 * v
    else:
        fan_in = n // shape[0] if shape[0] else 1
        if name.endswith("cls_token") or name.endswith("pos_embed"):
            fan_in = shape[-1]
        v = v * 2.0 * np.sqrt(3.0 / fan_in)
    return torch.from_numpy(v.astype(np.float32).reshape(shape))


def fill(model):
    sd = model.state_dict()
    model.load_state_dict({k: formula(k, list(t.shape)).to(t.dtype) for k, t in sd.items()})
    return [(k, list(t.shape)) for k, t in sd.items()]


class Attention(nn.Module):  # timm.models.vision_transformer.Attention
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        x = (a.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, c, dim, p):
        super().__init__()
        self.proj = nn.Conv2d(c, dim, p, p)


class VisionTransformer(nn.Module):  # timm's names and order of operations
    def __init__(self, img, p, c, classes, dim, depth, heads):
        super().__init__()
        self.patch_embed = PatchEmbed(c, dim, p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (img // p) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def small_vgg11_bn(classes, in_ch):
    m = torchvision.models.vgg11_bn(num_classes=classes)
    if in_ch != 3:
        m.features[0] = nn.Conv2d(in_ch, 64, 3, padding=1)
    m.features = m.features[:-1]  # adjoint's small-image VGG drops the last max-pool
    m.avgpool = nn.AdaptiveAvgPool2d(1)
    m.classifier = nn.Sequential(nn.Linear(512, classes))
    return m


def small_stem(m, in_ch):
    m.conv1 = nn.Conv2d(in_ch, 64, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    return m


cases = {
    # name: (model, input shape)
    "resnet18": (torchvision.models.resnet18(num_classes=10), [2, 3, 64, 64]),
    "resnet18_small": (small_stem(torchvision.models.resnet18(num_classes=10), 1), [2, 1, 28, 28]),
    "resnet50": (torchvision.models.resnet50(num_classes=10), [1, 3, 64, 64]),
    "vgg11_bn_small": (small_vgg11_bn(10, 1), [2, 1, 28, 28]),
    "vit_custom": (VisionTransformer(16, 4, 3, 10, 48, 2, 3), [2, 3, 16, 16]),
}

out, meta = {}, {}
for name, (model, shape) in cases.items():
    names = fill(model)
    model.eval()
    x = torch.rand(shape, generator=seeded(len(name))) * 2 - 1
    with torch.no_grad():
        y = model(x)
    out[name + ".input"] = x
    out[name + ".logits"] = y
    meta[name] = json.dumps(names)
save("models", out, meta)
