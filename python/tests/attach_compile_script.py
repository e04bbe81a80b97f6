"""torch.compile and copies of a model with a live zt.ShardedOptimizer, run by `python3 -m
zeroshard.launch --workers 2` (attach_compile_test.py says what is checked and why).

--compile: attach_models_script's GPT (12 blocks, tied embedding, minGPT's groups, clipping at
1.0) trained STEPS steps in zero1, zero2 and ddp: eagerly, with torch.compile(model) before the
ShardedOptimizer and with torch.compile(model) after it. Rank 0 prints one JSON line per (mode,
order): the losses (mean over ranks) against the eager run's, Dynamo's graph breaks (every one,
and those whose reason names zeroshard), graphs and recompiles after the first two steps.

--pickle DIR: a model of torch's own modules (nn.Sequential, a tied output layer) trained 3 steps
in zero2; then, the optimizer alive with parameters pending, rank 0 writes torch.save(model) and
the parameters' values (plain tensors) into DIR, and checks copy.deepcopy(model) and a pickle
round trip in this process: no zeroshard hook, method or module in the copy. The test loads the
file in a fresh interpreter that cannot import zeroshard.
"""

import argparse
import copy
import json
import os
import pickle
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import zeroshard.torch as zt

STEPS = 6


def dynamo_counters():
    from torch._dynamo.utils import counters
    breaks = dict(counters["graph_break"])
    return {"graph_breaks": sum(breaks.values()),
            "graph_breaks_in_zeroshard": sum(n for reason, n in breaks.items()
                                             if "zeroshard" in reason),
            "break_reasons": [reason[:300] for reason in breaks],
            "unique_graphs": counters["stats"]["unique_graphs"],
            "recompiles": sum(counters["recompiles"].values()),
            "frames": counters["frames"]["total"]}


def train_gpt(mode, order, rank, world):
    """STEPS steps of the GPT; order: eager, before (compile, then the optimizer) or after."""
    import attach_models_script as models
    task = models.GPTTask()
    if order != "eager":
        import torch._dynamo
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
    model = task.build()
    groups = task.groups(model)
    if order == "before":
        model = torch.compile(model)
    optimizer = zt.ShardedOptimizer(model, task.kind, mode=mode, param_groups=groups,
                                    **task.hyper, clip_grad_norm=task.CLIP)
    if order == "after":
        model = torch.compile(model)
    losses, after_warm_up = [], None
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = task.lr(step)
        x, y = models.random_windows(step, rank, world)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step == 1 and order != "eager":
            after_warm_up = dynamo_counters()
    zt.finish(optimizer)
    result = {"losses": models.global_losses(losses, world)}
    if order != "eager":
        result["counters"] = dynamo_counters()
        result["after_warm_up"] = after_warm_up
    return result


def check_compile(rank, world, report):
    for mode in ("zero1", "zero2", "ddp"):
        eager = train_gpt(mode, "eager", rank, world)
        for order in ("before", "after"):
            got = train_gpt(mode, order, rank, world)
            if rank != 0:
                continue
            worst = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], eager["losses"]))
            counters, warm = got["counters"], got["after_warm_up"]
            line = {"check": "compile", "mode": mode, "order": order, "world_size": world,
                    "torch": torch.__version__, "steps": STEPS,
                    "worst_loss_relative_to_eager": worst, "losses": got["losses"],
                    "eager_losses": eager["losses"], **counters,
                    "recompiles_after_step_2": counters["recompiles"] - warm["recompiles"],
                    "graphs_after_step_2": counters["unique_graphs"] - warm["unique_graphs"]}
            report(line, True)


class TiedModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Embedding(32, 16), nn.LayerNorm(16), nn.Linear(16, 16))
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.body[0].weight

    def forward(self, x):
        return self.head(self.body(x))


def ours_in(model):
    """What of zeroshard a copy holds: hooks, installed methods, zeroshard objects."""
    found = []
    for name, module in model.named_modules():
        for attribute in ("_forward_pre_hooks", "_forward_hooks", "_state_dict_hooks"):
            for hook in getattr(module, attribute, {}).values():
                found.append(f"{name or 'model'}.{attribute}: {hook!r}")
        for attribute in ("zero_grad", "parameters", "named_parameters", "state_dict"):
            if attribute in module.__dict__:
                found.append(f"{name or 'model'}.{attribute} on the instance")
    for name, p in model.named_parameters():
        if type(p) is not nn.Parameter or p.grad is not None:
            found.append(f"{name}: {type(p).__name__}, grad {type(p.grad).__name__}")
    return found


def check_pickle(rank, world, directory, report):
    # The sequential model is torch's own: the model's module (this script) is not needed to
    # load it, so the loader can run without this script's imports (zeroshard).
    torch.manual_seed(4)
    model = nn.Sequential(nn.Embedding(32, 16), nn.LayerNorm(16), nn.Linear(16, 16),
                          nn.Linear(16, 32, bias=False))
    model[3].weight = model[0].weight
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode="zero2")
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x = torch.randint(32, (4, 8), generator=generator)
        F.cross_entropy(model(x).view(-1, 32), x.view(-1)).backward()
        optimizer.step()
        optimizer.zero_grad()
    # Parameters pending (overlap): saving reads them through state_dict's wait, or not at all.
    optimizer.wait_for_parameters()
    if rank == 0:
        deep = copy.deepcopy(model)
        pickled = pickle.loads(pickle.dumps(model))
        torch.save(model, os.path.join(directory, "model.pt"))
        torch.save({name: p.detach().clone() for name, p in model.named_parameters()},
                   os.path.join(directory, "values.pt"))
        equal = all(torch.equal(a, b) for copied in (deep, pickled)
                    for a, b in zip(copied.parameters(), model.parameters()))
        tied = all(copied[3].weight is copied[0].weight for copied in (deep, pickled))
        line = {"check": "copies", "deepcopy_holds": ours_in(deep),
                "pickle_holds": ours_in(pickled), "values_equal": equal, "tied_kept": tied,
                "live_model_still_hooked": bool(model._forward_pre_hooks)}
        report(line, not line["deepcopy_holds"] and not line["pickle_holds"] and equal and tied)
    zt.finish(optimizer)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--pickle", default=None, metavar="DIR")
    args = parser.parse_args()
    zt.init()
    rank, world = zt.rank(), zt.world_size()
    import torch.distributed as dist
    dist.init_process_group("gloo")
    failures = []

    def report(line, ok):
        line["ok"] = bool(ok)
        failures.extend([] if ok else [line])
        print(json.dumps(line), flush=True)

    if args.pickle:
        check_pickle(rank, world, args.pickle, report)
    if args.compile:
        check_compile(rank, world, report)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
