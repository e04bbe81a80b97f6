"""Which torch an attached trainer runs, and the paths of zeroshard.torch that depend on it: run
by `python -m zeroshard.launch --workers W` (attach_test; CI runs the suite under Debian's torch
1.13 and under the torch 2.x venv, $ZEROSHARD_TRAINER_PYTHON). Every rank trains a small model
for 2 steps in zero2 and ddp and prints one JSON line per mode: torch's version and location, the
interpreter, the gradient hook zt registered (register_post_accumulate_grad_hook on torch >= 2.1,
else the AccumulateGrad node's hook as DDP does), what .grad held after each backward (zero1 and
zero2: HandedOverGradients; ddp: values) and after opt.zero_grad() with torch's default
set_to_none: in zero1 and ddp what torch.optim.AdamW's zero_grad leaves on a twin model (torch
1.13: zeros, 2.x: None), in zero2 None (handed-over gradients go). Exits 1 when one differs.
"""

import json
import sys

import torch

import zeroshard.torch as zt

STEPS = 2


def build_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(step):
    generator = torch.Generator().manual_seed(100 * step + zt.rank())
    return torch.randn(4, 8, generator=generator), torch.randn(4, 4, generator=generator)


def grad_kinds(model):
    """What .grad holds per parameter: "none", "zeros", "handed_over" or "values"."""
    kinds = set()
    for p in model.parameters():
        if p.grad is None:
            kinds.add("none")
        elif isinstance(p.grad, zt.HandedOverGradient):
            kinds.add("handed_over")
        else:
            kinds.add("zeros" if not p.grad.any() else "values")
    return sorted(kinds)


def torch_zero_grad():
    """What torch.optim's zero_grad() (the installed torch's default set_to_none) leaves."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
    return grad_kinds(model)


def run(mode):
    model = build_model()
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-3, mode=mode)
    # The handles zt keeps per parameter: torch 1.13's path keeps the AccumulateGrad node too.
    hooks = {type(handle).__name__ for handles in optimizer._hooks.values() for handle in handles}
    after_backward, after_zero_grad = [], []
    for step in range(STEPS):
        x, y = batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        after_backward.append(grad_kinds(model))
        optimizer.step()
        optimizer.zero_grad()
        after_zero_grad.append(grad_kinds(model))
    zt.finish(optimizer)
    return {"gradient_hook": ("AccumulateGrad node" if "AccumulateGrad" in hooks
                              else "post_accumulate_grad_hook"),
            "after_backward": after_backward, "after_zero_grad": after_zero_grad}


def main():
    zt.init()
    torch_after_zero_grad = torch_zero_grad()
    hook = ("post_accumulate_grad_hook"
            if hasattr(torch.Tensor, "register_post_accumulate_grad_hook") else "AccumulateGrad node")
    failures = 0
    for mode in ("zero2", "zero1", "ddp"):
        result = run(mode)
        expected_after_backward = ["values"] if mode == "ddp" else ["handed_over"]
        expected_after_zero_grad = ["none"] if mode == "zero2" else torch_after_zero_grad
        ok = (result["gradient_hook"] == hook
              and all(kinds == expected_after_backward for kinds in result["after_backward"])
              and all(kinds == expected_after_zero_grad for kinds in result["after_zero_grad"]))
        failures += 0 if ok else 1
        print(json.dumps({"rank": zt.rank(), "world_size": zt.world_size(), "mode": mode,
                          "torch": torch.__version__, "torch_file": torch.__file__,
                          "prefix": sys.prefix, "executable": sys.executable,
                          "torch_after_zero_grad": torch_after_zero_grad, **result,
                          "ok": ok}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
