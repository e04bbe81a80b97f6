"""A trainer for attach_fault_test: trains a small model with zt.ShardedOptimizer (zero2) until
killed or until its worker is lost. Prints `step N` after every step and, when a call raises
zt.WorkerLost, one JSON line {"worker_lost": message} and exits 3.
"""

import json
import sys

import torch

import zeroshard.torch as zt


def main():
    zt.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    try:
        optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-3, mode="zero2")
        step = 0
        while True:
            x = torch.randn(16, 32)
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            print(f"step {step}", flush=True)
    except zt.WorkerLost as e:
        print(json.dumps({"worker_lost": str(e)}), flush=True)
        return 3


if __name__ == "__main__":
    sys.exit(main())
