"""A check outside the suite, at full size: torchvision's own resnet50, vgg11_bn and
vit_b_16 with random weights, saved by torch.save, run by `adjoint predict --weights` at
224×224 pixels beside PyTorch (float64). Prints the largest difference of the logits
relative to their largest magnitude. The files (about 1 GB together) go to a temporary
folder and are removed.
Run from the repository root after building: /usr/bin/python3 tests/goldens/check_pth_full_size.py [build]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_pth import randomise  # noqa: E402
from fixture_io import seeded  # noqa: E402

# name → (torchvision constructor, adjoint's model options)
MODELS = {
    "resnet50": (torchvision.models.resnet50, ["--model", "resnet50", "--imagenet-stem"]),
    "vgg11_bn": (torchvision.models.vgg11_bn, ["--model", "vgg11_bn", "--imagenet-stem"]),
    "vit_b_16": (torchvision.models.vit_b_16, ["--model", "vit_b_16"]),
}


def write_tensor(path, name, t):
    raw = t.contiguous().numpy().tobytes()
    header = json.dumps({name: {"dtype": "F32", "shape": list(t.shape), "data_offsets": [0, len(raw)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + raw)


def read_tensor(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        info = json.loads(f.read(n))[name]
        data = f.read()
    begin, end = info["data_offsets"]
    return torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32).view(info["shape"])


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    gen = seeded(224)
    x = torch.randn(2, 3, 224, 224, generator=gen)
    with tempfile.TemporaryDirectory() as tmp:
        write_tensor(os.path.join(tmp, "x.safetensors"), "x", x)
        for name, (make, options) in MODELS.items():
            model = randomise(make(), gen)
            weights = os.path.join(tmp, name + ".pth")
            torch.save(model.state_dict(), weights)
            with torch.no_grad():
                expected = model.double()(x.double()).float()
            del model
            out = os.path.join(tmp, name)
            subprocess.run([os.path.join(build, "tools", "adjoint"), "predict", *options, "--classes", "1000",
                            "--image-size", "224", "--weights", weights, "--input", os.path.join(tmp, "x.safetensors"),
                            "--out", out], check=True, stdout=subprocess.DEVNULL)
            actual = read_tensor(out + ".safetensors", "logits")
            scale = expected.abs().max().item()
            print(f"{name}: max |ours - PyTorch| / max |PyTorch| = {(actual - expected).abs().max().item() / scale:.3g} "
                  f"(logits up to {scale:.3g}, file {os.path.getsize(weights) / 2**20:.0f} MiB)", flush=True)
            os.remove(weights)


if __name__ == "__main__":
    main()
