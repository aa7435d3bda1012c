"""Golden logits for the model zoo: torchvision ResNet-18/50 and VGG-11-BN, and a
timm-equivalent ViT, written so that no weights need to be committed.

Every state-dict tensor is filled by a formula of its name and element index that the
C++ test (tests/test_models.cpp, `formula_state_dict`) reproduces exactly in integer
arithmetic; the fixture holds only the input, the logits and the names/shapes.
Run: /usr/bin/python3 tests/goldens/gen_models.py  (needs python3-torchvision)
"""
import json
import os
import sys

import numpy as np
import torch
import torchvision

from fixture_io import save, seeded

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import torch_models  # noqa: E402  (the PyTorch twins of adjoint's models)

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


cases = {
    # name: (model, input shape)
    "resnet18": (torchvision.models.resnet18(num_classes=10), [2, 3, 64, 64]),
    "resnet18_small": (torch_models.small_stem_resnet("resnet18", 10, 1), [2, 1, 28, 28]),
    "resnet50": (torchvision.models.resnet50(num_classes=10), [1, 3, 64, 64]),
    "vgg11_bn_small": (torch_models.small_vgg("vgg11_bn", 10, 1), [2, 1, 28, 28]),
    "vit_custom": (torch_models.VisionTransformer(16, 4, 3, 10, 48, 2, 3), [2, 3, 16, 16]),
    "vit_custom_avg": (torch_models.VisionTransformer(16, 4, 3, 10, 48, 2, 3, pool="avg"), [2, 3, 16, 16]),
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
