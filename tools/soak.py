#!/usr/bin/env python3
"""Soak: jobs run on a local cluster while its workers and its coordinator are killed with
kill -9 at random; prints one JSON summary of what became of every job.

    python3 tools/soak.py --minutes 10
    python3 tools/soak.py --minutes 2 --workers 3 --seed 7 --bin_dir "$(bazel info -c opt bazel-bin)"

Its own processes (not deploy/local/cluster.py, whose coordinator takes a new port each start):
a coordinator on a fixed loopback port with a state dir and a checkpoint root, and --workers
CPU workers (worker-0 ..), each with that checkpoint root. For --minutes it keeps
--concurrent_jobs jobs in flight, submitting a new one (small models, checkpoints on, a few
hundred steps; spec files through the `zeroshard` CLI) whenever fewer run, and every
--kill_interval seconds on average (exponential gaps) kills one process with SIGKILL: the
coordinator with probability --coordinator_share, else a random worker. A killed process is
started again after 0.5 to 2 s: a worker as a new process of the same name (the coordinator
gives it a new id), the coordinator with the same address, state dir and checkpoint root. A
process that exits by itself is counted (`crashes`) and started again too. Then the kills stop
and the jobs in flight get --drain_minutes to end.

Summary fields: jobs `submitted` (submit attempts), `acknowledged` (the CLI printed an id),
`succeeded`, `failed` (FAILED or CANCELLED), `lost` (acknowledged, but the coordinator no longer
knows it), `stuck` (not ended when the drain is over), `generations` (over the acknowledged
jobs), `recoveries` (generations after each job's first), `generation_ends` by cause (from the
jobs' STATE_CHANGED events: coordinator restart, lost worker, failed run, other), `adoptions`
(generations a restarted coordinator adopted instead of ending them), `steps_lost` (over jobs,
the steps re-run after recoveries: before each generation's first reported step, the highest
step any earlier generation reported minus the step it resumed from), its largest for one
recovery, how many recoveries lost more than the job's checkpoint interval, kills and
restarts. `steps_lost` counts what rank 0 reported to the coordinator: steps run while the
coordinator was down and never reported are not in it. The exit status is 0 when lost and stuck
are both 0.

Python 3 standard library only. Binaries as deploy/local/cluster.py finds them (build with
`bazel build -c opt //coordinator:zeroshard-coordinator //client:zeroshard
//worker:zeroshard-worker`).
"""

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "deploy", "local"))
import cluster  # noqa: E402  (deploy/local/cluster.py: binaries and child processes)

FINAL_STATES = {"SUCCEEDED", "FAILED", "CANCELLED"}
# Small models with batches large enough that a job runs tens of seconds on shared cores (long
# enough to be hit by kills), checkpointing every few seconds. Global batches divide by 1, 2, 3.
MODELS = [
    {"layers": [256, 1024, 1024, 256], "batch": 192, "steps": (250, 450), "every_steps": (20, 50)},
    {"layers": [512, 1024, 512], "batch": 192, "steps": (250, 450), "every_steps": (25, 50)},
    {"layers": [128, 512, 512, 512, 128], "batch": 384, "steps": (300, 500),
     "every_steps": (30, 60)},
]


def log(message):
    print(f"soak: {message}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, args, binaries, log_dir):
        self.args = args
        self.binaries = binaries
        self.log_dir = log_dir
        self.rng = random.Random(args.seed)
        self.state_dir = os.path.join(log_dir, "coordinator-state")
        self.checkpoint_root = os.path.join(log_dir, "checkpoints")
        self.spec_dir = os.path.join(log_dir, "specs")
        for directory in (self.state_dir, self.checkpoint_root, self.spec_dir):
            os.makedirs(directory, exist_ok=True)
        self.address = f"127.0.0.1:{free_port()}"
        self.starts = {}  # process name -> how many times it was started
        self.processes = {}  # name -> cluster.Process (the current one)
        self.restart_at = {}  # name -> monotonic time it is to be started again
        self.jobs = {}  # id -> {"state", "message", "generation"}
        self.counts = {
            "submitted": 0,
            "acknowledged": 0,
            "coordinator_kills": 0,
            "worker_kills": 0,
            "restarts": 0,
            "crashes": 0,
        }
        self.crashed = []  # "name: exit status" of processes that exited by themselves
        self.job_number = 0

    # --- processes ------------------------------------------------------------------------

    def _argv(self, name):
        if name == "coordinator":
            return [
                self.binaries["coordinator"],
                f"--listen={self.address}",
                "--metrics_port=0",
                f"--state_dir={self.state_dir}",
                f"--checkpoint_root={self.checkpoint_root}",
            ]
        return [
            self.binaries["worker"],
            f"--coordinator={self.address}",
            "--device=cpu",
            f"--name={name}",
            "--threads=1",
            f"--checkpoint_root={self.checkpoint_root}",
        ]

    def start(self, name):
        count = self.starts.get(name, 0)
        self.starts[name] = count + 1
        env = dict(os.environ)
        env["OPENBLAS_NUM_THREADS"] = "1"
        log_path = os.path.join(self.log_dir, f"{name}.{count}.log")
        process = cluster.Process(name, self._argv(name), log_path, env)
        self.processes[name] = process
        self.restart_at.pop(name, None)

    def names(self):
        return ["coordinator"] + [f"worker-{i}" for i in range(self.args.workers)]

    def kill(self, name):
        process = self.processes[name]
        process.signal_group(signal.SIGKILL)
        process.popen.wait()
        process.close_log()
        self.counts["coordinator_kills" if name == "coordinator" else "worker_kills"] += 1
        self.restart_at[name] = time.monotonic() + self.rng.uniform(0.5, 2.0)

    def tend_processes(self):
        """Starts again what is due; notices processes that exited without being killed."""
        now = time.monotonic()
        for name in self.names():
            if name in self.restart_at:
                if now >= self.restart_at[name]:
                    self.start(name)
                    self.counts["restarts"] += 1
                continue
            process = self.processes[name]
            if process.exited():
                self.counts["crashes"] += 1
                self.crashed.append(f"{name}: exit status {process.popen.returncode} "
                                    f"({process.log_path})")
                log(f"{name} exited by itself with status {process.popen.returncode}")
                process.close_log()
                self.restart_at[name] = now + 1.0

    def stop_all(self):
        for group in ([n for n in self.names() if n != "coordinator"], ["coordinator"]):
            running = [self.processes[n] for n in group
                       if n in self.processes and not self.processes[n].exited()]
            for process in running:
                process.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for process in running:
                try:
                    process.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.signal_group(signal.SIGKILL)
                    process.popen.wait()
        for process in self.processes.values():
            process.signal_group(signal.SIGKILL)
            process.close_log()

    # --- the CLI --------------------------------------------------------------------------

    def cli(self, *args, timeout=30):
        """(exit status, stdout); (None, "") when it timed out."""
        try:
            result = subprocess.run(
                [self.binaries["client"], f"--coordinator={self.address}", *args],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, ""
        return result.returncode, result.stdout + result.stderr

    def submit(self):
        model = self.rng.choice(MODELS)
        self.job_number += 1
        workers = self.rng.choice([(1, 2), (2, 2), (2, 3)])
        spec = {
            "name": f"soak-{self.job_number}",
            "workload": {"layer_sizes": model["layers"], "dataset_size": 4096},
            "optimizer": {"kind": "ADAMW", "lr": 0.001},
            "mode": self.rng.choice(["ZERO2", "ZERO1", "DDP"]),
            "min_workers": workers[0],
            "max_workers": workers[1],
            "global_batch": model["batch"],
            "steps": self.rng.randint(*model["steps"]),
            "seed": self.rng.randint(1, 1 << 30),
            "checkpoint": {"every_steps": self.rng.randint(*model["every_steps"]), "keep": 2},
            "max_attempts": self.args.max_attempts,
        }
        path = os.path.join(self.spec_dir, f"soak-{self.job_number}.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        self.counts["submitted"] += 1
        status, output = self.cli("submit", path)
        job_id = output.strip().splitlines()[0] if status == 0 and output.strip() else None
        if job_id is None:
            log(f"submit of {spec['name']} not acknowledged: {output.strip()[:200]}")
            return
        self.counts["acknowledged"] += 1
        self.jobs[job_id] = {"state": "PENDING", "message": "", "generation": 0,
                             "every_steps": spec["checkpoint"]["every_steps"]}
        log(f"submitted {job_id} ({spec['name']}: {spec['steps']} steps, "
            f"checkpoint every {spec['checkpoint']['every_steps']})")

    def refresh(self, job_id):
        """Updates one job from `get`. False when the coordinator could not answer."""
        status, output = self.cli("get", job_id, "--output=json", timeout=15)
        if status != 0:
            if status is not None and "NOT_FOUND" in output:
                self.jobs[job_id]["state"] = "LOST"
                return True
            return False
        try:
            job = json.loads(output)
        except json.JSONDecodeError:
            return False
        entry = self.jobs[job_id]
        entry["state"] = job.get("state", "PENDING")
        entry["message"] = job.get("message", "")
        entry["generation"] = int(job.get("generation", 0))
        return True

    def in_flight(self):
        return [j for j, entry in self.jobs.items()
                if entry["state"] not in FINAL_STATES and entry["state"] != "LOST"]

    def coordinator_up(self):
        return "coordinator" not in self.restart_at

    # --- the run --------------------------------------------------------------------------

    def wait_until_serving(self):
        """Until the coordinator answers, so that the first submissions are not refused."""
        deadline = time.monotonic() + 60
        while self.cli("workers", timeout=15)[0] != 0:
            if time.monotonic() >= deadline:
                raise cluster.ClusterError("the coordinator did not serve within 60 s")
            time.sleep(0.2)

    def run(self):
        for name in self.names():
            self.start(name)
        self.wait_until_serving()
        start = time.monotonic()
        end = start + 60 * self.args.minutes
        next_kill = start + 5 + self.rng.expovariate(1.0 / self.args.kill_interval)
        next_refresh = start
        while time.monotonic() < end:
            self.tend_processes()
            now = time.monotonic()
            if now >= next_kill:
                candidates = [n for n in self.names() if n not in self.restart_at]
                if candidates:
                    victim = ("coordinator"
                              if "coordinator" in candidates
                              and self.rng.random() < self.args.coordinator_share
                              else self.rng.choice([n for n in candidates if n != "coordinator"]
                                                   or candidates))
                    log(f"kill -9 {victim}")
                    self.kill(victim)
                next_kill = now + self.rng.expovariate(1.0 / self.args.kill_interval)
            if now >= next_refresh and self.coordinator_up():
                for job_id in self.in_flight():
                    self.refresh(job_id)
                if len(self.in_flight()) < self.args.concurrent_jobs:
                    self.submit()
                next_refresh = time.monotonic() + 2.0
            time.sleep(0.2)
        log(f"no more kills; draining for up to {self.args.drain_minutes:g} minutes")
        drain_end = time.monotonic() + 60 * self.args.drain_minutes
        while time.monotonic() < drain_end:
            self.tend_processes()
            if self.coordinator_up():
                for job_id in self.in_flight():
                    self.refresh(job_id)
                if not self.in_flight():
                    break
            time.sleep(2.0)
        # The final word on every job (a lost job is looked up again: the coordinator may
        # have been down when it was last asked).
        for job_id in self.jobs:
            for _ in range(5):
                if self.refresh(job_id):
                    break
                time.sleep(2.0)

    # --- the summary ----------------------------------------------------------------------

    def events(self, job_id):
        status, output = self.cli("watch", job_id, "--output=json", timeout=60)
        events = []
        for line in output.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return events

    @staticmethod
    def steps_lost(events):
        """Steps re-run after each recovery: before each generation's first reported step, the
        highest step reported so far minus the step that generation resumed from."""
        first, highest = {}, {}
        for event in events:
            if event.get("type") != "PROGRESS":
                continue
            generation = int(event.get("generation", 0))
            step = int(event.get("progress", {}).get("step", 0))
            first.setdefault(generation, step)
            first[generation] = min(first[generation], step)
            highest[generation] = max(highest.get(generation, 0), step)
        lost, reached = [], 0
        for generation in sorted(first):
            if reached > 0:
                lost.append(max(0, reached - (first[generation] - 1)))
            reached = max(reached, highest[generation])
        return lost

    @staticmethod
    def generation_end_cause(message):
        if "coordinator restarted" in message:
            return "coordinator_restart"
        if "lease expired" in message or " left" in message:
            return "worker_lost"
        if " failed: " in message:
            return "run_failed"
        return "other"

    def summary(self):
        states = [entry["state"] for entry in self.jobs.values()]
        ends = {"coordinator_restart": 0, "worker_lost": 0, "run_failed": 0, "other": 0}
        steps_lost, worst, over_interval, failures, adoptions = 0, 0, 0, [], 0
        for job_id, entry in sorted(self.jobs.items()):
            if entry["state"] not in FINAL_STATES:
                continue
            events = self.events(job_id)
            for event in events:
                if event.get("type") != "STATE_CHANGED":
                    continue
                if event.get("state") == "RECOVERING":
                    ends[self.generation_end_cause(event.get("message", ""))] += 1
                elif "adopted after a coordinator restart" in event.get("message", ""):
                    adoptions += 1
            for lost in self.steps_lost(events):
                steps_lost += lost
                worst = max(worst, lost)
                over_interval += lost > entry["every_steps"]
            if entry["state"] != "SUCCEEDED":
                failures.append(f"{job_id} {entry['state']}: {entry['message'][:300]}")
        generations = sum(entry["generation"] for entry in self.jobs.values())
        started = sum(1 for entry in self.jobs.values() if entry["generation"] > 0)
        return {
            "soak": "zeroshard",
            "minutes": self.args.minutes,
            "workers": self.args.workers,
            "seed": self.args.seed,
            "jobs_submitted": self.counts["submitted"],
            "jobs_acknowledged": self.counts["acknowledged"],
            "succeeded": states.count("SUCCEEDED"),
            "failed": states.count("FAILED") + states.count("CANCELLED"),
            "lost": states.count("LOST"),
            "stuck": sum(1 for s in states if s not in FINAL_STATES and s != "LOST"),
            "generations": generations,
            "recoveries": generations - started,
            "generation_ends": ends,
            "adoptions": adoptions,
            "steps_lost": steps_lost,
            "steps_lost_max_recovery": worst,
            "recoveries_losing_more_than_every_steps": over_interval,
            "coordinator_kills": self.counts["coordinator_kills"],
            "worker_kills": self.counts["worker_kills"],
            "restarts": self.counts["restarts"],
            "crashes": self.counts["crashes"],
            "crashed": self.crashed,
            "failures": failures,
            "log_dir": self.log_dir,
        }


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="soak.py", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long kills go on")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--concurrent_jobs", type=int, default=2,
                        help="jobs kept in flight (default 2)")
    parser.add_argument("--kill_interval", type=float, default=10.0,
                        help="mean seconds between kills (default 10)")
    parser.add_argument("--coordinator_share", type=float, default=0.3,
                        help="probability that a kill hits the coordinator (default 0.3)")
    parser.add_argument("--max_attempts", type=int, default=100,
                        help="each job's max_attempts (generations it may start; default 100)")
    parser.add_argument("--drain_minutes", type=float, default=5.0,
                        help="how long jobs in flight may take to end after the kills stop")
    parser.add_argument("--seed", type=int, default=1, help="seeds the kills and the jobs")
    parser.add_argument("--bin_dir", default=None,
                        help="directory of the coordinator/, client/ and worker/ binaries "
                        "(default: as deploy/local/cluster.py)")
    parser.add_argument("--log_dir", default=None,
                        help="logs, state, checkpoints (default: a new directory under /tmp)")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers must be at least 2 (jobs run on 1 to 3 workers)")
    if args.minutes <= 0 or args.kill_interval <= 0:
        parser.error("--minutes and --kill_interval must be positive")
    return args


def main(argv):
    args = parse_args(argv)
    try:
        binaries = cluster.find_binaries(args.bin_dir or cluster.default_bin_dir())
    except cluster.ClusterError as e:
        log(f"error: {e}")
        return 2
    log_dir = os.path.abspath(args.log_dir) if args.log_dir else tempfile.mkdtemp(
        prefix="zeroshard-soak-")
    os.makedirs(log_dir, exist_ok=True)
    log(f"logs, state and checkpoints in {log_dir}")
    soak = Soak(args, binaries, log_dir)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        soak.run()
        result = soak.summary()
    except cluster.ClusterError as e:
        log(f"error: {e}")
        return 1
    finally:
        soak.stop_all()
    print(json.dumps(result), flush=True)
    return 0 if result["lost"] == 0 and result["stuck"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
