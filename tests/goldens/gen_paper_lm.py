"""Golden fixture for the tensor-similarity paper's bilinear-attention LMs (models/paper_lm.h).

Writes tests/goldens/paper_lm.safetensors: random weights in the layout of the paper's
checkpoints (src/models/checkpoint_transformer.py: embed.weight as vocab × d, layers.{i}.{q1,k1,
q2,k2}.{weight,bias}, layers.{i}.{v,o}.weight, unembed.weight, final_norm.running_mean_energy),
2 attention-only layers; and tests/goldens/paper_lm_logits.safetensors: token ids ("tokens",
as floats) and the logits ("logits") of a PyTorch forward of that architecture written here
from the paper's src/components/attention.py: q and k with biases and rotary positions per head
(rotate-half, base 10000), scores (q1·k1)(q2·k2)/d_head² under a causal mask, an additive
residual x + 0.35·o(z), and the final norm applied as the scale 1/sqrt(energy + 1e-6) before
the unembedding (not folded into it, as the C++ reader does). Evaluated in float64.

Run: /usr/bin/python3 tests/goldens/gen_paper_lm.py
"""
import torch

from fixture_io import save, seeded

VOCAB, D, HEADS, LAYERS, T, BATCH, SCALE = 11, 8, 2, 2, 5, 3, 0.35
gen = seeded(20261204)


def rand(*shape, std=0.5):
    return (torch.randn(tuple(shape), generator=gen) * std).to(torch.float32)


state = {"embed.weight": rand(VOCAB, D), "unembed.weight": rand(VOCAB, D),
         "final_norm.running_mean_energy": torch.tensor([2.5], dtype=torch.float32)}
for i in range(LAYERS):
    for part in ("q1", "k1", "q2", "k2"):
        state[f"layers.{i}.{part}.weight"] = rand(D, D)
        state[f"layers.{i}.{part}.bias"] = rand(D, std=0.3)
    state[f"layers.{i}.v.weight"] = rand(D, D)
    state[f"layers.{i}.o.weight"] = rand(D, D)


def rotary(x):
    """x (batch, seq, heads, d_head): the pairs (j, j + d/2) turned by position·base^(−2j/d)."""
    dh = x.shape[-1]
    freq = 1.0 / (10000 ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))
    angles = torch.einsum("i,j->ij", torch.arange(x.shape[1], dtype=torch.float64), freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[None, :, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[None, :, None, :]
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


def forward(tokens):
    w = {k: v.double() for k, v in state.items()}
    x = w["embed.weight"][tokens]  # (batch, seq, d)
    batch, seq, dh = x.shape[0], x.shape[1], D // HEADS
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.float64))
    for i in range(LAYERS):
        def part(name, bias=True):
            y = x @ w[f"layers.{i}.{name}.weight"].T
            if bias:
                y = y + w[f"layers.{i}.{name}.bias"]
            return y.reshape(batch, seq, HEADS, dh)
        q1, k1, q2, k2 = (rotary(part(n)) for n in ("q1", "k1", "q2", "k2"))
        v = part("v", bias=False)
        s1 = torch.einsum("bqhd,bkhd->bhqk", q1, k1)
        s2 = torch.einsum("bqhd,bkhd->bhqk", q2, k2)
        pattern = s1 * s2 / dh ** 2 * mask
        z = torch.einsum("bhqk,bkhd->bqhd", pattern, v).reshape(batch, seq, D)
        x = x + SCALE * (z @ w[f"layers.{i}.o.weight"].T)
    x = x * (w["final_norm.running_mean_energy"] + 1e-6).rsqrt()
    return x @ w["unembed.weight"].T


tokens = torch.randint(0, VOCAB, (BATCH, T), generator=gen)
save("paper_lm", state, {"heads": HEADS, "attn_scale": SCALE})
save("paper_lm_logits", {"tokens": tokens.to(torch.float32), "logits": forward(tokens)})
