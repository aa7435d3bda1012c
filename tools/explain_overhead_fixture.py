"""The inputs of tools/bench_explain_overhead.sh: torchvision's ResNet-50 with random weights
saved by torch.save (ROOT/resnet50.pth, about 100 MB, as a researcher's .pth is), and an
ImageNet-shaped folder of random-noise 256 x 256 PNGs, ROOT/imagenet/val/<wnid>/<k>.png, half
in each of two classes. The PNGs are written with zlib alone, so only torch is needed.

Run: /usr/bin/python3 tools/explain_overhead_fixture.py ROOT [IMAGES]   (default 64 images)
"""
import os
import struct
import sys
import zlib

import torch
import torchvision


def png(path, width, height, rgb):
    """An 8-bit RGB PNG of `rgb` (height * width * 3 bytes), each row with filter 0."""
    rows = b"".join(b"\0" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(rows, 6)))
        f.write(chunk(b"IEND", b""))


def main():
    root = sys.argv[1]
    images = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    gen = torch.Generator().manual_seed(3716)
    os.makedirs(root, exist_ok=True)
    weights = os.path.join(root, "resnet50.pth")
    if not os.path.exists(weights):
        torch.manual_seed(3716)
        torch.save(torchvision.models.resnet50().state_dict(), weights)
    for k in range(images):
        folder = os.path.join(root, "imagenet", "val", ("n01440764", "n01443537")[k % 2])
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{k // 2:03d}.png")
        if not os.path.exists(path):
            pixels = torch.randint(0, 256, (256 * 256 * 3,), generator=gen, dtype=torch.uint8)
            png(path, 256, 256, pixels.numpy().tobytes())
    print(f"{weights} and {images} images under {root}/imagenet/val")


if __name__ == "__main__":
    main()
