"""The tensor-similarity paper's LM fixture as its checkpoints are shipped: a state dict saved by
torch.save (PyTorch's zip format), holding the tensors of tests/goldens/paper_lm.safetensors
(written by gen_paper_lm.py; read back here without the safetensors package).

Writes tests/goldens/paper_lm.pt. Run: /usr/bin/python3 tests/goldens/gen_paper_lm_pt.py
"""
import json
import os
import struct

import torch

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "paper_lm.safetensors"), "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
    data = f.read()
state = {}
for name, entry in header.items():
    if name == "__metadata__":
        continue
    assert entry["dtype"] == "F32", name
    begin, end = entry["data_offsets"]
    values = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
    state[name] = values.reshape(entry["shape"]).clone()
path = os.path.join(here, "paper_lm.pt")
torch.save(state, path + ".tmp")
os.replace(path + ".tmp", path)
print(f"wrote {path} ({len(state)} tensors)")
