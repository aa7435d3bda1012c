"""PyTorch twins of adjoint's models, with the same parameter names and order of
operations: the peers of the benchmarks (tools/bench_models_torch.py) and the sources
of the model goldens (tests/goldens/gen_models.py). ResNet and VGG come from
torchvision; the ViT follows timm's vision_transformer; the bilinear LM follows
models/bilinear.cpp. Needs Debian's python3-torch (and python3-torchvision).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class Attention(nn.Module):  # timm.models.vision_transformer.Attention
    def __init__(self, dim, heads, qkv_bias=True):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, causal=False):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        if causal:
            a = a.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
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
    def __init__(self, img, p, c, classes, dim, depth, heads, pool="token"):
        super().__init__()
        self.pool = pool
        self.patch_embed = PatchEmbed(c, dim, p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (img // p) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        # timm: with global_pool='avg' the final norm moves after pooling, as fc_norm
        if pool == "avg":
            self.fc_norm = nn.LayerNorm(dim, eps=1e-6)
        else:
            self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.blocks(x)
        if self.pool == "avg":
            return self.head(self.fc_norm(x[:, 1:].mean(dim=1)))
        return self.head(self.norm(x)[:, 0])


def vit_tiny(img, patch, channels, classes):
    return VisionTransformer(img, patch, channels, classes, 192, 12, 3)


def scaled(channels, width):
    """A channel count times the width multiplier, as adjoint rounds it (lround, at least 1)."""
    return max(1, int(math.floor(channels * width + 0.5)))


def small_vgg(name, classes, in_ch, width=1.0):
    """torchvision VGG with adjoint's small-image classifier: no last max-pool,
    global average pool, one linear layer; every conv's channels times `width`."""
    m = getattr(torchvision.models, name)(num_classes=classes)
    if width != 1.0:
        letter = {"vgg11": "A", "vgg13": "B", "vgg16": "D", "vgg19": "E"}[name.replace("_bn", "")]
        layout = [v if v == "M" else scaled(v, width) for v in torchvision.models.vgg.cfgs[letter]]
        m.features = torchvision.models.vgg.make_layers(layout, batch_norm=name.endswith("_bn"))
    if in_ch != 3:
        m.features[0] = nn.Conv2d(in_ch, m.features[0].out_channels, 3, padding=1)
    m.features = m.features[:-1]
    m.avgpool = nn.AdaptiveAvgPool2d(1)
    last_conv = [layer for layer in m.features if isinstance(layer, nn.Conv2d)][-1]
    m.classifier = nn.Sequential(nn.Linear(last_conv.out_channels, classes))
    return m


def small_stem_resnet(name, classes, in_ch, width=1.0):
    """torchvision ResNet with the small-image stem: 3x3 stride 1, no max-pool; every
    stage's channels times `width` (torchvision fixes them, so the stages are rebuilt)."""
    m = getattr(torchvision.models, name)(num_classes=classes)
    stem = scaled(64, width)
    m.conv1 = nn.Conv2d(in_ch, stem, 3, 1, 1, bias=False)
    m.maxpool = nn.Identity()
    if width != 1.0:
        m.bn1 = nn.BatchNorm2d(stem)
        m.inplanes = stem
        kind = type(m.layer1[0])
        for stage in range(4):
            layer = f"layer{stage + 1}"
            setattr(m, layer, m._make_layer(kind, scaled(64 << stage, width), len(getattr(m, layer)),
                                            stride=1 if stage == 0 else 2))
        m.fc = nn.Linear(m.inplanes, classes)
    return m


def run_blocks(blocks, h, start, end):
    """h through blocks[start:end] (adjoint's Model::run)."""
    for b in blocks[start:end]:
        h = b(h)
    return h


def trace_blocks(blocks, h, start, end):
    """Every output of blocks[start:end] on h (adjoint's Model::trace)."""
    out = []
    for b in blocks[start:end]:
        h = b(h)
        out.append(h)
    return out


def blocks(model):
    """adjoint's blocks of a small_vgg or small_stem_resnet (models/vgg.cpp, resnet.cpp), as
    functions: VGG one per conv unit (conv, bn, relu and a following max-pool), ResNet the
    stem, then every residual block; the head (global average pool + linear) last."""
    if isinstance(model, torchvision.models.ResNet):
        out = [lambda h: model.relu(model.bn1(model.conv1(h)))]
        out += [unit for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for unit in layer]
        out.append(lambda h: model.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1)))
        return out
    starts = [i for i, layer in enumerate(model.features) if isinstance(layer, nn.Conv2d)]
    ends = starts[1:] + [len(model.features)]
    out = [model.features[s:e] for s, e in zip(starts, ends)]
    out.append(lambda h: model.classifier(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1)))
    return out


class Bilinear(nn.Module):
    """(L x~) * (R x~) with x~ = (1, x): column 0 of left/right is the bias."""
    def __init__(self, d, h):
        super().__init__()
        self.left = nn.Parameter(torch.randn(h, d + 1) / d ** 0.5)
        self.right = nn.Parameter(torch.randn(h, d + 1) / d ** 0.5)

    def forward(self, x):
        l = F.linear(x, self.left[:, 1:], self.left[:, 0])
        r = F.linear(x, self.right[:, 1:], self.right[:, 0])
        return l * r


class BilinearMlpOut(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.bilinear = Bilinear(dim, hidden)
        self.out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.out(self.bilinear(x))


class BilinearLmBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn = Attention(dim, heads, qkv_bias=False)
        self.mlp = BilinearMlpOut(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(x, causal=True)
        return x + self.mlp(x)


class BilinearLm(nn.Module):
    """adjoint's bilinear_lm with softmax attention, no LayerNorm, residual scale 1."""
    def __init__(self, vocab=256, dim=256, depth=2, heads=4, seq_len=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos_embed = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        self.blocks = nn.Sequential(*[BilinearLmBlock(dim, heads) for _ in range(depth)])
        self.unembed = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos_embed[: tokens.shape[1]]
        return self.unembed(self.blocks(x))
