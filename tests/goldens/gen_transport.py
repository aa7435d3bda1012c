"""Goldens for the ops whose transports differ: activations, norms, attention, bilinear.

Writes tests/goldens/transport.safetensors. Each op gets its forward output and the
gradients (inputs and parameters) of <u, y> for a random cotangent u. Each pullback and
soft rule gets a reference built the PyTorch way: the same forward with the gate,
statistic or pattern detached, so that plain autograd yields the rule's cotangent.

Run: /usr/bin/python3 tests/goldens/gen_transport.py
"""
import math

import torch
import torch.nn.functional as F

from fixture_io import save, seeded

out = {}
gen = seeded(20240611)


def rand(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, generator=gen) * (hi - lo) + lo).requires_grad_()


def grads(y, u, *inputs):
    return torch.autograd.grad(y, inputs, u, retain_graph=True)


def Phi(z):
    return 0.5 * (1 + torch.erf(z / math.sqrt(2)))


# ---- activations: x away from the ReLU kink ------------------------------------------
x0 = torch.rand(3, 7, generator=gen) * 2.9 + 0.1
sign = torch.where(torch.rand(3, 7, generator=gen) < 0.5, -1.0, 1.0)
x = (x0 * sign).requires_grad_()
u = torch.randn(3, 7, generator=gen)
out["act.x"], out["act.u"] = x, u
forward = {"relu": torch.relu, "gelu": F.gelu, "silu": F.silu}
frozen_gate = {"relu": lambda z: (z > 0).float(), "gelu": Phi, "silu": torch.sigmoid}
soft_gate = {"relu": Phi, "gelu": Phi, "silu": torch.sigmoid}
default_tau = {"relu": 0.6, "gelu": 1.0, "silu": 1.6}
for name, f in forward.items():
    y = f(x)
    out[f"act.{name}.y"] = y
    (out[f"act.{name}.grad"],) = grads(y, u, x)
    # Surrogates z·g(z).detach(): autograd gives g(z)·u, the rule's cotangent.
    (out[f"act.{name}.pullback"],) = grads(x * frozen_gate[name](x).detach(), u, x)
    for label, tau in [("soft", default_tau[name]), ("soft_tau05", 0.5)]:
        (out[f"act.{name}.{label}"],) = grads(x * soft_gate[name](x / tau).detach(), u, x)

# ---- batch norm ------------------------------------------------------------------------
N, C = 4, 3
x = (torch.randn(N, C, 2, 3, generator=gen) * 1.5 + torch.tensor([0.5, -1.0, 2.0]).view(1, C, 1, 1)).requires_grad_()
w, b = rand(C, lo=0.5, hi=1.5), rand(C)
u = torch.randn(N, C, 2, 3, generator=gen)
rm0, rv0 = torch.randn(C, generator=gen) * 0.1, torch.rand(C, generator=gen) + 0.5
out.update({"bn.x": x, "bn.w": w, "bn.b": b, "bn.u": u, "bn.running_mean0": rm0, "bn.running_var0": rv0})
rm, rv = rm0.clone(), rv0.clone()
y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
out["bn.train.y"] = y
out["bn.train.grad_x"], out["bn.train.grad_w"], out["bn.train.grad_b"] = grads(y, u, x, w, b)
out["bn.train.running_mean"], out["bn.train.running_var"] = rm, rv
# Batch statistics detached: the pullback (and soft pullback) γ/σ·u.
mu = x.mean(dim=(0, 2, 3), keepdim=True)
sigma = torch.sqrt(x.var(dim=(0, 2, 3), unbiased=False, keepdim=True) + 1e-5)
y_frozen = (x - mu.detach()) / sigma.detach() * w.view(1, C, 1, 1) + b.view(1, C, 1, 1)
(out["bn.train.pullback_x"],) = grads(y_frozen, u, x)
y = F.batch_norm(x, rm0, rv0, w, b, training=False, eps=1e-5)
out["bn.eval.y"] = y
out["bn.eval.grad_x"], out["bn.eval.grad_w"], out["bn.eval.grad_b"] = grads(y, u, x, w, b)
# (N, C) input, no affine, no running statistics.
x2 = (torch.randn(5, C, generator=gen) * 2).requires_grad_()
u2 = torch.randn(5, C, generator=gen)
y2 = F.batch_norm(x2, None, None, None, None, training=True, eps=1e-5)
out.update({"bn2d.x": x2, "bn2d.u": u2, "bn2d.y": y2})
(out["bn2d.grad_x"],) = grads(y2, u2, x2)

# ---- layer norm ------------------------------------------------------------------------
x = (torch.randn(2, 3, 6, generator=gen) * 2 + 0.7).requires_grad_()
w, b = rand(6, lo=0.5, hi=1.5), rand(6)
u = torch.randn(2, 3, 6, generator=gen)
y = F.layer_norm(x, (6,), w, b, eps=1e-5)
out.update({"ln.x": x, "ln.w": w, "ln.b": b, "ln.u": u, "ln.y": y})
out["ln.grad_x"], out["ln.grad_w"], out["ln.grad_b"] = grads(y, u, x, w, b)
mu = x.mean(dim=-1, keepdim=True)
sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + 1e-5)
(out["ln.pullback_x"],) = grads((x - mu.detach()) / sigma.detach() * w + b, u, x)
# Two normalised dims.
x = (torch.randn(2, 3, 4, generator=gen) + 0.3).requires_grad_()
w, b = rand(3, 4, lo=0.5, hi=1.5), rand(3, 4)
u = torch.randn(2, 3, 4, generator=gen)
y = F.layer_norm(x, (3, 4), w, b, eps=1e-5)
out.update({"ln2.x": x, "ln2.w": w, "ln2.b": b, "ln2.u": u, "ln2.y": y})
out["ln2.grad_x"], out["ln2.grad_w"], out["ln2.grad_b"] = grads(y, u, x, w, b)


# ---- attention -------------------------------------------------------------------------
def attention_pattern(q, k, scale, causal, tau=1.0):
    scores = q @ k.transpose(-1, -2) * scale / tau
    if causal:  # key j hidden from query i when j > i (top-left aligned)
        T, S = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(scores, dim=-1)


for label, (T, S, d, dv), causal, scale in [
    ("attn", (4, 5, 3, 2), False, 1 / math.sqrt(3)),
    ("attn_causal", (4, 4, 3, 2), True, 1 / math.sqrt(3)),
    ("attn_causal_rect", (3, 5, 3, 2), True, 0.7),
]:
    q, k, v = rand(2, 2, T, d, lo=-2, hi=2), rand(2, 2, S, d, lo=-2, hi=2), rand(2, 2, S, dv)
    u = torch.randn(2, 2, T, dv, generator=gen)
    y = attention_pattern(q, k, scale, causal) @ v
    out.update({f"{label}.q": q, f"{label}.k": k, f"{label}.v": v, f"{label}.u": u, f"{label}.y": y})
    out[f"{label}.grad_q"], out[f"{label}.grad_k"], out[f"{label}.grad_v"] = grads(y, u, q, k, v)
    (out[f"{label}.pullback_v"],) = grads(attention_pattern(q, k, scale, causal).detach() @ v, u, v)
    (out[f"{label}.soft_tau05_v"],) = grads(attention_pattern(q, k, scale, causal, tau=0.5).detach() @ v, u, v)
    out[f"{label}.scale"] = torch.tensor([scale])

# ---- bilinear --------------------------------------------------------------------------
x = rand(2, 3, 4)
L, R = rand(5, 5), rand(5, 5)
u = torch.randn(2, 3, 5, generator=gen)
xt = torch.cat([torch.ones(2, 3, 1), x], dim=-1)
lx, rx = xt @ L.T, xt @ R.T
y = lx * rx
out.update({"bil.x": x, "bil.L": L, "bil.R": R, "bil.u": u, "bil.y": y})
out["bil.grad_x"], out["bil.grad_L"], out["bil.grad_R"] = grads(y, u, x, L, R)
# ½J(x̃)x̃ with one factor frozen in each half: autograd gives half the gradient for x.
(out["bil.pullback_x"],) = grads(0.5 * (lx * rx.detach() + lx.detach() * rx), u, x)

save("transport", out)
