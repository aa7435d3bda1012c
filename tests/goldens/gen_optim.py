"""Goldens for engine/optim: torch.optim.SGD and AdamW steps, and the learning-rate schedules.

Optimizers: a parameter of 6 values takes 4 steps, each from a given gradient. For every
case the fixture holds the hyper-parameters ("<case>.lr", ...), the start "<case>.param0",
the gradients "<case>.grad<k>" and the parameter after each step "<case>.param<k>", k = 1..4.
The C++ test replays the same gradients through Sgd / AdamW and compares every step.

Schedules: "schedule.<name>.lr" is the rate at steps 0 .. total-1, with the schedule's
settings beside it. engine/optim's Schedule warms up linearly from base/warmup at step 0 to
base at step warmup-1, then follows the decay as if it had started at step warmup; torch
spells that as LinearLR(start_factor=1/warmup, total_iters=warmup-1) for the first steps and
CosineAnnealingLR / StepLR / a constant for the rest, each run as a scheduler of its own.

Run: /usr/bin/python3 tests/goldens/gen_optim.py
"""
import torch

from fixture_io import save, seeded

out = {}
STEPS = 4
g = seeded(20240615)
start = torch.rand(6, generator=g) * 2 - 1
grads = [torch.rand(6, generator=g) * 2 - 1 for _ in range(STEPS)]


def record(name, make_optimizer, hyper):
    """Runs STEPS steps of make_optimizer([p]) on the shared gradients and saves every state."""
    p = start.clone().requires_grad_()
    opt = make_optimizer([p])
    out[f"{name}.param0"] = start
    for k, grad in enumerate(grads, 1):
        p.grad = grad.clone()
        opt.step()
        out[f"{name}.grad{k}"] = grad
        out[f"{name}.param{k}"] = p.detach().clone()
    for key, value in hyper.items():
        out[f"{name}.{key}"] = torch.tensor([float(value)])


def sgd(name, lr, momentum, weight_decay, nesterov):
    hyper = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    record(f"sgd.{name}", lambda ps: torch.optim.SGD(ps, **hyper), hyper)


def adamw(name, lr, beta1, beta2, eps, weight_decay):
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
    record(f"adamw.{name}", lambda ps: torch.optim.AdamW(ps, lr=lr, betas=(beta1, beta2), eps=eps,
                                                         weight_decay=weight_decay), hyper)


# Settings chosen exactly representable in float32, so the fixture's copies equal torch's.
sgd("plain", 0.25, 0.0, 0.0, False)
sgd("momentum", 0.25, 0.75, 0.0, False)
sgd("decay", 0.25, 0.0, 0.5, False)
sgd("momentum_decay", 0.25, 0.75, 0.5, False)
sgd("nesterov", 0.25, 0.75, 0.5, True)
adamw("plain", 0.0625, 0.75, 0.875, 1.0 / 1024, 0.0)
adamw("decay", 0.0625, 0.75, 0.875, 1.0 / 1024, 0.5)
adamw("defaults", 0.001, 0.9, 0.999, 1e-8, 0.01)  # torch's defaults (the float32 copies are close)


def rates(scheduler_steps, optimizer, scheduler):
    """The rate before each of scheduler_steps steps: what an optimizer step would use."""
    values = []
    for _ in range(scheduler_steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def fresh(lr):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def schedule(name, kind, base_lr, warmup, total, min_factor=0.0, step_every=1, gamma=0.1):
    values = []
    if warmup > 0:
        opt = fresh(base_lr)
        # LinearLR's factor at step s: 1/w + (1 - 1/w)·s/(w-1) = (s+1)/w.
        sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0,
                                                  total_iters=max(warmup - 1, 1))
        values += rates(warmup, opt, sched)
    opt = fresh(base_lr)
    rest = total - warmup
    if kind == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=rest, eta_min=min_factor * base_lr)
    elif kind == "step":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=step_every, gamma=gamma)
    else:
        sched = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
    values += rates(rest, opt, sched)
    key = f"schedule.{name}"
    out[f"{key}.lr"] = torch.tensor(values, dtype=torch.float64)
    kinds = {"constant": 0, "cosine": 1, "step": 2}
    for field, value in dict(kind=kinds[kind], base_lr=base_lr, warmup=warmup, total=total, min_factor=min_factor,
                             step_every=step_every, gamma=gamma).items():
        out[f"{key}.{field}"] = torch.tensor([float(value)])


schedule("cosine", "cosine", 0.5, 0, 12)
schedule("cosine_warmup", "cosine", 0.5, 4, 16)
schedule("cosine_warmup_floor", "cosine", 0.5, 3, 15, min_factor=0.125)
schedule("step", "step", 0.5, 0, 12, step_every=4, gamma=0.25)
schedule("step_warmup", "step", 0.5, 3, 15, step_every=5, gamma=0.5)
schedule("constant", "constant", 0.5, 0, 6)
schedule("constant_warmup", "constant", 0.5, 5, 10)

save("optim", out)
