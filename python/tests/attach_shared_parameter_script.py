"""A parameter used twice in one forward: run by `python3 -m zeroshard.launch --workers 2`. The
model ties its output projection to its embedding (as GPT-style models do) and applies one Linear
twice. Autograd sums a leaf's gradients before it accumulates them, so each parameter's hook fires
once per backward and zt.ShardedOptimizer must train it like torch: compared, after 15 steps of
AdamW in zero2 and in ddp, with torch.optim.AdamW in this process on every rank's data (the mean
of the ranks' losses). Rank 0 prints one JSON line per mode; the script exits 1 when one fails.
"""

import contextlib
import json
import os
import sys

import torch

import zeroshard.torch as zt

STEPS = 15
VOCAB = 24
WIDTH = 16
BATCH = 8
TOLERANCE = 1e-6


class TiedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4321)
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.hidden = torch.nn.Linear(WIDTH, WIDTH)
        self.project = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.project.weight = self.embedding.weight

    def forward(self, tokens):
        h = torch.tanh(self.hidden(self.embedding(tokens)))
        h = torch.tanh(self.hidden(h))  # the same Linear again
        return self.project(h)


def batch(step, rank):
    generator = torch.Generator().manual_seed(7919 * step + rank)
    return (torch.randint(0, VOCAB, (BATCH,), generator=generator),
            torch.randint(0, VOCAB, (BATCH,), generator=generator))


def loss_of(model, step, rank):
    tokens, targets = batch(step, rank)
    return torch.nn.functional.cross_entropy(model(tokens), targets)


def main():
    zt.init()
    rank, world_size = zt.rank(), zt.world_size()
    failed = False
    for mode in ("zero2", "ddp"):
        reference = TiedModel()
        reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        model = TiedModel()
        optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode=mode)
        for step in range(STEPS):
            for r in range(world_size):
                (loss_of(reference, step, r) / world_size).backward()
            reference_optimizer.step()
            reference_optimizer.zero_grad()
            loss_of(model, step, rank).backward()
            optimizer.step()
            optimizer.zero_grad()
        worst = 0.0
        for (name, ours), theirs in zip(model.named_parameters(), reference.parameters()):
            scale = max(theirs.detach().abs().max().item(), 1e-12)
            worst = max(worst, (ours.detach() - theirs.detach()).abs().max().item() / scale)
        line = {"mode": mode, "world_size": world_size, "worst_relative": worst,
                "parameters": len(list(model.parameters())),
                "still_tied": model.project.weight is model.embedding.weight,
                "moved": (model.embedding.weight.detach() -
                          TiedModel().embedding.weight.detach()).abs().max().item()}
        line["ok"] = worst <= TOLERANCE and line["still_tied"] and line["moved"] > 0
        failed |= not line["ok"]
        if rank == 0:
            print(json.dumps(line), flush=True)
        zt.finish(optimizer)
    for line in reentrant_checkpointing():
        failed |= not line["ok"]
        if rank == 0:
            print(json.dumps(line), flush=True)
    return 1 if failed else 0


def reentrant_checkpointing():
    """A Linear used outside and inside a reentrant checkpointed segment accumulates its
    gradient twice in one backward. zero2 hands each piece over as a micro-batch (the sum is the
    gradient); ddp would have handed over half of it, so it raises naming the parameter."""
    import torch.utils.checkpoint as checkpoint

    def run(linear, optimizer_step):
        x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(5))  # every rank's
        checkpoint.checkpoint(linear, linear(x), use_reentrant=True).sum().backward()
        optimizer_step()

    lines = []
    for mode in ("zero2", "ddp"):
        torch.manual_seed(99)
        reference = torch.nn.Linear(WIDTH, WIDTH)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
        torch.manual_seed(99)
        linear = torch.nn.Linear(WIDTH, WIDTH)
        optimizer = zt.ShardedOptimizer(torch.nn.Sequential(linear), "sgd", lr=0.1, mode=mode)
        line = {"mode": f"{mode} reentrant checkpoint"}
        try:
            run(linear, optimizer.step)
            run(reference, reference_optimizer.step)
            line["worst_absolute"] = max((a - b).abs().max().item() for a, b in
                                         zip(linear.parameters(), reference.parameters()))
            line["ok"] = mode == "zero2" and line["worst_absolute"] <= 1e-6
        except RuntimeError as e:
            line["error"] = str(e)
            line["ok"] = mode == "ddp" and ("parameter 0.weight" in str(e) or
                                            "parameter 0.bias" in str(e))
            with contextlib.suppress(Exception):
                zt.finish(optimizer)
            lines.append(line)
            continue
        zt.finish(optimizer)
        lines.append(line)
    return lines


if __name__ == "__main__":
    status = main()
    zt.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 1.13 keeps the graph of a reentrant backward that raised in a thread-local, whose
    # destructor at exit wants the GIL of a finalized interpreter and hangs: leave without it.
    os._exit(status)
