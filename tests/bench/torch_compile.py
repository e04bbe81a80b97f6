#!/usr/bin/env python3
"""torch.compile with zt.ShardedOptimizer against eager (figures in docs/performance.md's table,
row "torch.compile with attached trainers").

    PYTHONPATH=python /opt/zs-torch/bin/python -m zeroshard.launch --workers 2 \\
        --bin_dir "$(bazel info -c opt bazel-bin)" tests/bench/torch_compile.py

Not a test. Each rank trains python/tests/attach_models_script.py's GPT (12 blocks, width 32,
minGPT's groups, AdamW, clipping at 1.0) in each --modes mode three ways: eager, compiled
before the ShardedOptimizer and compiled after it, --rounds rounds with the ways' order reversed
every other round, each run --warmup iterations (compilation included) then --steps timed ones.
iter_ms: forward + backward + step() + zero_grad() of the slowest rank, median over a round's
iterations, then over rounds. Rank 0 prints one JSON line per (mode, way) with Dynamo's graph
breaks and recompiles (0 expected) and compiled / eager.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))

WAYS = ("eager", "before", "after")


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def run(torch, zt, models, mode, way, args, rank, world):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    task = models.GPTTask()
    model = task.build()
    groups = task.groups(model)
    if way == "before":
        model = torch.compile(model)
    optimizer = zt.ShardedOptimizer(model, task.kind, mode=mode, param_groups=groups,
                                    **task.hyper, clip_grad_norm=task.CLIP)
    if way == "after":
        model = torch.compile(model)
    times = []
    for step in range(args.warmup + args.steps):
        x, y = models.random_windows(step % models.STEPS, rank, world)
        start = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    zt.finish(optimizer)
    return {"iter": median(times), "graph_breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="zero2,zero1,ddp")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import attach_models_script as models
    import zeroshard.torch as zt

    torch.set_num_threads(1)
    zt.init()
    dist.init_process_group("gloo")
    rank, world = zt.rank(), zt.world_size()
    for mode in args.modes.split(","):
        results = {way: [] for way in WAYS}
        for round_index in range(args.rounds):
            for way in (WAYS if round_index % 2 == 0 else tuple(reversed(WAYS))):
                record = run(torch, zt, models, mode, way, args, rank, world)
                gathered = [None] * world
                dist.all_gather_object(gathered, record)
                results[way].append(gathered)
        if rank == 0:
            eager = median([max(r["iter"] for r in ranks) for ranks in results["eager"]])
            for way in WAYS:
                rounds = [max(r["iter"] for r in ranks) for ranks in results[way]]
                print(json.dumps({
                    "bench": "torch_compile", "mode": mode, "way": way, "world_size": world,
                    "torch": torch.__version__, "iter_ms": median(rounds) * 1e3,
                    "iter_ms_rounds": [round(t * 1e3, 2) for t in rounds],
                    "vs_eager": median(rounds) / eager,
                    "graph_breaks": max(r["graph_breaks"] for ranks in results[way]
                                        for r in ranks),
                    "recompiles": max(r["recompiles"] for ranks in results[way]
                                      for r in ranks),
                    "load_average": os.getloadavg()[0]}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
