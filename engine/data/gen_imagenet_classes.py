"""Writes engine/data/imagenet_classes.inc: ImageNet-1k's 1000 class names, in the order of
the pretrained heads (the sorted WordNet ids of ImageFolder), one C++ string literal a line.

The names are the list Debian's python3-torchvision ships (torchvision/models/_meta.py,
_IMAGENET_CATEGORIES); nothing is downloaded. Run with Debian's interpreter:
    /usr/bin/python3 engine/data/gen_imagenet_classes.py
"""
import json
import os

from torchvision.models._meta import _IMAGENET_CATEGORIES

names = list(_IMAGENET_CATEGORIES)
assert len(names) == 1000, len(names)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imagenet_classes.inc")
with open(path + ".tmp", "w") as f:
    f.write("// ImageNet-1k's class names in label order. Made by gen_imagenet_classes.py; do not edit.\n")
    for name in names:
        f.write(json.dumps(name, ensure_ascii=False) + ",\n")  # a JSON string is a valid C++ literal here
os.replace(path + ".tmp", path)
print(f"wrote {path} ({len(names)} names)")
