"""A trainer for attach_restart_test: a small seeded model trained with zt.ShardedOptimizer
(zero2, checkpoints every --checkpoint_every steps, --max_attempts), on data seeded by step index
and rank, so that a run resumed from a checkpoint retraces an uninterrupted one. Started by
zeroshard.launch; after a restart it resumes at opt.start_step.

Prints one JSON line per attempt and rank: {"rank", "restart_count", "start_step", "job_name"}.
With --kill_step S, the trainer of --kill_rank kills itself with SIGKILL in step S, after
backward and before step(), once (in the launcher's first attempt). Rank 0 saves the final
parameters to --out (zt.save).

After each step that makes a checkpoint due, every rank waits for the job to record it: a
worker skips a due checkpoint while it still writes the previous one (a slow disk), which would
move the resume point the test expects.
"""

import argparse
import json
import os
import signal
import sys
import time
import warnings

import torch

import zeroshard
import zeroshard.torch as zt

CHECKPOINT_WAIT_S = 60.0


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--checkpoint_every", type=int, default=5)
    parser.add_argument("--max_attempts", type=int, default=2)
    parser.add_argument("--kill_rank", type=int, default=1)
    parser.add_argument("--kill_step", type=int, default=-1, help="-1: no kill")
    parser.add_argument("--out", required=True)
    return parser.parse_args()


def wait_for_checkpoint(job_name, step):
    """Until the job's latest checkpoint is at `step` or later."""
    client = zeroshard.Client(os.environ["ZEROSHARD_COORDINATOR"])
    deadline = time.monotonic() + CHECKPOINT_WAIT_S
    try:
        while True:
            jobs = [j for j in client.list(limit=1000) if j.spec.name == job_name]
            if jobs and jobs[0].latest_checkpoint.step >= step:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"no checkpoint of step {step} within {CHECKPOINT_WAIT_S} s")
            time.sleep(0.02)
    finally:
        client.close()


def main():
    args = parse_args()
    zt.init()
    rank = zt.rank()
    restart_count = int(os.environ["ZEROSHARD_RESTART_COUNT"])
    job_name = f"{os.environ['ZEROSHARD_RUN_ID']}-1"  # zeroshard.torch's name for the first job
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode="zero2",
                              checkpoint_every=args.checkpoint_every,
                              max_attempts=args.max_attempts)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1.0 + 0.05 * step))
    with warnings.catch_warnings():
        # Advancing the schedule to the resumed step without opt.step() is intended here.
        warnings.simplefilter("ignore")
        for _ in range(opt.start_step):
            sched.step()
    print(json.dumps({"rank": rank, "restart_count": restart_count,
                      "start_step": opt.start_step, "job_name": job_name}), flush=True)
    for step in range(opt.start_step, args.steps):
        data = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 16, generator=data)
        y = torch.randn(8, 4, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if step == args.kill_step and rank == args.kill_rank and restart_count == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step(loss=loss.item())
        opt.zero_grad()
        sched.step()
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            wait_for_checkpoint(job_name, step + 1)
    zt.save(model, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
