"""Golden losses and stitch gradients for model stitching (analysis/stitching_*.h).

A tiny pair of VGG-11-BN models (width 1/32, 1x16x16 inputs, torchvision's names and
adjoint's block structure: one block per conv unit, the head last) with random weights
and BatchNorm statistics, exported whole ("A.<name>", "B.<name>"), so the C++ test
rebuilds exactly these models. For three stitch points (equal sizes, a 2x area
downsample, a 2x bilinear upsample) and every objective, the fixture holds the loss and
its gradient with respect to the stitch's weight and bias.
Run: /usr/bin/python3 tests/goldens/gen_stitch.py
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from fixture_io import save, seeded

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_models import run_blocks as run, trace_blocks as trace  # noqa: E402  (adjoint's Model::run, trace)

LAYOUT = [2, "M", 4, "M", 8, 8, "M", 16, 16, "M", 16, 16]  # vgg11 at width 1/32, last pool dropped
A_NORM = (0.3, 0.4)  # (mean, std) of each model's inputs
B_NORM = (0.5, 0.25)


class TinyVgg(nn.Module):
    def __init__(self):
        super().__init__()
        layers, self.units, c = [], [], 1
        for i, v in enumerate(LAYOUT):
            if v == "M":
                continue
            start = len(layers)
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
            if i + 1 < len(LAYOUT) and LAYOUT[i + 1] == "M":
                layers.append(nn.MaxPool2d(2, 2))
            self.units.append((start, len(layers)))
            c = v
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(c, 10))

    def blocks(self):
        """adjoint's blocks: one function per conv unit, then the head."""
        out = [lambda h, s=s, e=e: self.features[s:e](h) for s, e in self.units]
        out.append(lambda h: self.classifier(F.adaptive_avg_pool2d(h, 1).flatten(1)))
        return out


def randomised(seed):
    torch.manual_seed(seed)
    m = TinyVgg()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


def resize(h, height, width):
    """Area averages on a shrinking axis, linear interpolation on a growing one."""
    if h.shape[2] > height or h.shape[3] > width:
        h = F.adaptive_avg_pool2d(h, (min(height, h.shape[2]), min(width, h.shape[3])))
    if h.shape[2] < height or h.shape[3] < width:
        h = F.interpolate(h, size=(height, width), mode="bilinear", align_corners=False)
    return h


def objectives(path, targets, labels, temperature, weights, normalise):
    logits, end_logits = path[-1], targets[-1]
    out = {
        "hlm": F.cross_entropy(logits, labels),
        "slm": -(F.softmax(end_logits / temperature, 1) * F.log_softmax(logits / temperature, 1)).sum(1).mean(),
        "dm": ((path[0] - targets[0]) ** 2).mean(),
    }
    total = 0
    for l in range(len(path) - 1):
        w = 1.0 if weights is None else weights[l]
        d = path[l] - targets[l]
        if normalise:
            term = (d ** 2).flatten(1).sum(1) / (targets[l] ** 2).flatten(1).sum(1).clamp(min=1e-12)
            term = term.mean()
        else:
            term = (d ** 2).mean()
        total = total + w * term
    out["fula"] = total
    return out


def main():
    g = seeded(13)
    a, b = randomised(1), randomised(2)
    x = torch.rand(4, 1, 16, 16, generator=g)
    labels = torch.tensor([3, 0, 7, 3])
    ba, bb = a.blocks(), b.blocks()
    xa = (x - A_NORM[0]) / A_NORM[1]
    xb = (x - B_NORM[0]) / B_NORM[1]
    t = {"x": x, "labels": labels.float()}
    for k, v in a.state_dict().items():
        t["A." + k] = v.float()
    for k, v in b.state_dict().items():
        t["B." + k] = v.float()
    L = len(bb)
    # (front block, end block): equal shapes, area down 8x8 -> 4x4, bilinear up 4x4 -> 8x8
    for i, j in [(2, 2), (0, 1), (1, 0)]:
        with torch.no_grad():
            front = run(ba, xa, 0, i + 1)
            h = run(bb, xb, 0, j + 1)
            targets = [h] + trace(bb, h, j + 1, L)
        cin, cout = front.shape[1], targets[0].shape[1]
        weight = (torch.rand(cout, cin, generator=g) * 2 - 1) / cin ** 0.5
        bias = (torch.rand(cout, generator=g) * 2 - 1) * 0.1
        name = f"pair_{i}_{j}"
        t[name + ".weight"], t[name + ".bias"] = weight, bias
        terms = L - 1 - j
        weights = [0.5 + 0.25 * l for l in range(terms)]
        settings = {"": (1.0, None, True), "_t2_weighted_raw": (2.0, weights, False)}
        for suffix, (temperature, w, normalise) in settings.items():
            wl, bl = weight.clone().requires_grad_(), bias.clone().requires_grad_()
            s = F.conv2d(resize(front, targets[0].shape[2], targets[0].shape[3]), wl[:, :, None, None], bl)
            path = [s] + trace(bb, s, j + 1, L)
            for obj, loss in objectives(path, targets, labels, temperature, w, normalise).items():
                gw, gb = torch.autograd.grad(loss, [wl, bl], retain_graph=True)
                key = f"{name}.{obj}{suffix}"
                t[key + ".loss"], t[key + ".grad_weight"], t[key + ".grad_bias"] = loss.reshape(1), gw, gb
        if suffix:
            t[name + ".fula_weights"] = torch.tensor(weights)
    save("stitch", t)


if __name__ == "__main__":
    main()
