"""Writes golden fixtures as .safetensors without the safetensors package.

Each gen_<family>.py builds a dict of named float32 tensors with PyTorch and calls
save(); the C++ suite reads tests/goldens/<family>.safetensors and needs no Python.
Run with Debian's interpreter: /usr/bin/python3 tests/goldens/gen_<family>.py
"""
import json
import os
import struct

import torch


def save(name, tensors, metadata=None):
    """Writes tests/goldens/<name>.safetensors (float32, row-major, sorted by name)."""
    header, blobs, offset = {}, [], 0
    for key in sorted(tensors):
        t = tensors[key].detach().to(torch.float32).contiguous().cpu()
        raw = t.numpy().tobytes()
        header[key] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)
    print(f"wrote {path} ({len(tensors)} tensors, {offset} bytes)")


def seeded(seed):
    """A torch generator; every fixture draws its inputs from a fixed seed."""
    return torch.Generator().manual_seed(seed)
