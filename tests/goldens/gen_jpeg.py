"""Golden fixture of JPEG decoding: small JPEGs that PIL writes (quality 75 and 90, PIL's
default 4:2:0 chroma subsampling) with the pixels PIL (libjpeg) decodes from them, so that
tests/test_imagenet.cpp can measure how stb's decoder differs. The JPEG files are stored
byte by byte as floats ("<case>.jpeg"), the pixels as (H, W, 3) ("<case>.pixels").
Run: /usr/bin/python3 tests/goldens/gen_jpeg.py
"""
import io

import numpy as np
import PIL.Image
import torch

from fixture_io import save


def photo_like(seed, height, width):
    """Smooth colour gradients, a few hard-edged shapes and sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    img = np.stack([np.sin(5 * x + seed), np.cos(4 * y - seed), np.sin(7 * (x + y))], -1) * 0.35 + 0.5
    for _ in range(3):  # rectangles of flat colour
        top, left = rng.integers(0, height // 2), rng.integers(0, width // 2)
        img[top:top + rng.integers(6, height // 2), left:left + rng.integers(6, width // 2)] = rng.random(3)
    img = img * 255 + rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


tensors = {}
for name, seed, quality in [("a_q75", 1, 75), ("a_q90", 1, 90), ("b_q90", 2, 90)]:
    buffer = io.BytesIO()
    PIL.Image.fromarray(photo_like(seed, 48, 64), "RGB").save(buffer, format="JPEG", quality=quality)
    data = buffer.getvalue()
    decoded = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    tensors[name + ".jpeg"] = torch.tensor(list(data), dtype=torch.float32)
    tensors[name + ".pixels"] = torch.from_numpy(decoded.astype(np.float32))
save("jpeg", tensors, {"pil": PIL.__version__})
