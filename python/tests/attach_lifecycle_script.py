"""A trainer for attach_lifecycle_test: how a script's end reaches its job, and the launcher's
signals. A small seeded model trained with zt.ShardedOptimizer (zero2) on data seeded by step
index and rank. Prints one JSON line per rank and attempt: {"rank", "restart_count", "start_step",
"job_name"}, then {"rank", "restart_count", "steps_done"} when it ends normally.

--case train: --steps steps. --case raise: in the launcher's first attempt every rank raises
ValueError("boom after step S") between steps, after step --raise_after (uncaught). --case
exit_early: attaches (reads opt.start_step) and exits without a step. --case forever: trains until
stopped, each rank writing its pid to --marker_dir/rank-R once its first step is done. --case
hand_off: after 3 steps a sharded state_dict() and a consolidated one of the same checkpoint, a
copy of its step directory under another name (--copy_dir), 2 more steps, then loads of the
consolidated dict (which retires the checkpoint: a warning is expected), of the sharded dict (an
error naming the rule), and of the copy (loads); prints {"rank", "warnings", "sharded_error",
"copy_loaded_equal"}.
"""

import argparse
import json
import os
import shutil
import sys
import time
import warnings

import torch

import zeroshard.torch as zt


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=["train", "raise", "exit_early", "forever", "hand_off"],
                        required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--raise_after", type=int, default=3)
    parser.add_argument("--max_attempts", type=int, default=1)
    parser.add_argument("--marker_dir", default=None)
    parser.add_argument("--copy_dir", default=None)
    return parser.parse_args()


def train_step(model, opt, step, rank):
    data = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=data)
    y = torch.randn(8, 4, generator=data)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step(loss=loss.item())
    opt.zero_grad()


def hand_off(args, model, opt, rank):
    for step in range(3):
        train_step(model, opt, step, rank)
    sharded = opt.state_dict()
    consolidated = opt.state_dict(consolidated=True)
    at_step_3 = [p.detach().clone() for p in model.parameters()]
    copy = os.path.join(args.copy_dir, "my-copy")  # not named step-<step>
    if rank == 0:
        shutil.copytree(os.path.dirname(sharded["manifest"]), copy + ".tmp")
        os.rename(copy + ".tmp", copy)
    copied = dict(sharded, manifest=os.path.join(copy, "manifest.json"))
    deadline = time.monotonic() + 60
    while not os.path.exists(copied["manifest"]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {copied['manifest']} within 60 s")
        time.sleep(0.01)
    for step in range(3, 5):
        train_step(model, opt, step, rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.load_state_dict(consolidated)
    sharded_error = None
    try:
        opt.load_state_dict(sharded)
    except ValueError as e:
        sharded_error = str(e)
    copy_error = None
    try:
        opt.load_state_dict(copied)
    except ValueError as e:
        copy_error = str(e)
    equal = all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), at_step_3))
    print(json.dumps({"rank": rank, "warnings": [str(w.message) for w in caught],
                      "sharded_manifest": sharded["manifest"], "sharded_error": sharded_error,
                      "copy_error": copy_error, "copy_loaded_equal": equal}), flush=True)
    train_step(model, opt, 3, rank)
    return 0


def main():
    args = parse_args()
    zt.init()
    rank = zt.rank()
    restart_count = int(os.environ["ZEROSHARD_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode="zero2",
                              max_attempts=args.max_attempts)
    print(json.dumps({"rank": rank, "restart_count": restart_count,
                      "start_step": opt.start_step,
                      "job_name": f"{os.environ['ZEROSHARD_RUN_ID']}-1"}), flush=True)
    if args.case == "exit_early":
        return 0
    if args.case == "hand_off":
        return hand_off(args, model, opt, rank)
    steps = 10**9 if args.case == "forever" else args.steps
    step = opt.start_step
    while step < steps:
        train_step(model, opt, step, rank)
        step += 1
        if args.case == "raise" and restart_count == 0 and step == args.raise_after:
            raise ValueError(f"boom after step {step}")
        if args.case == "forever":
            if step == 1:
                marker = os.path.join(args.marker_dir, f"rank-{rank}")
                with open(marker + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(marker + ".tmp", marker)
            time.sleep(0.05)
    print(json.dumps({"rank": rank, "restart_count": restart_count, "steps_done": step}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
