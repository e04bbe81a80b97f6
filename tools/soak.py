#!/usr/bin/env python3
"""Soak: jobs run on a local cluster while its workers and its coordinator are killed with
kill -9 at random; prints one JSON summary of what became of every job.

    python3 tools/soak.py --minutes 10
    python3 tools/soak.py --security --minutes 10 --bin_dir .bazel/bin
    python3 tools/soak.py --security --ci --bin_dir .bazel/bin      # the short run .ci/run does
    python3 tools/soak.py --minutes 2 --workers 3 --bin_dir "$(bazel info -c opt bazel-bin)"

Its own processes (not deploy/local/cluster.py, whose coordinator takes a new port each start):
a coordinator on a fixed loopback port with a state dir and a checkpoint root, and --workers
CPU workers (worker-0 ..), each with that checkpoint root. For --minutes it keeps
--concurrent_jobs jobs in flight, submitting a new one (small models, checkpoints on, a few
hundred steps; spec files through the `zeroshard` CLI) whenever fewer run, and every
--kill_interval seconds on average (exponential gaps) kills one process with SIGKILL: the
coordinator with probability --coordinator_share, else a random worker. A killed process is
started again after 0.5 to 2 s: a worker as a new process of the same name (the coordinator
gives it a new id), the coordinator with the same address, state dir and checkpoint root. That
is all the soak restarts on its own account; a process that exits by itself (a daemon that gave
up) is a failure of the target: it is counted (`crashes`) and reported, then started again after
1 s as an operator would have to (`workers_restarted_by_hand`, `coordinator_restarted_by_hand`),
so that the rest of the run still measures something. Then the kills stop and the jobs in flight
get --drain_minutes to end; then every worker process must be registered again (IDLE or BUSY in
`zeroshard workers`) within 60 s.

--security runs the cluster as clusters run (TLS and tokens): deploy/local/cluster.py's
Credentials make a CA, the coordinator's certificate (127.0.0.1, localhost) and a token file with
one token per role under LOG_DIR/tls; the coordinator serves TLS with that token file, every worker
connects with --ca and the token of the worker role, and the CLI (submit, get, watch, workers)
with --ca and the submitter's token. Without it everything is plaintext and unauthenticated.
Every worker keeps its identity in LOG_DIR/NAME.identity (--identity_file): a worker name is held
by proof, and a worker restarted after a kill gets its name back with it.

--security also kills each worker once after a job's last step: until then every worker runs
with ZEROSHARD_TESTONLY_STOP_AFTER_LAST_STEP=1, so it stops itself (SIGSTOP) after the last step of
the first job it runs to its end (its reports in, its final checkpoint not written, the job not
SUCCEEDED yet); the soak kills it there with SIGKILL (`kills_after_last_step`) and starts it again
without the variable, as after any kill.

--ci is the short run for CI (.ci/run): unless given explicitly, --minutes 1.5 --workers 3
--concurrent_jobs 2 --kill_interval 8 --drain_minutes 2 --seed 1 --models short (the same
kinds of models, fewer steps: a job takes 10 to 20 s alone). With the build done it takes about 2
minutes on 2 cores (the drain is bounded by --drain_minutes).

Summary fields: jobs `submitted` (submit attempts), `acknowledged` (the CLI printed an id),
`succeeded`, `failed` (FAILED or CANCELLED), `lost` (acknowledged, but the coordinator no longer
knows it), `stuck` (not ended when the drain is over), `generations` (over the acknowledged
jobs), `recoveries` (generations after each job's first), `generation_ends` by cause (from the
jobs' STATE_CHANGED events: coordinator restart, lost worker, failed run, other), `adoptions`
(generations a restarted coordinator adopted instead of ending them).

Steps redone: `steps_lost` (over jobs, the steps re-run after recoveries: before each generation's
first reported step, the highest step any earlier generation reported minus the step it resumed
from), and per recovery (one new generation of one job) its largest
(`steps_lost_max_recovery`), its median (`steps_lost_median_recovery`), how many recoveries lost
more than the job's checkpoint interval (`recoveries_losing_more_than_every_steps`), and how many
lost more than the bound stated for the generation that had reached the highest step: 2 x
every_steps, or the largest "a lost worker redoes up to N steps" of its NOTICEs
(`recoveries_over_stated_bound`, each in `over_stated_bound`). Per kill
(`steps_redone_per_kill_median`, `_max`): for each job RUNNING at the kill whose next reported
step came from a newer generation, the last step its generation at the kill had reported minus
the step the newer one resumed from, summed over those jobs (of kills in a row with no report of
the job between them, only the first counts it). These count what rank 0 reported to
the coordinator: steps run while the coordinator was down and never reported are not in them.

Recovery time, per kill (`recovery_seconds_median`, `_max`, over `kills_with_running_jobs`): the
jobs RUNNING at the kill are those whose latest STATE_CHANGED event before the kill's time says
RUNNING; each one's baseline is the last step rank 0 reported before the kill in the generation it
was running then (0 if that generation had reported none). The kill is recovered at the first
moment by which every one of those jobs either has a PROGRESS event after the kill with a step
beyond its baseline (so it is RUNNING again, in any generation, past where it was) or has ended
(SUCCEEDED, FAILED, CANCELLED); the recovery time is that moment minus the kill's time, from the
coordinator's event timestamps and the soak's wall clock (same host). Kills with no running job
have none; `unrecovered_kills` counts kills never recovered by the end of the drain. Each kill's
figures are in LOG_DIR/kills.json.

Processes: `coordinator_kills`, `worker_kills`, `restarts` (of killed processes), `crashes` (of
which `worker_crashes`, `coordinator_crashes`; `crashed` names them with their logs),
`workers_restarted_by_hand` and `coordinator_restarted_by_hand` (restarts of processes the soak
did not kill: must be 0), `workers_unregistered_at_end` (worker processes running but not
registered once the drain is over), and `worker_log` (counts of lines in the workers' logs: names
refused with ALREADY_EXISTS while an old registration's lease runs, re-registrations after
NOT_FOUND, heartbeats refused for a lease and registered afresh, adoptions).

The exit status is 0 when lost and stuck are both 0; with --security also `crashes`,
`workers_restarted_by_hand`, `workers_unregistered_at_end` and `recoveries_over_stated_bound` must
be 0 (no daemon gave up, none had to be restarted by hand, none was refused for good, no recovery
redid more than its NOTICEs stated), and `kills_after_last_step` at least 1.

Python 3 standard library only (and the openssl CLI for --security). Binaries as
deploy/local/cluster.py finds them (build with `bazel build //apps/coordinator:zeroshard-coordinator
//client:zeroshard //worker:zeroshard-worker`, -c opt for faster steps, and pass --bin_dir),
copied to LOG_DIR/bin first so that a rebuild during the run changes nothing.
"""

import argparse
import calendar
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "deploy", "local"))
import cluster  # noqa: E402  (deploy/local/cluster.py: binaries, child processes, credentials)

FINAL_STATES = {"SUCCEEDED", "FAILED", "CANCELLED"}
MODELS = {
    # Small models with batches large enough that a job runs tens of seconds on shared cores (long
    # enough to be hit by kills), checkpointing every few seconds. Global batches divide by 1, 2, 3.
    "default": [
        {"layers": [256, 1024, 1024, 256], "batch": 192, "steps": (250, 450),
         "every_steps": (20, 50)},
        {"layers": [512, 1024, 512], "batch": 192, "steps": (250, 450), "every_steps": (25, 50)},
        {"layers": [128, 512, 512, 512, 128], "batch": 384, "steps": (300, 500),
         "every_steps": (30, 60)},
    ],
    # --ci: the same kinds of models with fewer steps, so that a job takes 10 to 20 s alone (at
    # Bazel's default optimisation) and several of them start, get hit and end in a short run.
    "short": [
        {"layers": [256, 1024, 1024, 256], "batch": 192, "steps": (120, 220),
         "every_steps": (10, 25)},
        {"layers": [512, 1024, 512], "batch": 192, "steps": (250, 450), "every_steps": (20, 40)},
        {"layers": [256, 512, 512, 256], "batch": 96, "steps": (400, 700),
         "every_steps": (30, 60)},
    ],
}
# --ci's settings (each only where the flag is not given).
CI_DEFAULTS = {"minutes": 1.5, "workers": 3, "concurrent_jobs": 2, "kill_interval": 8.0,
               "drain_minutes": 2.0, "seed": 1, "models": "short"}
DEFAULTS = {"workers": 4, "concurrent_jobs": 2, "kill_interval": 10.0, "drain_minutes": 5.0,
            "seed": 1, "models": "default"}
# The worker stops itself after a job's last step while this is "1" (engine_training_run.cc).
STOP_AFTER_LAST_STEP = "ZEROSHARD_TESTONLY_STOP_AFTER_LAST_STEP"
# A bound on redone steps a NOTICE states (worker/daemon/checkpoint_schedule.cc).
STATED_BOUND = re.compile(r"a lost worker redoes up to (\d+) steps")
# Lines of the worker daemon's log counted in the summary's `worker_log`.
WORKER_LOG_LINES = {
    "already_exists_retries": "registration refused: ",
    "reregistered_after_not_found": "; registering again",
    "heartbeats_refused_registered_afresh": "registering as a new worker",
    "adopted": "; the coordinator adopted ",
}


def log(message):
    print(f"soak: {message}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_time(text):
    """Seconds since the epoch of a protobuf JSON Timestamp ("2024-05-01T12:00:00.123456789Z")."""
    base, _, fraction = text.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S"))
    return seconds + (float("0." + fraction) if fraction else 0.0)


def median(values):
    return round(statistics.median(values), 3) if values else None


class JobHistory:
    """One job's event history (`zeroshard watch --output=json`), for the per-kill figures."""

    def __init__(self, events):
        self.states = []  # (time, state) of STATE_CHANGED events
        self.generations = []  # (time, generation) of GENERATION_STARTED events
        self.progress = []  # (time, generation, step) of PROGRESS events
        for event in events:
            try:
                at = parse_time(event.get("time", ""))
            except ValueError:
                continue
            kind = event.get("type")
            if kind == "STATE_CHANGED":
                self.states.append((at, event.get("state", "")))
            elif kind == "GENERATION_STARTED":
                self.generations.append((at, int(event.get("generation", 0))))
            elif kind == "PROGRESS":
                self.progress.append((at, int(event.get("generation", 0)),
                                      int(event.get("progress", {}).get("step", 0))))
        self.ended_at = next((at for at, state in self.states if state in FINAL_STATES), None)

    def at_kill(self, kill_time):
        """(running, recovered_at or None, steps redone, the first PROGRESS event after the kill
        or None) for a kill at `kill_time` (see the module's docstring); (False, None, 0, None)
        when the job was not RUNNING then."""
        state = None
        for at, s in self.states:
            if at > kill_time:
                break
            state = s
        if state != "RUNNING":
            return False, None, 0, None
        generation = 0
        for at, g in self.generations:
            if at > kill_time:
                break
            generation = g
        baseline = 0
        for at, g, step in self.progress:
            if at > kill_time:
                break
            if g == generation:
                baseline = step
        recovered_at, redone, first_after = None, 0, None
        for at, g, step in self.progress:
            if at <= kill_time:
                continue
            if first_after is None:
                first_after = (at, g, step)
            if step > baseline:
                recovered_at = at
                break
        if first_after is not None and first_after[1] > generation:
            redone = max(0, baseline - (first_after[2] - 1))
        if self.ended_at is not None and self.ended_at > kill_time:
            recovered_at = self.ended_at if recovered_at is None else min(recovered_at,
                                                                          self.ended_at)
        return True, recovered_at, redone, first_after


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
        # TLS and tokens: a CA, the coordinator's certificate and a token per role.
        self.credentials = (cluster.Credentials(os.path.join(log_dir, "tls"), tls=True,
                                                tokens=True, worker_certs=[])
                            if args.security else None)
        self.address = f"127.0.0.1:{free_port()}"
        self.starts = {}  # process name -> how many times it was started
        self.processes = {}  # name -> cluster.Process (the current one)
        self.restart_at = {}  # name -> monotonic time it is to be started again
        self.crash_restarts = set()  # names whose pending restart follows a crash, not a kill
        self.jobs = {}  # id -> {"state", "message", "generation", "every_steps"}
        self.kills = []  # {"time": wall clock, "target": name} in kill order
        self.counts = {
            "submitted": 0,
            "acknowledged": 0,
            "coordinator_kills": 0,
            "worker_kills": 0,
            "restarts": 0,
            "worker_crashes": 0,
            "coordinator_crashes": 0,
            "workers_restarted_by_hand": 0,
            "coordinator_restarted_by_hand": 0,
        }
        # --security: workers that stop themselves after a job's last step until killed there.
        self.stop_after_last_step = (
            {f"worker-{i}" for i in range(args.workers)} if args.security else set())
        self.counts["kills_after_last_step"] = 0
        self.crashed = []  # "name: exit status" of processes that exited by themselves
        self.unregistered_at_end = []
        self.job_number = 0

    # --- processes ------------------------------------------------------------------------

    def _argv(self, name):
        if name == "coordinator":
            argv = [
                self.binaries["coordinator"],
                f"--listen={self.address}",
                "--metrics_port=0",
                f"--state_dir={self.state_dir}",
                f"--checkpoint_root={self.checkpoint_root}",
            ]
            return argv + (self.credentials.coordinator_flags() if self.credentials else [])
        argv = [
            self.binaries["worker"],
            f"--coordinator={self.address}",
            "--device=cpu",
            f"--name={name}",
            "--threads=1",
            f"--checkpoint_root={self.checkpoint_root}",
            # Its name is held by proof: restarted after a kill, it proves it with this.
            f"--identity_file={os.path.join(self.log_dir, name + '.identity')}",
        ]
        # The worker role's token (and the CA): workers never hold a broader one.
        return argv + (self.credentials.worker_flags(name) if self.credentials else [])

    def start(self, name):
        count = self.starts.get(name, 0)
        self.starts[name] = count + 1
        env = dict(os.environ)
        env["OPENBLAS_NUM_THREADS"] = "1"
        env.pop("ZEROSHARD_TOKEN", None)  # only the token files given on the command line
        env.pop(STOP_AFTER_LAST_STEP, None)
        if name in self.stop_after_last_step:
            env[STOP_AFTER_LAST_STEP] = "1"
        log_path = os.path.join(self.log_dir, f"{name}.{count}.log")
        process = cluster.Process(name, self._argv(name), log_path, env)
        self.processes[name] = process
        self.restart_at.pop(name, None)

    def names(self):
        return ["coordinator"] + [f"worker-{i}" for i in range(self.args.workers)]

    def kill(self, name, after_last_step=False):
        process = self.processes[name]
        self.kills.append({"time": time.time(), "target": name, "after_last_step": after_last_step})
        process.signal_group(signal.SIGKILL)
        process.popen.wait()
        process.close_log()
        self.counts["coordinator_kills" if name == "coordinator" else "worker_kills"] += 1
        self.restart_at[name] = time.monotonic() + self.rng.uniform(0.5, 2.0)

    @staticmethod
    def stopped(process):
        """Whether the process stopped itself (state T in /proc/PID/stat)."""
        try:
            with open(f"/proc/{process.popen.pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] == "T"
        except (OSError, IndexError):
            return False

    def tend_processes(self):
        """Starts again what is due; kills a worker that stopped itself after a job's last step
        (--security); notices processes that exited without being killed."""
        now = time.monotonic()
        for name in sorted(self.stop_after_last_step):
            process = self.processes.get(name)
            if name in self.restart_at or process is None or process.exited():
                continue
            if self.stopped(process):
                log(f"kill -9 {name} (stopped after a job's last step)")
                self.stop_after_last_step.discard(name)
                self.counts["kills_after_last_step"] += 1
                self.kill(name, after_last_step=True)
        now = time.monotonic()
        for name in self.names():
            if name in self.restart_at:
                if now >= self.restart_at[name]:
                    self.start(name)
                    if name in self.crash_restarts:
                        self.crash_restarts.discard(name)
                        self.counts["coordinator_restarted_by_hand" if name == "coordinator"
                                    else "workers_restarted_by_hand"] += 1
                        log(f"{name} restarted by hand (it was not killed)")
                    else:
                        self.counts["restarts"] += 1
                continue
            process = self.processes[name]
            if process.exited():
                self.counts["coordinator_crashes" if name == "coordinator"
                            else "worker_crashes"] += 1
                self.crashed.append(f"{name}: exit status {process.popen.returncode} "
                                    f"({process.log_path})")
                log(f"{name} exited by itself with status {process.popen.returncode} "
                    f"(log: {process.log_path})")
                process.close_log()
                self.crash_restarts.add(name)
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
        """(exit status, output); (None, output so far) when it timed out."""
        security = self.credentials.client_flags("submitter") if self.credentials else []
        env = dict(os.environ)
        env.pop("ZEROSHARD_TOKEN", None)
        try:
            result = subprocess.run(
                [self.binaries["client"], f"--coordinator={self.address}", *security, *args],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                env=env)
        except subprocess.TimeoutExpired as e:
            output = e.stdout or b""
            return None, output.decode(errors="replace") if isinstance(output, bytes) else output
        return result.returncode, result.stdout + result.stderr

    def submit(self):
        model = self.rng.choice(MODELS[self.args.models])
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

    def registered_workers(self):
        """Names of IDLE or BUSY workers in `zeroshard workers`, or None when the CLI fails."""
        status, output = self.cli("workers", timeout=15)
        if status != 0:
            return None
        names = set()
        for line in output.splitlines()[1:]:  # the first line is the table's header
            fields = line.split()
            if len(fields) >= 5 and fields[4] in ("IDLE", "BUSY"):
                names.add(fields[1])
        return names

    # --- the run --------------------------------------------------------------------------

    def wait_until_serving(self):
        """Until the coordinator answers, so that the first submissions are not refused."""
        deadline = time.monotonic() + 60
        while True:
            status, output = self.cli("workers", timeout=15)
            if status == 0:
                return
            if time.monotonic() >= deadline:
                raise cluster.ClusterError("the coordinator did not serve within 60 s: "
                                           + output.strip()[-300:])
            time.sleep(0.2)

    def wait_for_registered_workers(self, seconds=60):
        """After the drain: every worker process registered again (restarts still due first).
        Leaves the names still missing in self.unregistered_at_end."""
        wanted = {n for n in self.names() if n != "coordinator"}
        deadline = time.monotonic() + seconds
        missing = wanted
        while time.monotonic() < deadline:
            self.tend_processes()
            if self.coordinator_up():
                registered = self.registered_workers()
                if registered is not None:
                    missing = wanted - registered
                    if not missing:
                        break
            time.sleep(1.0)
        self.unregistered_at_end = sorted(missing)
        if missing:
            log(f"not registered {seconds} s after the drain: {', '.join(sorted(missing))}")

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
        self.wait_for_registered_workers()
        # The final word on every job (a lost job is looked up again: the coordinator may
        # have been down when it was last asked).
        for job_id in self.jobs:
            for _ in range(5):
                if self.refresh(job_id):
                    break
                time.sleep(2.0)

    # --- the summary ----------------------------------------------------------------------

    def events(self, job_id):
        """The job's events; for a job that has not ended, those replayed within 20 s."""
        ended = self.jobs[job_id]["state"] in FINAL_STATES
        status, output = self.cli("watch", job_id, "--output=json", timeout=60 if ended else 20)
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
    def steps_lost(events, every_steps):
        """Steps re-run after each recovery: before each generation's first reported step, the
        highest step reported so far minus the step that generation resumed from; each as
        (steps, the bound stated for the generation that had reached that highest step: 2 x
        every_steps, or the largest one its NOTICEs stated)."""
        first, highest, stated = {}, {}, {}
        for event in events:
            generation = int(event.get("generation", 0))
            if event.get("type") == "NOTICE":
                for bound in STATED_BOUND.findall(event.get("message", "")):
                    stated[generation] = max(stated.get(generation, 0), int(bound))
            if event.get("type") != "PROGRESS":
                continue
            step = int(event.get("progress", {}).get("step", 0))
            first.setdefault(generation, step)
            first[generation] = min(first[generation], step)
            highest[generation] = max(highest.get(generation, 0), step)
        lost, reached, reached_bound = [], 0, 0
        for generation in sorted(first):
            if reached > 0:
                lost.append((max(0, reached - (first[generation] - 1)), reached_bound))
            if highest[generation] > reached:
                reached = highest[generation]
                reached_bound = max(2 * every_steps, stated.get(generation, 0))
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

    def per_kill(self, histories):
        """Each kill's jobs, recovery time and steps redone (see the module's docstring)."""
        kills = []
        credited = set()  # (job, first PROGRESS event after a kill) whose redone steps are counted
        for kill in self.kills:
            recovered, redone, running, unrecovered = kill["time"], 0, [], []
            for job_id, history in sorted(histories.items()):
                was_running, recovered_at, job_redone, first_after = history.at_kill(kill["time"])
                if not was_running:
                    continue
                running.append(job_id)
                # Kills in a row with no report between them: the first one gets the steps.
                if (job_id, first_after) not in credited:
                    credited.add((job_id, first_after))
                    redone += job_redone
                if recovered_at is None:
                    unrecovered.append(job_id)
                else:
                    recovered = max(recovered, recovered_at)
            entry = dict(kill, running_jobs=running, steps_redone=redone)
            if running and not unrecovered:
                entry["recovery_seconds"] = round(recovered - kill["time"], 3)
            if unrecovered:
                entry["unrecovered_jobs"] = unrecovered
            kills.append(entry)
        return kills

    def worker_log_counts(self):
        counts = dict.fromkeys(WORKER_LOG_LINES, 0)
        for name in sorted(os.listdir(self.log_dir)):
            if not (name.startswith("worker-") and name.endswith(".log")):
                continue
            with open(os.path.join(self.log_dir, name), errors="replace") as f:
                for line in f:
                    for key, text in WORKER_LOG_LINES.items():
                        counts[key] += text in line
        return counts

    def summary(self):
        states = [entry["state"] for entry in self.jobs.values()]
        ends = {"coordinator_restart": 0, "worker_lost": 0, "run_failed": 0, "other": 0}
        per_recovery, over_interval, failures, adoptions = [], 0, [], 0
        over_stated = []
        histories = {}
        for job_id, entry in sorted(self.jobs.items()):
            if entry["state"] == "LOST":
                continue
            events = self.events(job_id)
            histories[job_id] = JobHistory(events)
            if entry["state"] not in FINAL_STATES:
                continue
            for event in events:
                if event.get("type") != "STATE_CHANGED":
                    continue
                if event.get("state") == "RECOVERING":
                    ends[self.generation_end_cause(event.get("message", ""))] += 1
                elif "adopted after a coordinator restart" in event.get("message", ""):
                    adoptions += 1
            for lost, bound in self.steps_lost(events, entry["every_steps"]):
                per_recovery.append(lost)
                over_interval += lost > entry["every_steps"]
                if lost > bound:
                    over_stated.append(f"{job_id}: {lost} steps redone, {bound} stated")
            if entry["state"] != "SUCCEEDED":
                failures.append(f"{job_id} {entry['state']}: {entry['message'][:300]}")
        kills = self.per_kill(histories)
        with open(os.path.join(self.log_dir, "kills.json"), "w") as f:
            json.dump(kills, f, indent=1)
        recovery = [k["recovery_seconds"] for k in kills if "recovery_seconds" in k]
        redone = [k["steps_redone"] for k in kills if k["running_jobs"]]
        generations = sum(entry["generation"] for entry in self.jobs.values())
        started = sum(1 for entry in self.jobs.values() if entry["generation"] > 0)
        crashes = self.counts["worker_crashes"] + self.counts["coordinator_crashes"]
        return {
            "soak": "zeroshard",
            "security": self.args.security,
            "minutes": self.args.minutes,
            "workers": self.args.workers,
            "seed": self.args.seed,
            "models": self.args.models,
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
            "steps_lost": sum(per_recovery),
            "steps_lost_max_recovery": max(per_recovery, default=0),
            "steps_lost_median_recovery": median(per_recovery),
            "recoveries_losing_more_than_every_steps": over_interval,
            "recoveries_over_stated_bound": len(over_stated),
            "over_stated_bound": over_stated,
            "kills_after_last_step": self.counts["kills_after_last_step"],
            "kills_with_running_jobs": sum(1 for k in kills if k["running_jobs"]),
            "steps_redone_per_kill_median": median(redone),
            "steps_redone_per_kill_max": max(redone, default=0),
            "recovery_seconds_median": median(recovery),
            "recovery_seconds_max": max(recovery, default=None),
            "unrecovered_kills": sum(1 for k in kills if "unrecovered_jobs" in k),
            "coordinator_kills": self.counts["coordinator_kills"],
            "worker_kills": self.counts["worker_kills"],
            "restarts": self.counts["restarts"],
            "crashes": crashes,
            "worker_crashes": self.counts["worker_crashes"],
            "coordinator_crashes": self.counts["coordinator_crashes"],
            "workers_restarted_by_hand": self.counts["workers_restarted_by_hand"],
            "coordinator_restarted_by_hand": self.counts["coordinator_restarted_by_hand"],
            "workers_unregistered_at_end": self.unregistered_at_end,
            "worker_log": self.worker_log_counts(),
            "crashed": self.crashed,
            "failures": failures,
            "log_dir": self.log_dir,
        }


def passed(args, result):
    """The exit status's test (see the module's docstring)."""
    ok = result["lost"] == 0 and result["stuck"] == 0
    if args.security:
        ok = ok and result["crashes"] == 0 and result["workers_restarted_by_hand"] == 0 \
            and not result["workers_unregistered_at_end"] \
            and result["recoveries_over_stated_bound"] == 0 and result["kills_after_last_step"] >= 1
    return ok


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="soak.py", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=None,
                        help="how long kills go on (required unless --ci)")
    parser.add_argument("--security", action="store_true",
                        help="TLS and tokens: workers on the worker role, the CLI a submitter")
    parser.add_argument("--ci", action="store_true",
                        help="the short run for CI: " + " ".join(
                            f"--{k} {v}" for k, v in CI_DEFAULTS.items()) +
                        " unless given")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default 4)")
    parser.add_argument("--concurrent_jobs", type=int, default=None,
                        help="jobs kept in flight (default 2)")
    parser.add_argument("--kill_interval", type=float, default=None,
                        help="mean seconds between kills (default 10)")
    parser.add_argument("--coordinator_share", type=float, default=0.3,
                        help="probability that a kill hits the coordinator (default 0.3)")
    parser.add_argument("--max_attempts", type=int, default=100,
                        help="each job's max_attempts (generations it may start; default 100)")
    parser.add_argument("--drain_minutes", type=float, default=None,
                        help="how long jobs in flight may take to end after the kills stop "
                        "(default 5)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seeds the kills and the jobs (default 1)")
    parser.add_argument("--models", choices=sorted(MODELS), default=None,
                        help="the jobs' models: default (a few hundred steps) or short (--ci's: "
                        "jobs of 10 to 20 s)")
    parser.add_argument("--bin_dir", default=None,
                        help="directory of the coordinator/, client/ and worker/ binaries "
                        "(default: as deploy/local/cluster.py)")
    parser.add_argument("--log_dir", default=None,
                        help="logs, state, checkpoints (default: a new directory under /tmp)")
    args = parser.parse_args(argv)
    for key, value in (CI_DEFAULTS if args.ci else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.minutes is None:
        parser.error("--minutes is required (or --ci)")
    if args.workers < 2:
        parser.error("--workers must be at least 2 (jobs run on 1 to 3 workers)")
    if args.minutes <= 0 or args.kill_interval <= 0:
        parser.error("--minutes and --kill_interval must be positive")
    return args


def copy_binaries(binaries, log_dir):
    """The binaries copied under LOG_DIR/bin: every (re)start runs the same build, whatever a
    `bazel build` does to --bin_dir meanwhile."""
    copies = {}
    for key, path in binaries.items():
        copy = os.path.join(log_dir, "bin", cluster.BINARIES[key])
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copy2(path, copy)
        copies[key] = copy
    return copies


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
    binaries = copy_binaries(binaries, log_dir)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    soak = None
    try:
        soak = Soak(args, binaries, log_dir)
        soak.run()
        result = soak.summary()
    except cluster.ClusterError as e:
        log(f"error: {e}")
        return 1
    finally:
        if soak is not None:
            soak.stop_all()
    print(json.dumps(result), flush=True)
    return 0 if passed(args, result) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
