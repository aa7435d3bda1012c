"""Golden fixture of ImageNet's evaluation transform: torchvision's ImageClassification
preset (and timm's eval chain for PVT-v2, the same calls) on PIL images, for
tests/test_imagenet.cpp.

The images are not stored: pixel i of image `seed` is the integer hash below, which the
test computes the same way, writes as a PNG (lossless) and reads through the engine's
pipeline. Cases cover shrinking and enlarging, landscape and portrait, odd sizes, halves
in the centre crop's offset, bilinear and bicubic, and an image that needs no resize.
Small cases store the whole output; the presets' 224-pixel cases store a few rows.

Also stored: each torchvision preset's resize, crop, filter, mean and std as torchvision's
weights give them, so the engine's table (engine/data/imagenet.cpp) is checked against them.
Run: /usr/bin/python3 tests/goldens/gen_imagenet.py
"""
import numpy as np
import PIL.Image
import torch
import torchvision.models as models
from torchvision.transforms import InterpolationMode, _presets

from fixture_io import save

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def pixels(seed, height, width):
    """uint8 (height, width, 3): a 32-bit integer hash of (seed, index), its low byte."""
    i = np.arange(height * width * 3, dtype=np.uint64)
    x = ((i + 1) * np.uint64(0x9E3779B1) + np.uint64(seed) * np.uint64(0x85EBCA77)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(12)
    x = (x * np.uint64(0x297A2D39)) & np.uint64(0xFFFFFFFF)
    x ^= x >> np.uint64(15)
    return (x & np.uint64(255)).astype(np.uint8).reshape(height, width, 3)


# name: (seed, height, width, resize, crop, interpolation, rows kept (None: all))
CASES = {
    "shrink_portrait_bilinear": (1, 301, 257, 28, 24, "bilinear", None),
    "grow_landscape_bilinear": (2, 19, 23, 40, 32, "bilinear", None),
    "shrink_landscape_bicubic": (3, 45, 90, 30, 30, "bicubic", None),
    "grow_portrait_bicubic": (4, 13, 11, 37, 28, "bicubic", None),
    "odd_offset_bilinear": (5, 50, 77, 33, 30, "bilinear", None),
    "no_resize_bilinear": (6, 40, 47, 40, 31, "bilinear", None),
    "square_shrink_bilinear": (7, 64, 64, 40, 36, "bilinear", None),
    "resnet50_v1": (8, 333, 250, 256, 224, "bilinear", [0, 1, 37, 111, 200, 223]),
    "resnet50_v2": (9, 250, 241, 232, 224, "bilinear", [0, 5, 100, 223]),
    "pvt_v2": (10, 260, 300, 248, 224, "bicubic", [0, 77, 150, 223]),
    "vit_l_16_v1": (11, 180, 500, 242, 224, "bilinear", [3, 64, 222]),
}

MODES = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}
FILTER_CODE = {InterpolationMode.BILINEAR: 0.0, InterpolationMode.BICUBIC: 1.0}

tensors = {}
for name, (seed, h, w, resize, crop, mode, rows) in CASES.items():
    image = PIL.Image.fromarray(pixels(seed, h, w), "RGB")
    preset = _presets.ImageClassification(crop_size=crop, resize_size=resize, mean=MEAN, std=STD,
                                          interpolation=MODES[mode])
    out = preset(image)
    assert out.shape == (3, crop, crop), (name, out.shape)
    if rows is not None:
        tensors[name + ".rows"] = torch.tensor(rows, dtype=torch.float32)
        out = out[:, rows, :]
    tensors[name + ".out"] = out
    tensors[name + ".case"] = torch.tensor([seed, h, w, resize, crop, 0 if mode == "bilinear" else 1],
                                           dtype=torch.float32)

# The presets of the engine's table that come from torchvision: name → weights.
PRESETS = {
    "resnet18_v1": models.ResNet18_Weights.IMAGENET1K_V1,
    "resnet34_v1": models.ResNet34_Weights.IMAGENET1K_V1,
    "resnet50_v1": models.ResNet50_Weights.IMAGENET1K_V1,
    "resnet50_v2": models.ResNet50_Weights.IMAGENET1K_V2,
    "resnet101_v1": models.ResNet101_Weights.IMAGENET1K_V1,
    "resnet101_v2": models.ResNet101_Weights.IMAGENET1K_V2,
    "resnet152_v1": models.ResNet152_Weights.IMAGENET1K_V1,
    "resnet152_v2": models.ResNet152_Weights.IMAGENET1K_V2,
    "vgg11_v1": models.VGG11_Weights.IMAGENET1K_V1,
    "vgg11_bn_v1": models.VGG11_BN_Weights.IMAGENET1K_V1,
    "vgg13_v1": models.VGG13_Weights.IMAGENET1K_V1,
    "vgg13_bn_v1": models.VGG13_BN_Weights.IMAGENET1K_V1,
    "vgg16_v1": models.VGG16_Weights.IMAGENET1K_V1,
    "vgg16_bn_v1": models.VGG16_BN_Weights.IMAGENET1K_V1,
    "vgg19_v1": models.VGG19_Weights.IMAGENET1K_V1,
    "vgg19_bn_v1": models.VGG19_BN_Weights.IMAGENET1K_V1,
    "vit_b_16_v1": models.ViT_B_16_Weights.IMAGENET1K_V1,
    "vit_b_16_swag_e2e_v1": models.ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1,
    "vit_b_16_swag_linear_v1": models.ViT_B_16_Weights.IMAGENET1K_SWAG_LINEAR_V1,
    "vit_b_32_v1": models.ViT_B_32_Weights.IMAGENET1K_V1,
    "vit_l_16_v1": models.ViT_L_16_Weights.IMAGENET1K_V1,
    "vit_l_32_v1": models.ViT_L_32_Weights.IMAGENET1K_V1,
}
for name, weights in PRESETS.items():
    t = weights.transforms()
    tensors["preset." + name] = torch.tensor(
        [t.resize_size[0], t.crop_size[0], FILTER_CODE[t.interpolation]] + list(t.mean) + list(t.std),
        dtype=torch.float32)

save("imagenet", tensors, {"presets": ",".join(PRESETS)})
