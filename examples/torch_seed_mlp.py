"""The seed document's model and job, trained three ways in one script on ZeroShard's workers:
torch AdamW/SGD + DDP, torch ZeroRedundancyOptimizer + DDP, and zt.ShardedOptimizer (zero2),
from the same initial weights on the same data. Prints the loss every 10 steps and the largest
|Δparam| between the three, relative to each tensor's largest value.

    zeroshard-launch --workers 2 examples/torch_seed_mlp.py [--optimizer adamw|sgd]

(the zeroshard package installed with pip, the binaries from $ZEROSHARD_BIN_DIR or PATH:
docs/pytorch.md, "Install".) Expected: every difference <= 1e-6 over 80 steps.
"""

import argparse
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import zeroshard.torch as zt

STEPS = 80
BATCH = 32  # per rank, as the seed's DataLoader


class MyModel(torch.nn.Module):
    """The seed document's model."""

    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(10, 64)
        self.relu = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))


def make_model():
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    return MyModel()


def batch(step, rank):
    """This rank's samples of `step`: inputs, and a fixed random teacher's outputs."""
    teacher = torch.Generator().manual_seed(7)
    weight = torch.randn(10, 10, generator=teacher) / 10 ** 0.5
    generator = torch.Generator().manual_seed(100_003 * step + rank)
    x = torch.randn(BATCH, 10, generator=generator)
    return x, torch.tanh(x @ weight)


def train(label, model, forward, optimizer):
    loss_fn = torch.nn.MSELoss()
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step, zt.rank())
        loss = loss_fn(forward(x), y)
        loss.backward()
        optimizer.step()
        if zt.rank() == 0 and (step + 1) % 10 == 0:
            print(f"{label:>18} step {step + 1:3d} loss {loss.item():.6f}", flush=True)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    args = parser.parse_args()
    torch_class = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.SGD
    zt.init()
    dist.init_process_group("gloo")

    model = make_model()
    ddp = DistributedDataParallel(model)
    plain = train(f"torch {args.optimizer}+DDP", model, ddp,
                  torch_class(model.parameters(), lr=0.01))

    model = make_model()
    ddp = DistributedDataParallel(model)
    zero = train("torch ZeRO+DDP", model, ddp,
                 ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch_class, lr=0.01))

    model = make_model()
    optimizer = zt.ShardedOptimizer(model, args.optimizer, lr=0.01, mode="zero2")
    ours = train("zeroshard zero2", model, model, optimizer)
    zt.finish(optimizer)

    worst = 0.0
    for a_name, a, b_name, b in (("torch", plain, "ZeRO", zero), ("torch", plain, "zeroshard", ours),
                                 ("ZeRO", zero, "zeroshard", ours)):
        difference = max(((a[n] - b[n]).abs().max() / a[n].abs().max()).item() for n in a)
        worst = max(worst, difference)
        if zt.rank() == 0:
            print(f"max |Δparam| / max|param|, {a_name} vs {b_name}: {difference:.3g}")
    dist.destroy_process_group()
    return 0 if worst <= 1e-6 else 1


if __name__ == "__main__":
    sys.exit(main())
