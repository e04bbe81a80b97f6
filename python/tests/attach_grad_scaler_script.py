"""torch's GradScaler with zt.ShardedOptimizer (issue 37, row 9), run by `python3 -m
zeroshard.launch --workers W` under torch 2.x (torch.amp.GradScaler("cpu"); torch 1.13's
torch.cuda.amp.GradScaler is disabled without CUDA, a pass-through: the script then says so and
checks only that). nanoGPT's loop: scaler.scale(loss).backward(), scaler.unscale_(opt),
clip_grad_norm_, scaler.step(opt), scaler.update(), opt.zero_grad(); step INF_STEP's loss is
multiplied by 1e38, so that its gradients overflow: GradScaler skips that step and backs off.
Against torch.optim.SGD (momentum, weight decay) with its own GradScaler in the same process over
the global batch, for zero1, zero2 (opt.clip_grad_norm_ after unscale_; then the constructor's
clip_grad_norm) and ddp (torch's clip_grad_norm_ on the averaged .grad), and the loop without
clipping (no unscale_: scaler.step() unscales) in every mode: every step's parameters, the scale, the skipped steps and the clipping norms. One JSON line per case; exit 1
when one fails.
"""

import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import zeroshard.torch as zt

STEPS = 8
INF_STEP = 3
CLIP = 0.5
BATCH = 8  # global
TOLERANCE = 1e-6
CASES = [("zero2", "opt.clip_grad_norm_"), ("zero1", "opt.clip_grad_norm_"),
         ("zero2", "constructor"), ("zero2", "none"), ("zero1", "none"), ("ddp", "torch"),
         ("ddp", "none")]


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4))


def batch(step):
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 16, generator=generator), torch.randint(4, (BATCH,),
                                                                        generator=generator)


def make_scaler():
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=3)
    return None


def train(model, optimizer, clip, rows, scaler, explicit_unscale=True):
    """Returns per step: (parameters, the scale after update(), the clip norm). Without
    explicit_unscale, scaler.step() unscales (the loop without clipping)."""
    records = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x[rows]), y[rows])
        if step == INF_STEP:
            loss = loss * 1e38  # its scaled gradients overflow float32
        scaler.scale(loss).backward()
        if explicit_unscale:
            scaler.unscale_(optimizer)
        norm = clip()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        records.append(([p.detach().clone() for p in model.parameters()], scaler.get_scale(),
                        None if norm is None else float(norm)))
    return records


def compare(got, expected):
    worst = 0.0
    for (params, scale, norm), (ref_params, ref_scale, ref_norm) in zip(got, expected):
        if scale != ref_scale:
            return float("inf"), f"scale {scale} != torch's {ref_scale}"
        for p, r in zip(params, ref_params):
            worst = max(worst, (p - r).abs().max().item() / max(r.abs().max().item(), 1e-12))
        if norm is None:  # the constructor's clip_grad_norm: no norm returned
            continue
        if math_isfinite(ref_norm):
            worst = max(worst, abs(norm - ref_norm) / ref_norm)
        elif math_isfinite(norm):
            return float("inf"), f"norm {norm} where torch's is {ref_norm}"
    return worst, None


def math_isfinite(value):
    return value == value and abs(value) != float("inf")


def main():
    zt.init()
    rank, world = zt.rank(), zt.world_size()
    if make_scaler() is None:
        if rank == 0:
            print(json.dumps({"case": "no_cpu_grad_scaler", "torch": torch.__version__,
                              "ok": True}))
        return 0
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    hyper = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}
    model = build()
    reference = torch.optim.SGD(model.parameters(), **hyper)
    expected = train(model, reference, lambda: torch.nn.utils.clip_grad_norm_(
        model.parameters(), CLIP), slice(0, BATCH), make_scaler())
    model = build()
    reference = torch.optim.SGD(model.parameters(), **hyper)
    unclipped = train(model, reference, lambda: None, slice(0, BATCH), make_scaler(),
                      explicit_unscale=False)
    failed = False
    for mode, clipping in CASES:
        model = build()
        options = {"clip_grad_norm": CLIP} if clipping == "constructor" else {}
        optimizer = zt.ShardedOptimizer(model, "sgd", mode=mode, **hyper, **options)
        if clipping == "opt.clip_grad_norm_":
            clip = lambda: optimizer.clip_grad_norm_(CLIP)  # noqa: E731
        elif clipping == "torch":
            clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # noqa
        else:
            clip = lambda: None  # noqa: E731
        plain = clipping == "none"  # no clipping, no unscale_: scaler.step() unscales
        got = train(model, optimizer, clip, rows, make_scaler(), explicit_unscale=not plain)
        worst, error = compare(got, unclipped if plain else expected)
        zt.finish(optimizer)
        ok = error is None and worst <= TOLERANCE
        failed |= not ok
        if rank == 0:
            print(json.dumps({"case": f"{mode}/{clipping}", "world_size": world,
                              "worst_relative": worst, "error": error,
                              "scales": [record[1] for record in got], "ok": ok}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
