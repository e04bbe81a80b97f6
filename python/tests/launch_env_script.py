"""Run by the launcher (`zeroshard-launch --workers W launch_env_script.py [--train | --seed_job]`)
in launch_test.py and tools/python_package_test.py: each rank prints one JSON line with what it
found in its environment (OMP_NUM_THREADS, the ZEROSHARD_* variables, the OMP_NUM_THREADS of the
local workers, read from /proc/<pid>/environ), and, with
- --train: trains a tiny model for 3 steps with zt.ShardedOptimizer (needs torch) and prints the
  last loss;
- --seed_job: rank 0 submits a built-in `seed` job on all W workers with zeroshard.Client and
  waits until it SUCCEEDED (no torch).
"""

import argparse
import json
import os
import sys
import time

UNSET = "<unset>"


def worker_omp_threads():
    """OMP_NUM_THREADS of each local worker ($ZEROSHARD_WORKER_PIDS, set by the local cluster)."""
    found = []
    for pid in filter(None, os.environ.get("ZEROSHARD_WORKER_PIDS", "").split(",")):
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
        variables = dict(entry.split(b"=", 1) for entry in entries if b"=" in entry)
        value = variables.get(b"OMP_NUM_THREADS")
        found.append(UNSET if value is None else value.decode())
    return found


def train():
    import torch
    import zeroshard.torch as zt
    zt.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1, mode="zero2")
    generator = torch.Generator().manual_seed(zt.rank())
    for _ in range(3):
        x = torch.randn(16, 4, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    zt.finish()
    return {"torch": torch.__version__, "loss": loss.item()}


def seed_job(world_size):
    if os.environ["ZEROSHARD_RANK"] != "0":
        return {}
    import zeroshard
    from zeroshard._proto.zeroshard.v1 import job_pb2
    ended = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED)
    with zeroshard.Client() as client:  # $ZEROSHARD_COORDINATOR
        job = client.submit({"name": "package-seed", "workload": {"preset": "seed"},
                             "optimizer": {"kind": "ADAMW", "lr": 0.01}, "mode": "ZERO2",
                             "min_workers": world_size, "max_workers": world_size, "steps": 5})
        deadline = time.monotonic() + 120
        while job.state not in ended and time.monotonic() < deadline:
            time.sleep(0.2)
            job = client.get(job.id)
    return {"job": job.id, "state": job_pb2.JobState.Name(job.state), "step": job.progress.step}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--seed_job", action="store_true")
    args = parser.parse_args()
    report = {
        "rank": int(os.environ["ZEROSHARD_RANK"]),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", UNSET),
        "worker_omp_num_threads": worker_omp_threads(),
        "world_size": int(os.environ["ZEROSHARD_WORLD_SIZE"]),
        "executable": sys.executable,
    }
    if args.train:
        report.update(train())
    if args.seed_job:
        report.update(seed_job(report["world_size"]))
    # One write of the whole line: the ranks share the launcher's stdout (a pipe), where a write
    # of at most PIPE_BUF bytes is never interleaved with another rank's.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), ("launch_env " + json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    main()
