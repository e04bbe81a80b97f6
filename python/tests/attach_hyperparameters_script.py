"""torch.optim's hyperparameter contract (issue 26, item 1), run by `python3 -m zeroshard.launch
--workers W` (W = 1, 2): every rank trains the same seeded MLP with zt.ShardedOptimizer and, in
the same process, a plain copy of it with torch.optim's optimizer of the same kind on the batch
of every rank (the mean over ranks of the ranks' mean losses: what the workers reduce). The
scripts change hyperparameters as ordinary scripts do: weight_decay and betas of one group
mid-run, OneCycleLR cycling lr and betas, SGD's momentum and dampening, one group's lr on its
own (no ratio to the others). Each case runs in zero1, zero2 and ddp; after the steps every
parameter must agree with torch's within 1e-6 of its tensor's largest value. Before issue 26 only
lr reached the workers (and only at its construction-time ratio across groups), OneCycleLR raised
ValueError (no betas in defaults), and a group's own lr change raised. Changes the job cannot take
(momentum to 0, amsgrad) raise ValueError naming the group and the key. Rank 0 prints one JSON
line per case; the script exits 1 when one fails.
"""

import json
import sys

import torch

import zeroshard.torch as zt

STEPS = 12
BATCH = 8
TOLERANCE = 1e-6
MODES = ("zero1", "zero2", "ddp")


def build_model():
    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))


def batch(step, rank):
    generator = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(BATCH, 12, generator=generator), torch.randn(BATCH, 3, generator=generator)


def groups_of(model, decay):
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    return [{"params": weights, "weight_decay": decay}, {"params": biases, "weight_decay": 0.0}]


def edit_decay_and_betas(optimizer, scheduler, step):
    if step == 4:
        optimizer.param_groups[0]["weight_decay"] = 0.3
        optimizer.param_groups[1]["betas"] = (0.7, 0.95)
    if step == 8:
        optimizer.param_groups[0]["betas"] = (0.85, 0.98)
        optimizer.param_groups[0]["eps"] = 1e-5


def edit_one_group_lr(optimizer, scheduler, step):
    if step == 3:
        optimizer.param_groups[1]["lr"] = 0.02  # group 0 keeps its own


def edit_sgd_momentum(optimizer, scheduler, step):
    if step == 5:
        optimizer.param_groups[0]["momentum"] = 0.5
        optimizer.param_groups[1]["dampening"] = 0.3


def one_cycle(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=STEPS)


CASES = [
    ("adamw_decay_and_betas", "adamw", torch.optim.AdamW, {"lr": 3e-3}, edit_decay_and_betas, None),
    ("adam_one_group_lr", "adam", torch.optim.Adam, {"lr": 3e-3}, edit_one_group_lr, None),
    ("adamw_one_cycle_lr", "adamw", torch.optim.AdamW, {"lr": 1e-3}, None, one_cycle),
    ("sgd_momentum_dampening", "sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9},
     edit_sgd_momentum, None),
]


def run(model, optimizer, scheduler, edit, rank, world):
    for step in range(STEPS):
        if edit is not None:
            edit(optimizer, scheduler, step)
        if rank is None:  # torch: every rank's batch, weighted as the workers average them
            loss = sum(torch.nn.functional.mse_loss(model(x), y)
                       for x, y in (batch(step, r) for r in range(world))) / world
        else:
            x, y = batch(step, rank)
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def worst_relative(ours, theirs):
    worst = 0.0
    for name, expected in theirs.items():
        scale = max(expected.abs().max().item(), 1e-12)
        worst = max(worst, (ours[name] - expected).abs().max().item() / scale)
    return worst


def check_case(case, kind, torch_class, hyper, edit, make_scheduler, mode):
    rank, world = zt.rank(), zt.world_size()
    reference_model = build_model()
    reference = torch_class(groups_of(reference_model, 0.05), **hyper)
    expected = run(reference_model, reference,
                   make_scheduler(reference) if make_scheduler else None, edit, None, world)
    model = build_model()
    optimizer = zt.ShardedOptimizer(model, kind, mode=mode,
                                    param_groups=groups_of(model, 0.05)[1:], weight_decay=0.05,
                                    **hyper)
    try:
        got = run(model, optimizer, make_scheduler(optimizer) if make_scheduler else None, edit,
                  rank, world)
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    return {"case": case, "mode": mode, "world_size": world, "worst_relative": worst,
            "ok": worst <= TOLERANCE}


def check_refusals():
    """Changes the job cannot take raise ValueError naming the group and key, before anything
    reaches the workers; the optimizer goes on."""
    results = []
    for kind, hyper, key, value, expected in [
            ("sgd", {"lr": 0.05, "momentum": 0.9}, "momentum", 0.0,
             "param_groups[0]: momentum 0.0: the job's optimizer state was made with a momentum"),
            ("adamw", {"lr": 1e-3}, "amsgrad", True, "param_groups[0]: amsgrad True differs"),
            ("adamw", {"lr": 1e-3}, "betas", (1.0, 0.9), "param_groups[0]: betas[0] 1.0 must be")]:
        model = build_model()
        optimizer = zt.ShardedOptimizer(model, kind, mode="zero2", **hyper)
        try:
            x, y = batch(0, zt.rank())
            torch.nn.functional.mse_loss(model(x), y).backward()
            kept = optimizer.param_groups[0][key]
            optimizer.param_groups[0][key] = value
            try:
                optimizer.step()
                message = None
            except ValueError as e:
                message = str(e)
            optimizer.param_groups[0][key] = kept
            optimizer.step()  # the step goes on once the value is back
            went_on = optimizer.last_step.optimizer_step == 1
        finally:
            zt.finish(optimizer)
        results.append({"case": f"refuses_{kind}_{key}", "ok": message is not None and
                        expected in message and went_on, "message": message})
    return results


class Many(torch.nn.Module):
    """`count` small parameters: a model with as many tensors as a large transformer."""

    def __init__(self, count, size):
        super().__init__()
        torch.manual_seed(count)
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(size)) for _ in range(count)])

    def forward(self, x):
        return sum((p * x[i % x.shape[0]]).sum() for i, p in enumerate(self.params))


def check_groups_by_identity(case, count, size, groups_of_model, kind, torch_class, hyper, mode):
    """Groups go to the job as tensor index lists (issue 26, item 2): a group per tensor, or one
    group of every tensor, costs nothing and trains as torch.optim does. Before, each tensor was
    one fnmatch pattern (at most 64 per group, 64 groups): SubmitJob refused both."""
    rank, world = zt.rank(), zt.world_size()

    def steps(model, optimizer, per_rank):
        for step in range(3):
            ranks = [rank] if per_rank else range(world)
            loss = sum(model(torch.randn(size, generator=torch.Generator().manual_seed(
                100 * step + r))).pow(2) for r in ranks) / len(ranks)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    reference_model = Many(count, size)
    expected = steps(reference_model, torch_class(groups_of_model(reference_model), **hyper),
                     per_rank=False)
    model = Many(count, size)
    optimizer = zt.ShardedOptimizer(model, kind, mode=mode, param_groups=groups_of_model(model),
                                    **hyper)
    try:
        got = steps(model, optimizer, per_rank=True)
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    return {"case": case, "mode": mode, "world_size": world, "tensors": count,
            "groups": len(groups_of_model(model)), "worst_relative": worst,
            "ok": worst <= TOLERANCE}


def a_group_per_tensor(model):
    return [{"params": [p], "lr": 1e-3 * (1 + i % 7), "weight_decay": 0.01 * (i % 3)}
            for i, p in enumerate(model.params)]


def one_group_of_every_tensor(model):
    return [{"params": list(model.params), "lr": 0.02}]


def main():
    zt.init()
    results = []
    for case, kind, torch_class, hyper, edit, make_scheduler in CASES:
        for mode in MODES:
            results.append(check_case(case, kind, torch_class, hyper, edit, make_scheduler, mode))
    results.append(check_groups_by_identity("a_group_per_tensor", 1000, 4, a_group_per_tensor,
                                            "adamw", torch.optim.AdamW, {"lr": 1e-3}, "ddp"))
    results.append(check_groups_by_identity("one_group_of_10000_tensors", 10000, 2,
                                            one_group_of_every_tensor, "sgd", torch.optim.SGD,
                                            {"lr": 0.01, "momentum": 0.9}, "zero1"))
    results.extend(check_refusals())
    if zt.rank() == 0:
        for result in results:
            print(json.dumps(result), flush=True)
    return 0 if all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
