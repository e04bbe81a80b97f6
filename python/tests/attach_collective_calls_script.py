"""A trainer for attach_collective_calls_test: a collective call that only some ranks make.

    attach_collective_calls_script.py CASE MODE

CASE state_dict_on_rank_0: 4 steps; after step 2 rank 0 alone calls opt.state_dict() (as
nanoGPT's checkpoint code does under `if master_process:`), then both step on.
CASE uneven_steps: rank 0 runs 2 steps, rank 1 runs 4, then each calls zt.finish().
CASE two_optimizers: a second ShardedOptimizer while the first is alive (attached), printed as
{"refused": message} when it raises RuntimeError; the first trains on and finishes.

Prints `step N` after each step, `entered CALL AT` (time.time()) before the call that only some
ranks make, and one JSON line {"raised": type, "message", "at": time.time()} when a call raises
(exit 3), or {"done": true} at the end.
"""

import json
import sys
import time

import torch

import zeroshard.torch as zt


def main():
    case, mode = sys.argv[1], sys.argv[2]
    zt.init()
    rank = zt.rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    steps = 4
    if case == "uneven_steps":
        steps = 2 if rank == 0 else 4
    try:
        optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-3, mode=mode)
        for step in range(steps):
            if case == "two_optimizers" and step == 1:
                print(f"entered ShardedOptimizer {time.time()}", flush=True)
                try:
                    zt.ShardedOptimizer(torch.nn.Linear(3, 2), "sgd", lr=0.1, mode=mode)
                except RuntimeError as e:
                    print(json.dumps({"refused": str(e), "at": time.time()}), flush=True)
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + rank))
            if case == "uneven_steps" and rank == 1 and step == 2:
                print(f"entered step {time.time()}", flush=True)
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"step {step + 1}", flush=True)
            if case == "state_dict_on_rank_0" and step == 1 and rank == 0:
                print(f"entered state_dict {time.time()}", flush=True)
                optimizer.state_dict()
        if case == "uneven_steps" and rank == 0:
            print(f"entered finish {time.time()}", flush=True)
        zt.finish()
    except Exception as e:  # every call's failure, reported to the test
        print(json.dumps({"raised": type(e).__name__, "message": str(e), "at": time.time()}),
              flush=True)
        return 3
    print(json.dumps({"done": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
