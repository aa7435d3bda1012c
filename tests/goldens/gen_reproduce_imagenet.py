"""Writes the weight files that `adjoint reproduce semantic-pullbacks --imagenet` reads in
tests/test_reproduce.cpp: tests/goldens/reproduce_imagenet/{resnet50,vgg11_bn,pvt_v2_b1}.pth.

Each is written by Debian's torch.save (PyTorch 1.13) with random weights: torchvision's
ResNet-50 and VGG-11-BN with their channels divided by 32 (as gen_pth.py narrows them; the
engine's --width 0.03125 builds the same shapes) and the PVT-v2-b1 of gen_pvt.py (timm's
names) with each head 2 wide instead of 64 (the same --width). The heads have 2 classes,
the classes of the ImageNet-shaped folder the test makes. The input stays 224 × 224, as the
presets crop it, so only the widths are reduced.
Run: /usr/bin/python3 tests/goldens/gen_reproduce_imagenet.py
"""
import os

import torch
import torchvision

import gen_pth
import gen_pvt
from fixture_io import seeded

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "reproduce_imagenet")
CLASSES = 2
DIVISOR = 32  # the engine's --width 1/32


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = seeded(3737)
    gen_pth.CLASSES = CLASSES  # narrow() keeps the classifier's output of this many classes
    models = {
        "resnet50": gen_pth.narrow(torchvision.models.resnet50(num_classes=CLASSES), DIVISOR),
        "vgg11_bn": gen_pth.narrow(torchvision.models.vgg11_bn(num_classes=CLASSES), DIVISOR),
        "pvt_v2_b1": gen_pvt.pvt_v2("pvt_v2_b1", classes=CLASSES, width=1.0 / DIVISOR),
    }
    for name, model in models.items():
        gen_pth.randomise(model, gen)
        with torch.no_grad():  # a forward at the presets' size: the shapes fit 224 × 224
            assert model(torch.zeros(1, 3, 224, 224)).shape == (1, CLASSES)
        path = os.path.join(OUT, name + ".pth")
        torch.save(model.state_dict(), path)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
