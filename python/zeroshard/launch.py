"""Start a PyTorch training script on ZeroShard workers, like torchrun:

    python3 -m zeroshard.launch --workers 2 train.py [script args...]

Without ZEROSHARD_COORDINATOR in the environment it starts a local cluster first (a coordinator
and --workers CPU workers, deploy/local/cluster.py in this checkout) and stops it afterwards.
With ZEROSHARD_COORDINATOR=host:port it uses that cluster: the script's ranks attach to IDLE
workers on this host that serve attached trainers (their --attach_socket), since a trainer shares
memory with its worker.

It starts one trainer process per rank with ZEROSHARD_RANK, ZEROSHARD_WORLD_SIZE,
ZEROSHARD_WORKERS (the workers' names in rank order), ZEROSHARD_RUN_ID (the job's name) and
ZEROSHARD_ATTACH_SOCKET (its worker's socket) set; rank 0's ShardedOptimizer submits the job.
torchrun's variables are set too (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the
same script can also run torch.distributed baselines (gloo) among its ranks.
If a trainer fails, the others are stopped; the exit status is the first failure's.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python3 -m zeroshard.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, required=True, help="ranks (trainers) to run")
    parser.add_argument("--bin_dir", default=None,
                        help="local cluster only: where the coordinator and worker binaries are "
                        "(deploy/local/cluster.py's --bin_dir)")
    parser.add_argument("--log_dir", default=None,
                        help="local cluster only: logs, state and checkpoints")
    parser.add_argument("--worker_threads", type=int, default=None,
                        help="local cluster only: each worker's --threads")
    parser.add_argument("--worker_flag", action="append", default=[],
                        help="local cluster only: an extra flag for every worker (repeatable), "
                        "e.g. --worker_flag=--bucket_pool_size=1")
    parser.add_argument("--wait_s", type=float, default=60.0,
                        help="how long to wait for enough idle workers on this host")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    return args


def run_local_cluster(args):
    """Re-runs this launcher inside a local cluster (which sets ZEROSHARD_COORDINATOR)."""
    cluster = os.path.join(REPO_ROOT, "deploy", "local", "cluster.py")
    if not os.path.exists(cluster):
        sys.exit("zeroshard.launch: ZEROSHARD_COORDINATOR is not set and there is no "
                 f"{cluster} to start a local cluster with")
    command = [sys.executable, cluster, "--workers", str(args.workers)]
    if args.bin_dir:
        command += ["--bin_dir", args.bin_dir]
    if args.log_dir:
        command += ["--log_dir", args.log_dir]
    if args.worker_threads:
        command += ["--worker_threads", str(args.worker_threads)]
    command += [f"--worker_flag={flag}" for flag in args.worker_flag]
    command += ["--", sys.executable, "-m", "zeroshard.launch", "--workers", str(args.workers),
                "--wait_s", str(args.wait_s), args.script] + args.script_args
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [package_root, env.get("PYTHONPATH", "")] if p)
    return subprocess.call(command, env=env)


def idle_attach_workers(coordinator, count, wait_s):
    """`count` IDLE workers on this host that serve attached trainers, by name."""
    import grpc
    from zeroshard._proto.zeroshard.v1 import coordinator_pb2, coordinator_pb2_grpc, worker_pb2
    host = socket.gethostname()
    deadline = time.monotonic() + wait_s
    with grpc.insecure_channel(coordinator) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        while True:
            response = stub.ListWorkers(
                coordinator_pb2.ListWorkersRequest(state=worker_pb2.IDLE), timeout=30)
            usable = sorted((w for w in response.workers if w.attach_socket and w.host == host),
                            key=lambda w: w.name)
            if len(usable) >= count:
                return usable[:count]
            if time.monotonic() >= deadline:
                sys.exit(f"zeroshard.launch: {len(usable)} idle workers with an attach socket on "
                         f"host {host}, {count} needed (start them with --attach_socket)")
            time.sleep(0.2)


def run_trainers(args):
    coordinator = os.environ["ZEROSHARD_COORDINATOR"]
    workers = idle_attach_workers(coordinator, args.workers, args.wait_s)
    run_id = f"attached-{uuid.uuid4().hex[:12]}"
    names = ",".join(w.name for w in workers)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        master_port = probe.getsockname()[1]
    trainers = []
    for rank, worker in enumerate(workers):
        env = dict(os.environ)
        env.update({
            "ZEROSHARD_RANK": str(rank),
            "ZEROSHARD_WORLD_SIZE": str(args.workers),
            "ZEROSHARD_WORKERS": names,
            "ZEROSHARD_RUN_ID": run_id,
            "ZEROSHARD_ATTACH_SOCKET": worker.attach_socket,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(args.workers),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
        })
        trainers.append(subprocess.Popen([sys.executable, args.script] + args.script_args,
                                         env=env))
    status = 0
    remaining = list(trainers)
    while remaining:
        for trainer in list(remaining):
            code = trainer.poll()
            if code is None:
                continue
            remaining.remove(trainer)
            if code != 0 and status == 0:
                status = code
                for other in remaining:
                    other.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    return status


def main(argv):
    args = parse_args(argv)
    if not os.environ.get("ZEROSHARD_COORDINATOR"):
        return run_local_cluster(args)
    return run_trainers(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
