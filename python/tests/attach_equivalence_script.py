"""Attached trainers against torch: run by `python3 -m zeroshard.launch --workers W` (W = 1, 2,
3), every rank trains the same seeded MLP on its own data shard, once with torch's DDP +
ZeroRedundancyOptimizer (gloo) and once with zt.ShardedOptimizer, for SGD (momentum), Adam and
AdamW in zero2 and AdamW in zero1 and ddp, with two parameter groups (biases without weight
decay), a LambdaLR schedule, 4 micro-batches of accumulation and global-norm clipping. After 30
steps every parameter must agree within 1e-6 of its tensor's largest value (issue 13's
tolerance). In zero2 the trainer hands every micro-batch's gradients over (the worker reduces each
into its shard), so no .grad may be left after any backward. Rank 0 prints one JSON line per case
and the script exits 1 when one fails. --bucket_elems sets the job's bucket size and --mode keeps
only that mode's cases (with a worker's --bucket_pool_size=1, to exercise deferred hand-overs).
"""

import argparse
import contextlib
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import zeroshard.torch as zt

STEPS = 30
MICRO_BATCHES = 4
BATCH = 8  # samples per micro-batch per rank
WEIGHT_DECAY = 0.01
CLIP = 0.5
TOLERANCE = 1e-6
CASES = [
    ("sgd", "zero2", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    ("adam", "zero2", torch.optim.Adam, {"lr": 1e-3}),
    ("adamw", "zero2", torch.optim.AdamW, {"lr": 1e-3}),
    ("adamw", "zero1", torch.optim.AdamW, {"lr": 1e-3}),
    ("adamw", "ddp", torch.optim.AdamW, {"lr": 1e-3}),
]


def schedule(step):
    return 1.0 / (1.0 + 0.1 * step)


def build_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                               torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(step, micro, rank):
    generator = torch.Generator().manual_seed(1_000_003 * step + 1009 * micro + rank)
    x = torch.randn(BATCH, 16, generator=generator)
    y = torch.randn(BATCH, 4, generator=generator)
    return x, y


def split_groups(model):
    decay = [p for name, p in model.named_parameters() if name.endswith("weight")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    return decay, no_decay


def train(model, forward, optimizer, scheduler, no_sync, clip, after_backward=lambda: None):
    rank = zt.rank()
    for step in range(STEPS):
        for micro in range(MICRO_BATCHES):
            x, y = batch(step, micro, rank)
            context = no_sync() if micro < MICRO_BATCHES - 1 else contextlib.nullcontext()
            with context:
                loss = torch.nn.functional.mse_loss(forward(x), y) / MICRO_BATCHES
                loss.backward()
                after_backward()
        clip()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def torch_reference(optimizer_class, hyper):
    model = build_model()
    ddp = DistributedDataParallel(model)
    decay, no_decay = split_groups(model)
    optimizer = ZeroRedundancyOptimizer(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        optimizer_class=optimizer_class, **hyper)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return train(model, ddp, optimizer, scheduler, ddp.no_sync,
                 lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))


def zeroshard_run(kind, mode, hyper, bucket_elems):
    """The trained parameters, the backward passes after which some .grad was left, and the
    segments the worker deferred."""
    model = build_model()
    _, no_decay = split_groups(model)
    optimizer = zt.ShardedOptimizer(model, kind, weight_decay=WEIGHT_DECAY, mode=mode,
                                    param_groups=[{"params": no_decay, "weight_decay": 0.0}],
                                    clip_grad_norm=CLIP, bucket_elems=bucket_elems, **hyper)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    grads_left = [0]

    def after_backward():
        # A handed-over gradient leaves a HandedOverGradient (no values) in .grad.
        if any(p.grad is not None and not isinstance(p.grad, zt.HandedOverGradient)
               for p in model.parameters()):
            grads_left[0] += 1

    result = train(model, model, optimizer, scheduler, optimizer.no_sync, lambda: None,
                   after_backward)
    zt.finish(optimizer)
    return result, grads_left[0], optimizer.deferred_segments


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket_elems", type=int, default=None)
    parser.add_argument("--mode", default=None, help="only this mode's cases")
    args = parser.parse_args()
    zt.init()
    dist.init_process_group("gloo")
    failures = 0
    for kind, mode, optimizer_class, hyper in CASES:
        if args.mode is not None and mode != args.mode:
            continue
        expected = torch_reference(optimizer_class, hyper)
        got, backward_grads_left, deferred = zeroshard_run(kind, mode, hyper, args.bucket_elems)
        worst = 0.0
        worst_name = None
        for name, reference in expected.items():
            scale = max(reference.abs().max().item(), 1e-12)
            difference = (got[name] - reference).abs().max().item() / scale
            if difference > worst:
                worst, worst_name = difference, name
        # ddp/zero1 keep .grad as views of the shared gradient buffer.
        ok = worst <= TOLERANCE and (mode != "zero2" or backward_grads_left == 0)
        failures += 0 if ok else 1
        if zt.rank() == 0:
            print(json.dumps({"test": "attach_equivalence", "world_size": zt.world_size(),
                              "optimizer": kind, "mode": mode, "steps": STEPS,
                              "worst_relative": worst, "worst_parameter": worst_name,
                              "tolerance": TOLERANCE, "backward_grads_left": backward_grads_left,
                              "deferred_segments": deferred, "ok": ok}), flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
