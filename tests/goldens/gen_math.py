"""Golden fixture for the tensor-math ops: elementwise, reduce, layout, softmax, loss, embedding.

Writes tests/goldens/math.safetensors. For each case "<case>" it stores the inputs
("<case>.x", or "<case>.a"/"<case>.b", ...), a cotangent "<case>.u", the forward output
"<case>.y" and the input cotangents "<case>.g<input>" = (∂y/∂input)ᵀu. Inputs are drawn in
float32 and evaluated in float64, so the references are exact to float32 rounding.
Integer inputs (labels, indices) are stored as float32 (small integers are exact).

Run: /usr/bin/python3 tests/goldens/gen_math.py
"""
import torch
import torch.nn.functional as F

from fixture_io import save, seeded

gen = seeded(20240607)
out = {}


def rand(*shape, lo=-1.0, hi=1.0):
    return (torch.rand(tuple(shape), generator=gen) * (hi - lo) + lo).to(torch.float32)


def case(name, fn, inputs, grad=True):
    """Evaluates fn on float64 copies of `inputs` (a dict) and records y and the VJPs."""
    leaves = {k: v.double().requires_grad_(grad) for k, v in inputs.items()}
    y = fn(**leaves)
    for k, v in inputs.items():
        out[f"{name}.{k}"] = v
    out[f"{name}.y"] = y.detach()
    if grad:
        u = rand(*y.shape)
        out[f"{name}.u"] = u
        grads = torch.autograd.grad(y, list(leaves.values()), u.double())
        for k, g in zip(leaves, grads):
            out[f"{name}.g{k}"] = g


# ---- elementwise -------------------------------------------------------------------
a, b = rand(3, 4), rand(3, 4)
b_away = torch.where(b.abs() < 0.2, torch.sign(b) * 0.2 + b, b)  # divisors away from 0
case("add", lambda a, b: a + b, {"a": a, "b": b})
case("sub", lambda a, b: a - b, {"a": a, "b": b})
case("mul", lambda a, b: a * b, {"a": a, "b": b})
case("div", lambda a, b: a / b, {"a": a, "b": b_away})

x = rand(3, 4)
positive = rand(3, 4, lo=0.2, hi=2.0)
x_away = torch.where(x.abs() < 0.1, torch.sign(x) * 0.1 + x, x)  # away from the kink of abs
case("neg", lambda x: -x, {"x": x})
case("exp", torch.exp, {"x": x})
case("log", torch.log, {"x": positive})
case("sqrt", torch.sqrt, {"x": positive})
case("abs", torch.abs, {"x": x_away})
case("sigmoid", torch.sigmoid, {"x": rand(3, 4, lo=-4, hi=4)})
case("tanh", torch.tanh, {"x": rand(3, 4, lo=-2, hi=2)})
case("pow", lambda x: torch.pow(x, 2.5), {"x": positive})
case("pow_int", lambda x: torch.pow(x, 3.0), {"x": x})
case("clamp", lambda x: torch.clamp(x, -0.5, 0.5), {"x": x_away})
case("add_scalar", lambda x: x + 0.7, {"x": x})
case("mul_scalar", lambda x: x * -1.3, {"x": x})
case("rsub_scalar", lambda x: 2.0 - x, {"x": x})
case("div_scalar", lambda x: x / 3.0, {"x": x})
case("scalar_div", lambda x: 2.0 / x, {"x": positive})

# ---- reduce ------------------------------------------------------------------------
x3 = rand(2, 3, 4)
case("sum_all", lambda x: x.sum(), {"x": x3})
case("sum_last", lambda x: x.sum(dim=2), {"x": x3})
case("sum_lead", lambda x: x.sum(dim=(0, 1)), {"x": x3})
case("sum_mid_keep", lambda x: x.sum(dim=1, keepdim=True), {"x": x3})
case("sum_split_keep", lambda x: x.sum(dim=(0, 2), keepdim=True), {"x": x3})
case("mean_all", lambda x: x.mean(), {"x": x3})
case("mean_split", lambda x: x.mean(dim=(0, 2)), {"x": x3})
case("mean_last_keep", lambda x: x.mean(dim=-1, keepdim=True), {"x": x3})
case("max_mid", lambda x: x.max(dim=1).values, {"x": x3})
case("max_split_keep", lambda x: x.amax(dim=(0, 2), keepdim=True), {"x": x3})
case("max_all", lambda x: x.max(), {"x": x3})
case("var_last", lambda x: x.var(dim=2), {"x": x3})
case("var_split_biased_keep", lambda x: x.var(dim=(0, 2), unbiased=False, keepdim=True), {"x": x3})
case("var_all", lambda x: x.var(), {"x": x3})


def soft_max_reference(name, x, dims, keepdim, tau=0.3):
    """The SoftPullback of max: u spread with fixed weights softmax(x/τ) over `dims`."""
    xd = x.double()
    y = xd.amax(dim=dims, keepdim=keepdim)
    u = rand(*y.shape)
    shifted = (xd - xd.amax(dim=dims, keepdim=True)) / tau
    w = torch.exp(shifted) / torch.exp(shifted).sum(dim=dims, keepdim=True)
    uk = u.double() if keepdim else u.double().reshape(xd.amax(dim=dims, keepdim=True).shape)
    out[f"{name}.x"] = x
    out[f"{name}.u"] = u
    out[f"{name}.gx"] = uk * w


soft_max_reference("soft_max_mid", x3, (1,), False)
soft_max_reference("soft_max_split_keep", x3, (0, 2), True)

# ---- layout ------------------------------------------------------------------------
case("reshape", lambda x: x.reshape(4, -1), {"x": x3})
case("flatten", lambda x: torch.flatten(x, 1), {"x": x3})
case("permute", lambda x: x.permute(2, 0, 1), {"x": x3})
case("transpose", lambda x: x.transpose(0, 2), {"x": x3})
case("slice_step", lambda x: x[:, :, 1::2], {"x": x3})
case("slice_negative", lambda x: x[:, -2:], {"x": x3})
case("concat", lambda a, b, c: torch.cat([a, b, c], dim=1),
     {"a": rand(2, 1, 4), "b": rand(2, 3, 4), "c": rand(2, 2, 4)})
# F.pad lists the last axis first; the engine's pad lists every axis in order:
# pad(x, {{0, 0}, {1, 2}, {2, 1}}, 0.5).
case("pad", lambda x: F.pad(x, (2, 1, 1, 2), value=0.5), {"x": x3})
case("broadcast_to", lambda x: x.expand(2, 3, 4), {"x": rand(3, 1)})
case("sum_to", lambda x: x.sum_to_size(3, 1), {"x": x3})
case("unsqueeze", lambda x: x.unsqueeze(1), {"x": x3})
case("squeeze", lambda x: x.squeeze(1), {"x": rand(2, 1, 4)})

# ---- softmax -----------------------------------------------------------------------
xs = rand(2, 3, 5, lo=-3, hi=3)
case("softmax_last", lambda x: torch.softmax(x, dim=-1), {"x": xs})
case("softmax_mid", lambda x: torch.softmax(x, dim=1), {"x": xs})
case("log_softmax_last", lambda x: torch.log_softmax(x, dim=-1), {"x": xs})
case("log_softmax_first", lambda x: torch.log_softmax(x, dim=0), {"x": xs})

# ---- loss --------------------------------------------------------------------------
logits = rand(5, 7, lo=-3, hi=3)
labels = torch.tensor([3, 0, 6, 3, 1])
out["cross_entropy.labels"] = labels.to(torch.float32)
case("cross_entropy", lambda logits: F.cross_entropy(logits, labels), {"logits": logits})
case("cross_entropy_smooth",
     lambda logits: F.cross_entropy(logits, labels, label_smoothing=0.1), {"logits": logits})
case("mse_loss", lambda a, b: F.mse_loss(a, b), {"a": rand(3, 4), "b": rand(3, 4)})

# ---- embedding ---------------------------------------------------------------------
indices = torch.tensor([[4, 0, 4], [2, 5, 4]])  # 4 repeats: its gradient rows add up
out["embedding.indices"] = indices.to(torch.float32)
case("embedding", lambda weight: F.embedding(indices, weight), {"weight": rand(6, 4)})

save("math", out)
