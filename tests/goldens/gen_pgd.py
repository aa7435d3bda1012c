"""Golden PGD adversarial examples (analysis/common/robustness.h) on the tiny end model "B" of
gen_stitch.py (VGG-11-BN at width 1/32 on 1x16x16 inputs, normalised by (0.5, 0.25)).

From the clean images (no random start) a few steps of each norm, written out with the
formulas of analysis/common/robustness.cpp and analysis/common/input_search.cpp:
  linf  x <- x + a*sign(g); x <- c + clamp(x - c, -eps, eps); x <- clamp(x, 0, 1)
  l2    x <- x + (a/||g||)*g per example; d = x - c scaled to ||d|| = eps when longer;
        x <- clamp(x, 0, 1)
with g the gradient of the summed cross-entropy with respect to the raw pixels and
a = 2.5*eps/steps. Under linf, a pixel whose gradient is ever nonzero but tiny may take
the other sign in adjoint's float sums: those are marked (linf.undecided) and the test
compares the others exactly.
Run: /usr/bin/python3 tests/goldens/gen_pgd.py
"""
import torch
import torch.nn.functional as F

from fixture_io import save, seeded
from gen_stitch import B_NORM, randomised

STEPS = 3
SETTINGS = {"linf": 0.03, "l2": 0.5}


def logits_of(model, raw):
    return model((raw - B_NORM[0]) / B_NORM[1])


def forward(model):
    blocks = model.blocks()

    def run(h):
        for b in blocks:
            h = b(h)
        return h

    return run


def pgd(run, clean, labels, norm, eps):
    step = 2.5 * eps / STEPS
    x = clean.clone()
    # Pixels whose gradient is, at some step, nonzero but below 1e-4 of the example's
    # largest: float rounding may flip their sign (torch and adjoint add in other orders).
    undecided = torch.zeros_like(clean, dtype=torch.bool)
    for _ in range(STEPS):
        x.requires_grad_(True)
        loss = F.cross_entropy(run((x - B_NORM[0]) / B_NORM[1]), labels, reduction="sum")
        (g,) = torch.autograd.grad(loss, [x])
        x = x.detach()
        scale = g.abs().flatten(1).max(dim=1).values.view(-1, 1, 1, 1)
        undecided |= (g != 0) & (g.abs() < 1e-4 * scale)
        if norm == "linf":
            x = x + step * torch.sign(g)
            x = clean + (x - clean).clamp(-eps, eps)
        else:
            n = g.double().flatten(1).norm(dim=1)
            scale = torch.where(n > 0, step / n, torch.zeros_like(n)).float()
            x = x + scale.view(-1, 1, 1, 1) * g
            d = x - clean
            dn = d.double().flatten(1).norm(dim=1)
            shrink = torch.where(dn > eps, eps / dn, torch.ones_like(dn)).float()
            x = torch.where((dn > eps).view(-1, 1, 1, 1), clean + shrink.view(-1, 1, 1, 1) * d, x)
        x = x.clamp(0, 1)
    return x, undecided


def main():
    g = seeded(29)
    model = randomised(2)
    run = forward(model)
    x = torch.rand(4, 1, 16, 16, generator=g)
    labels = torch.tensor([1, 4, 4, 9])
    t = {"x": x, "labels": labels.float()}
    with torch.no_grad():
        t["clean_loss"] = F.cross_entropy(run((x - B_NORM[0]) / B_NORM[1]), labels, reduction="none")
    for norm, eps in SETTINGS.items():
        adv, undecided = pgd(run, x, labels, norm, eps)
        print(f"{norm}: {int(undecided.sum())} of {undecided.numel()} pixels with a near-zero gradient at some step")
        if norm == "linf":
            t["linf.undecided"] = undecided.float()
        t[norm + ".adversarial"] = adv
        t[norm + ".eps"] = torch.tensor([eps])
        with torch.no_grad():
            t[norm + ".loss"] = F.cross_entropy(run((adv - B_NORM[0]) / B_NORM[1]), labels, reduction="none")
    save("pgd", t, {"steps": STEPS})


if __name__ == "__main__":
    main()
