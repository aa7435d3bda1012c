"""Infidelity (docs/methods.md §1.4) recomputed by hand, apart from the engine's metric code:
perturbations drawn here with numpy (a square patch of side 14 or 7, half each, at a uniform
position, replaced by uniform noise over the input range), the model's logits from
`adjoint predict`, and the score E[(βa − b)²] at β = E[ab]/E[a²] with a = ⟨attr, x − x_pert⟩,
b = f_c(x) − f_c(x_pert). The maps, inputs and targets are those an `adjoint explain` run wrote
(attributions_<method>.safetensors). Prints each image's score per method and the ratio of
the gradient's to pullback ascent's, to set beside that run's metrics.csv.

Run after `adjoint explain --checkpoint CK --count 4 --methods gradient,pullback_ascent
--metrics infidelity --perturbations 2000 --examples 0 --out DIR` (its "input range" line
gives LO,HI):
  /usr/bin/python3 analysis/results/reproduce/check_infidelity_by_hand.py \
      build/tools/adjoint CK DIR LO,HI [PERTURBATIONS]
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, v in head.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
    return out


def write(path, name, t):
    t = np.ascontiguousarray(t, dtype=np.float32)
    raw = t.tobytes()
    head = json.dumps({name: {"dtype": "F32", "shape": list(t.shape), "data_offsets": [0, len(raw)]}}).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + raw)


def main():
    adjoint, checkpoint, folder, bounds = sys.argv[1:5]
    samples = int(sys.argv[5]) if len(sys.argv) > 5 else 2000
    lo, hi = (float(v) for v in bounds.split(","))
    work = tempfile.mkdtemp()

    def logits(x):
        write(os.path.join(work, "in.safetensors"), "x", x)
        subprocess.run([adjoint, "--threads", "2", "predict", "--checkpoint", checkpoint, "--input",
                        os.path.join(work, "in.safetensors"), "--out", os.path.join(work, "out")],
                       check=True, capture_output=True)
        return read(os.path.join(work, "out.safetensors"))["logits"]

    maps = {m: read(os.path.join(folder, f"attributions_{m}.safetensors")) for m in ("gradient", "pullback_ascent")}
    x, targets = maps["gradient"]["inputs"], maps["gradient"]["targets"].astype(int)
    n, channels, height, width = x.shape
    rng = np.random.default_rng(123)
    f0 = logits(x)
    scores = {m: [] for m in maps}
    for i in range(n):
        pert = np.repeat(x[i:i + 1], samples, axis=0).copy()
        for k in range(samples):
            side = 14 if k < samples // 2 else 7
            top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
            pert[k, :, top:top + side, left:left + side] = rng.uniform(lo, hi, size=(channels, side, side))
        b = f0[i, targets[i]] - logits(pert)[:, targets[i]]
        perturbation = (x[i:i + 1] - pert).reshape(samples, -1).astype(np.float64)
        for m, tensors in maps.items():
            a = perturbation @ tensors["attributions"][i].reshape(-1).astype(np.float64)
            beta = (a @ b) / (a @ a)
            scores[m].append(float(np.mean((beta * a - b) ** 2)))
    for m, v in scores.items():
        print(m, "per image", np.round(v, 3), "mean", round(float(np.mean(v)), 3))
    ratio = np.array(scores["gradient"]) / np.array(scores["pullback_ascent"])
    print("gradient / pullback_ascent per image", np.round(ratio, 3))


if __name__ == "__main__":
    main()
