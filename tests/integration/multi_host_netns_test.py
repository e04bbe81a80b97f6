#!/usr/bin/env python3
"""Multi-host, for real (issue 15, item 4): a coordinator and two workers on three "hosts" that are
Linux network namespaces joined by a bridge, with TLS and tokens on the coordinator's port.

    bazel test //tests/integration:multi_host_netns_test   (the runfiles' binaries)
    sudo ZEROSHARD_BIN_DIR=.bazel/bin /usr/bin/python3 tests/integration/multi_host_netns_test.py

Four namespaces named zs-mh-*: a router holding the bridge zs-br, and hosts h0, h1, h2, each joined
to the bridge by a veth pair made inside the router (nothing is made in the root namespace), on
198.18.77.0/24 (RFC 2544's benchmarking range). h0 runs the coordinator on 198.18.77.1, h1 and h2
one worker each with distinct --host names and --listen_host set to their own address. Checks:

1. the same `seed` job succeeds on loopback (root namespace) and across the hosts with bitwise
   the same final parameters (`zeroshard export`);
2. at each rendezvous, each worker's collective listeners are on its own address (none on
   127.0.0.1 or the wildcard), and mid-job the workers' connections to each other run between the
   two host addresses;
3. taking h2's link down at the bridge mid-job lets its lease expire (DEAD), and the fault policy
   runs: the job goes RECOVERING and its generation 2 runs on the survivor (then it is cancelled,
   to keep the test short).

Needs root and working `ip netns` (skipped, with the reason printed, otherwise). Leftovers with the
zs-mh- prefix from a killed run are removed first; everything made here is removed at the end,
on failure and on SIGTERM/SIGINT/SIGHUP too. Python 3 standard library, `ip` and `openssl` only.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
sys.path.insert(0, os.path.join(REPO_ROOT, "python", "tests"))  # Bazel adds it as a dep too
import safetensors_file  # noqa: E402  (no PyPI package in CI)
from cluster_support import load_cluster_module, runfiles_workspace, wait_until  # noqa: E402

PREFIX = "zs-mh-"
ROUTER = PREFIX + "router"
HOSTS = [PREFIX + "h0", PREFIX + "h1", PREFIX + "h2"]
BRIDGE = "zs-br"
SUBNET_PREFIX_LEN = 24
ADDRESSES = ["198.18.77.1", "198.18.77.2", "198.18.77.3"]
COORDINATOR_PORT = 50051
WORKER_NAMES = ["worker-1", "worker-2"]  # on HOSTS[1] and HOSTS[2]

# Short leases, so that a worker cut off is DEAD within about a second; long enough that a pause
# by the rendezvous hook (resumed within a 10 ms poll) keeps its lease on a loaded machine.
HEARTBEAT_PERIOD_MS = 200
MISSED_HEARTBEATS = 5
LEASE_S = HEARTBEAT_PERIOD_MS * MISSED_HEARTBEATS / 1000

# The job compared with loopback: the `seed` preset on 2 workers, zero2 (the reduce-scatter and
# all-gather both cross the hosts).
COMPARED_JOB = {
    "workload": {"preset": "seed", "dataset_size": 1024},
    "optimizer": {"kind": "ADAMW", "lr": 0.01},
    "mode": "ZERO2",
    "min_workers": 2,
    "max_workers": 2,
    "steps": 30,
    "global_batch": 128,
    "seed": 7,
}
# The faulted job: long enough never to finish on its own (it is cancelled once the fault policy
# has run), with checkpoints so that generation 2 resumes from one, and room to go on with one
# worker.
FAULT_JOB = dict(COMPARED_JOB, steps=1000000, min_workers=1, max_attempts=2,
                 checkpoint={"every_steps": 20})
# The link goes down once the job has passed this step with a committed checkpoint.
FAULT_MIN_STEP = 40

START_DEADLINE_S = 30
JOB_DEADLINE_S = 60
STOP_DEADLINE_S = 5


class CheckFailed(AssertionError):
    """A check of the test failed (unittest reports it as a failure)."""


class Skipped(Exception):
    pass


class Terminated(Exception):
    """Raised by the signal handler so that the cleanup in `finally` runs."""


def log(message):
    print(f"multi_host_netns_test: {message}", file=sys.stderr, flush=True)


def run(argv, check=True, timeout=30):
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise CheckFailed(f"{' '.join(argv)} exited with {result.returncode}: "
                          f"{result.stderr.strip()}")
    return result


# --- network namespaces ----------------------------------------------------------------------


def our_namespaces():
    listed = run(["ip", "netns", "list"], check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith(PREFIX)]


def remove_namespaces():
    """Kills every process in a zs-mh-* namespace and deletes it (its veths go with it). Never
    raises: it runs on the way out of failures."""
    for namespace in our_namespaces():
        pids = run(["ip", "netns", "pids", namespace], check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        deleted = run(["ip", "netns", "del", namespace], check=False)
        if deleted.returncode != 0:
            log(f"could not delete namespace {namespace}: {deleted.stderr.strip()}")


def make_network():
    """The router with its bridge, and each host joined to it by a veth pair (both ends made in
    the router, the host's end moved into the host): the root namespace gets no link or address."""
    for namespace in [ROUTER] + HOSTS:
        run(["ip", "netns", "add", namespace])
        run(["ip", "-n", namespace, "link", "set", "lo", "up"])
    run(["ip", "-n", ROUTER, "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "-n", ROUTER, "link", "set", BRIDGE, "up"])
    for index, host in enumerate(HOSTS):
        bridge_end = bridge_port(index)
        run(["ip", "-n", ROUTER, "link", "add", bridge_end, "type", "veth", "peer", "name",
             "eth0", "netns", host])
        run(["ip", "-n", ROUTER, "link", "set", bridge_end, "master", BRIDGE])
        run(["ip", "-n", ROUTER, "link", "set", bridge_end, "up"])
        run(["ip", "-n", host, "addr", "add", f"{ADDRESSES[index]}/{SUBNET_PREFIX_LEN}", "dev",
             "eth0"])
        run(["ip", "-n", host, "link", "set", "eth0", "up"])
    # The bridge runs no STP, so its ports forward at once: no wait here (the workers' registration
    # through it is waited for).


def bridge_port(host_index):
    return f"h{host_index}-port"


def root_namespace_links():
    return run(["ip", "-o", "link"]).stdout


# --- credentials -----------------------------------------------------------------------------


def make_credentials(directory):
    """deploy/local/cluster.py's CA, coordinator certificate (for its namespace address and
    127.0.0.1, so that the loopback run uses the same files) and a token per role."""
    return load_cluster_module().Credentials(directory, tls=True, tokens=True, worker_certs=(),
                                             server_names=(ADDRESSES[0], "127.0.0.1"))


# --- processes -------------------------------------------------------------------------------


class Process:
    """A child in its own session (process group), output appended to one log file."""

    def __init__(self, name, argv, log_path, extra_env):
        self.name = name
        self.log_path = log_path
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **extra_env)
        with open(log_path, "ab") as log_file:
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_file,
                                          stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)

    @property
    def pid(self):
        return self.popen.pid

    def signal_group(self, sig):
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, lines=15):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read().splitlines()[-lines:]
        except OSError as e:
            return [f"(cannot read {self.log_path}: {e.strerror})"]


def in_namespace(namespace, argv):
    # `ip netns exec` execs the command in place: the child's pid is the binary's.
    return argv if namespace is None else ["ip", "netns", "exec", namespace] + argv


class Cluster:
    """One coordinator and two workers, each in a namespace (or all in the root namespace on
    loopback). Not thread-safe: used from the test's main thread only."""

    def __init__(self, name, binaries, credentials, base_dir, namespaces, addresses,
                 worker_env=None):
        self.name = name
        self.binaries = binaries
        self.credentials = credentials
        self.dir = os.path.join(base_dir, name)
        self.namespaces = namespaces  # coordinator's, then each worker's (None: root)
        self.addresses = addresses
        self.worker_env = worker_env or {}
        self.checkpoint_root = os.path.join(self.dir, "checkpoints")
        self.processes = []
        self.coordinator = None
        self.workers = []
        self.target = None
        # A worker the test cut off: its exit is no failure.
        self.dead_on_purpose = None

    def start(self):
        os.makedirs(self.checkpoint_root)
        port_file = os.path.join(self.dir, "coordinator.ports")
        # On loopback a free port; in h0 the namespace is fresh, so the documented port is free.
        port = 0 if self.namespaces[0] is None else COORDINATOR_PORT
        argv = [self.binaries["coordinator"], f"--listen={self.addresses[0]}:{port}",
                "--metrics_port=0", f"--state_dir={self.dir}/state", f"--port_file={port_file}",
                f"--checkpoint_root={self.checkpoint_root}",
                f"--heartbeat_period={HEARTBEAT_PERIOD_MS}ms",
                f"--missed_heartbeats={MISSED_HEARTBEATS}"] + self.credentials.coordinator_flags()
        self.coordinator = self._spawn("coordinator", self.namespaces[0], argv)

        def serving_port():
            self._check_running()
            try:
                with open(port_file) as f:
                    fields = f.read().split()
            except FileNotFoundError:
                return None
            return int(fields[0]) if len(fields) == 2 and int(fields[0]) > 0 else None

        port = wait_until(serving_port, START_DEADLINE_S, "the coordinator to serve")
        self.target = f"{self.addresses[0]}:{port}"
        for index, name in enumerate(WORKER_NAMES, start=1):
            argv = [self.binaries["worker"], f"--coordinator={self.target}", "--device=cpu",
                    f"--name={name}", f"--host={self.host_name(index)}",
                    f"--listen_host={self.addresses[index]}",
                    f"--checkpoint_root={self.checkpoint_root}",
                    *self.credentials.client_flags("worker")]
            self.workers.append(self._spawn(name, self.namespaces[index], argv, self.worker_env))
        wait_until(lambda: self._check_running() or
                   all(self.worker_state(n) == "IDLE" for n in WORKER_NAMES),
                   START_DEADLINE_S, f"{WORKER_NAMES} to be IDLE", poll_s=0.2)

    def host_name(self, index):
        return f"{self.name}-host-{index}"

    def _spawn(self, name, namespace, argv, extra_env=None):
        process = Process(name, in_namespace(namespace, argv),
                          os.path.join(self.dir, f"{name}.log"), extra_env or {})
        self.processes.append(process)
        return process

    def _check_running(self):
        for process in self.processes:
            if process.popen.poll() is not None and process is not self.dead_on_purpose:
                raise CheckFailed(f"{self.name}: {process.name} exited with status "
                                  f"{process.popen.returncode}")
        return False

    def cli(self, role, *args, timeout=30):
        """The `zeroshard` CLI, run in the coordinator's namespace (a client on host 0)."""
        argv = [self.binaries["client"], f"--coordinator={self.target}",
                *self.credentials.client_flags(role), *args]
        return run(in_namespace(self.namespaces[0], argv), check=False, timeout=timeout)

    def workers_table(self):
        """{worker name: {column: value}} from `zeroshard workers` (columns ID, NAME, HOST,
        STATE, ...); empty when the CLI fails."""
        listed = self.cli("admin", "workers")
        if listed.returncode != 0:
            return {}
        lines = listed.stdout.splitlines()
        header = lines[0].split() if lines else []
        table = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split()))
            if "NAME" in row:
                table[row["NAME"]] = row
        return table

    def worker_state(self, name):
        return self.workers_table().get(name, {}).get("STATE")

    def submit(self, job_name, spec):
        path = os.path.join(self.dir, f"{job_name}.json")
        with open(path, "w") as f:
            json.dump(dict(spec, name=job_name), f)
        submitted = self.cli("submitter", "submit", path)
        if submitted.returncode != 0:
            raise CheckFailed(f"{self.name}: submit failed: {submitted.stderr.strip()}")
        return submitted.stdout.strip().splitlines()[-1]

    def get_job(self, job_id):
        got = self.cli("submitter", "get", job_id, "--output=json")
        if got.returncode != 0:
            raise CheckFailed(f"{self.name}: get {job_id} failed: {got.stderr.strip()}")
        return json.loads(got.stdout)

    def export(self, job_id):
        path = os.path.join(self.dir, f"{job_id}.safetensors")
        exported = self.cli("submitter", "export", job_id, f"--output={path}", timeout=60)
        if exported.returncode != 0:
            raise CheckFailed(f"{self.name}: export {job_id} failed: {exported.stderr.strip()}")
        tensors, _ = safetensors_file.read_safetensors(path)
        return tensors

    def stop(self):
        """SIGTERM to the workers, then the coordinator; SIGKILL after the deadline. Never
        raises."""
        # Cut off from the coordinator, it could not leave: no use waiting for it.
        if self.dead_on_purpose is not None:
            self.dead_on_purpose.signal_group(signal.SIGKILL)
        groups = [self.workers, [self.coordinator] if self.coordinator else []]
        for group in groups:
            for process in group:
                process.signal_group(signal.SIGTERM)
                # One paused by the rendezvous hook would only take the SIGTERM once resumed.
                process.signal_group(signal.SIGCONT)
            deadline = time.monotonic() + STOP_DEADLINE_S
            for process in group:
                try:
                    process.popen.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log(f"{self.name}: {process.name} still runs {STOP_DEADLINE_S}s after "
                        "SIGTERM: SIGKILL")
                    process.signal_group(signal.SIGKILL)
                    process.popen.wait()
        for process in self.processes:
            process.signal_group(signal.SIGKILL)

    def log_tails(self):
        for process in self.processes:
            print(f"--- last lines of {process.log_path} ---", file=sys.stderr)
            for line in process.tail():
                print(f"    {line}", file=sys.stderr)


def wait_for_final(cluster, job_id):
    def final():
        job = cluster.get_job(job_id)
        return job if job.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    return wait_until(final, JOB_DEADLINE_S, f"{cluster.name} job {job_id} to end", poll_s=0.2)


def progress_step(job):
    return int(job.get("progress", {}).get("step", 0))


# --- sockets ---------------------------------------------------------------------------------


def decode_address(hex_address):
    """/proc/net/tcp's "0100007F:1F90" as ("127.0.0.1", 8080); tcp6's addresses (four
    native-endian 32-bit words) as inet_ntop writes them, e.g. ("::", 8080), except that
    IPv4-mapped ones (a dual-stack socket's, such as gRPC's) read as IPv4: "::ffff:10.0.0.1" is
    "10.0.0.1"."""
    host, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(host[i:i + 8])[::-1] for i in range(0, len(host), 8))
    if len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":
        raw = raw[12:]
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port, 16)


TCP_ESTABLISHED = "01"
TCP_LISTEN = "0A"


def tcp_sockets(pid):
    """(state, local, remote) of the TCP sockets (IPv4 and IPv6) process `pid` holds, read from
    its own network namespace's /proc/<pid>/net/tcp{,6} and matched to its descriptors by
    inode."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    sockets = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    sockets.append((fields[3], decode_address(fields[1]),
                                    decode_address(fields[2])))
    return sockets


# The workers' test hook: each rank SIGSTOPs itself in every rendezvous once it has bound its
# collective listeners and published their addresses (worker/comm/gloo_mesh.cc). The listeners
# close once the pairs are connected, so that is when they can be seen.
STOP_HOOK_ENV = {"ZEROSHARD_TESTONLY_STOP_BEFORE_CONNECTING": "1"}


def process_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class RendezvousInspector:
    """Resumes workers stopped by the test hook, after recording the TCP listeners each holds at
    that moment (a worker's lease outlasts the pause: it is resumed within a poll period).

    Thread contract: start() and stop() from one thread; listeners() from any thread."""

    POLL_S = 0.01

    def __init__(self, workers):
        self._workers = workers
        self._lock = threading.Lock()
        self._listeners = {w.name: [] for w in workers}  # name -> [[(ip, port)] per stop]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._error = None

    def start(self):
        self._thread.start()

    def stop(self):
        """Ends the thread; the error that stopped an inspection, or None."""
        self._done.set()
        self._thread.join()
        return self._error

    def listeners(self):
        with self._lock:
            return {name: list(stops) for name, stops in self._listeners.items()}

    def _run(self):
        while not self._done.is_set():
            for worker in self._workers:
                if worker.popen.poll() is not None:
                    continue
                try:
                    if process_state(worker.pid) != "T":
                        continue
                    listening = [local for state, local, _ in tcp_sockets(worker.pid)
                                 if state == TCP_LISTEN]
                    with self._lock:
                        self._listeners[worker.name].append(listening)
                    os.kill(worker.pid, signal.SIGCONT)
                except Exception as e:  # noqa: BLE001 (a worker must never stay stopped)
                    self._error = self._error or f"{worker.name}: {e!r}"
                    try:
                        os.kill(worker.pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            self._done.wait(self.POLL_S)


def check_collective_sockets(cluster, listeners_at_stops):
    """At each rendezvous every worker listened on its own address only (not on 127.0.0.1 or the
    wildcard); mid-job the workers' connections to each other run between the two host addresses,
    each accepted on a port the accepting worker had listened on."""
    coordinator = (ADDRESSES[0], COORDINATOR_PORT)
    links = {}
    for index, (name, worker) in enumerate(zip(WORKER_NAMES, cluster.workers), start=1):
        own, peer = ADDRESSES[index], ADDRESSES[3 - index]
        stops = listeners_at_stops[name]
        if not stops or not all(stops):
            raise CheckFailed(f"{name}: listeners at its rendezvous stops: {stops}")
        stray = sorted({local for stop in stops for local in stop if local[0] != own})
        if stray:
            raise CheckFailed(f"{name} listened on {stray}, not only on its address {own}")
        links[name] = [(local, remote) for state, local, remote in tcp_sockets(worker.pid)
                       if state == TCP_ESTABLISHED and remote != coordinator]
        log(f"{name}: listened on {stops[-1]} at its last rendezvous; peer connections now "
            f"{links[name]}")
        if not links[name]:
            raise CheckFailed(f"{name} has no TCP connection to its peer mid-job")
        for local, remote in links[name]:
            if local[0] != own or remote[0] != peer:
                raise CheckFailed(f"{name}: connection {local} -> {remote} is not between "
                                  f"{own} and {peer}")
    # Pair each connection's two ends; the accepting end's port is one its worker listened on.
    ends = {(local, remote) for local, remote in links[WORKER_NAMES[1]]}
    for local, remote in links[WORKER_NAMES[0]]:
        if (remote, local) not in ends:
            raise CheckFailed(f"{WORKER_NAMES[0]}'s connection {local} -> {remote} has no end "
                              f"in {WORKER_NAMES[1]}")
    accepted = 0
    for name, worker_links in links.items():
        listened = {local for stop in listeners_at_stops[name] for local in stop}
        accepted += sum(1 for local, _ in worker_links if local in listened)
    if accepted == 0:
        raise CheckFailed("no peer connection ends on a port a worker listened on")
    log(f"collectives: {accepted} of {len(ends)} connections between {ADDRESSES[1]} and "
        f"{ADDRESSES[2]} accepted on a rendezvous listener")


# --- the test --------------------------------------------------------------------------------


def compare_parameters(loopback, netns):
    if list(loopback) != list(netns):
        raise CheckFailed(f"tensors differ: loopback {list(loopback)}, netns {list(netns)}")
    for name, tensor in loopback.items():
        other = netns[name]
        if (tensor.dtype, tensor.shape) != (other.dtype, other.shape):
            raise CheckFailed(f"{name}: loopback {tensor.dtype} {tensor.shape}, netns "
                              f"{other.dtype} {other.shape}")
        if tensor.data != other.data:
            raise CheckFailed(f"{name}: final parameters differ between loopback and netns")
    log(f"final parameters bitwise equal on loopback and across namespaces "
        f"({len(loopback)} tensors, {sum(len(t.data) for t in loopback.values())} bytes)")


def run_compared_job(cluster):
    job_id = cluster.submit("mh-compared", COMPARED_JOB)
    job = wait_for_final(cluster, job_id)
    if job["state"] != "SUCCEEDED":
        raise CheckFailed(f"{cluster.name}: job {job_id} ended {job['state']}: "
                          f"{job.get('message', '')}")
    if progress_step(job) != COMPARED_JOB["steps"]:
        raise CheckFailed(f"{cluster.name}: job {job_id} succeeded at step {progress_step(job)}")
    return cluster.export(job_id)


def check_hosts(cluster):
    table = cluster.workers_table()
    for index, name in enumerate(WORKER_NAMES, start=1):
        host = table.get(name, {}).get("HOST")
        if host != cluster.host_name(index):
            raise CheckFailed(f"{name} registered with host {host}, not {cluster.host_name(index)}")


def job_events(cluster, job_id):
    # The job has ended, so the watch replays its history and returns.
    watched = cluster.cli("submitter", "watch", job_id, "--output=json", timeout=30)
    return [json.loads(line) for line in watched.stdout.splitlines() if line.strip()]


def run_fault_job(cluster, inspector):
    job_id = cluster.submit("mh-fault", FAULT_JOB)
    def past_a_checkpoint():
        current = cluster.get_job(job_id)
        checkpoint = int(current.get("latest_checkpoint", {}).get("step", 0))
        return current if progress_step(current) >= FAULT_MIN_STEP and checkpoint > 0 else None

    job = wait_until(past_a_checkpoint, JOB_DEADLINE_S,
                     f"job {job_id} to pass step {FAULT_MIN_STEP} and commit a checkpoint",
                     poll_s=0.1)
    if job["state"] != "RUNNING" or int(job.get("generation", 0)) != 1:
        raise CheckFailed(f"job {job_id} is {job['state']} generation {job.get('generation')} "
                          "before the fault")
    check_collective_sockets(cluster, inspector.listeners())

    victim = WORKER_NAMES[1]  # on HOSTS[2]
    cut_at = time.monotonic()
    run(["ip", "-n", ROUTER, "link", "set", bridge_port(2), "down"])
    log(f"took {HOSTS[2]}'s link down at step >= {progress_step(job)}")
    wait_until(lambda: cluster.worker_state(victim) == "DEAD", LEASE_S + 10,
               f"{victim}'s lease to expire", poll_s=0.1)
    lease_ended_s = time.monotonic() - cut_at
    log(f"{victim} DEAD {lease_ended_s:.2f}s after its link went down (lease {LEASE_S:g}s)")
    # Its last heartbeat may have come up to a period before the cut.
    earliest_s = LEASE_S - HEARTBEAT_PERIOD_MS / 1000
    if lease_ended_s < earliest_s:
        raise CheckFailed(f"{victim} was DEAD {lease_ended_s:.2f}s after the cut, before its "
                          f"lease could expire ({earliest_s:g}s at the earliest)")

    def second_generation_progressing():
        current = cluster.get_job(job_id)
        if current["state"] in ("FAILED", "CANCELLED", "SUCCEEDED"):
            raise CheckFailed(f"job {job_id} ended {current['state']}: {current.get('message')}")
        if (current["state"] == "RUNNING" and int(current.get("generation", 0)) == 2
                and progress_step(current) > FAULT_MIN_STEP):
            return current
        return None

    job = wait_until(second_generation_progressing, JOB_DEADLINE_S,
                     f"job {job_id}'s generation 2 to make progress", poll_s=0.1)
    if job.get("worker_ids") != [cluster.workers_table()[WORKER_NAMES[0]]["ID"]]:
        raise CheckFailed(f"generation 2 runs on {job.get('worker_ids')}, not on the survivor "
                          f"{WORKER_NAMES[0]} alone")
    cancelled = cluster.cli("submitter", "cancel", job_id, "--reason=multi-host test done")
    if cancelled.returncode != 0:
        raise CheckFailed(f"cancel {job_id} failed: {cancelled.stderr.strip()}")
    job = wait_for_final(cluster, job_id)
    if job["state"] != "CANCELLED":
        raise CheckFailed(f"job {job_id} ended {job['state']} after cancel")

    # The recorded history: RUNNING (1), RECOVERING from a checkpoint, RUNNING (2), CANCELLED.
    states = [(e.get("state"), e.get("message", "")) for e in job_events(cluster, job_id)
              if e.get("type") == "STATE_CHANGED"]
    log(f"job {job_id} states: {states}")
    names = [state for state, _ in states]
    expected = ["PENDING", "RUNNING", "RECOVERING", "RUNNING", "CANCELLED"]
    if [n for n in names if n != "PENDING"] != expected[1:]:
        raise CheckFailed(f"job {job_id} went through {names}, expected {expected}")
    recovering = next(message for state, message in states if state == "RECOVERING")
    if "resuming from the checkpoint at step" not in recovering:
        raise CheckFailed(f"RECOVERING says {recovering!r}, not that it resumes from a checkpoint")


def main(binaries):
    if os.geteuid() != 0:
        raise Skipped("not root: making network namespaces needs root")
    try:
        remove_namespaces()
        probe = run(["ip", "netns", "add", PREFIX + "probe"], check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Skipped(f"cannot run `ip netns`: {e}") from None
    if probe.returncode != 0:
        raise Skipped(f"`ip netns add` failed: {probe.stderr.strip()}")
    run(["ip", "netns", "del", PREFIX + "probe"])

    base_dir = tempfile.mkdtemp(prefix="mh-", dir=os.environ.get("TEST_TMPDIR"))
    links_before = root_namespace_links()
    credentials = make_credentials(os.path.join(base_dir, "tls"))
    clusters = []
    inspector = None
    try:
        loopback = Cluster("loopback", binaries, credentials, base_dir, [None] * 3,
                           ["127.0.0.1"] * 3)
        clusters.append(loopback)
        loopback.start()
        loopback_params = run_compared_job(loopback)
        loopback.stop()
        log("loopback job succeeded")

        make_network()
        netns = Cluster("netns", binaries, credentials, base_dir, HOSTS, ADDRESSES,
                        worker_env=STOP_HOOK_ENV)
        clusters.append(netns)
        netns.start()
        inspector = RendezvousInspector(netns.workers)
        inspector.start()
        check_hosts(netns)
        compare_parameters(loopback_params, run_compared_job(netns))
        netns.dead_on_purpose = netns.workers[1]
        run_fault_job(netns, inspector)
    except AssertionError:  # a CheckFailed, or a wait_until that timed out
        for cluster in clusters:
            cluster.log_tails()
        raise
    finally:
        # A second signal must not cut the cleanup short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        inspection_error = inspector.stop() if inspector is not None else None
        for cluster in clusters:
            cluster.stop()
        remove_namespaces()
    if inspection_error is not None:
        raise CheckFailed(f"inspecting a stopped worker: {inspection_error}")
    left = our_namespaces()
    if left:
        raise CheckFailed(f"namespaces left behind: {left}")
    if root_namespace_links() != links_before:
        raise CheckFailed("the root namespace's links changed")
    survivors = processes_using(base_dir)
    if survivors:
        raise CheckFailed(f"processes left behind: {survivors}")
    log("nothing left behind: no zs-mh- namespace, root links unchanged, no process of the test")


def processes_using(base_dir):
    """Pids whose command line names `base_dir` (every process the test starts does)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if base_dir.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue  # gone meanwhile
    return found


def on_signal(signum, _frame):
    raise Terminated(signum)


class MultiHostNetnsTest(unittest.TestCase):
    def test_jobs_across_namespace_hosts(self):
        bin_dir = os.environ.get("ZEROSHARD_BIN_DIR") or runfiles_workspace()
        binaries = {
            "coordinator": os.path.join(bin_dir, "apps/coordinator/zeroshard-coordinator"),
            "worker": os.path.join(bin_dir, "worker/zeroshard-worker"),
            "client": os.path.join(bin_dir, "client/zeroshard"),
        }
        started = time.monotonic()
        try:
            main(binaries)
        except Skipped as e:
            print(f"SKIPPED: multi_host_netns_test: {e}", flush=True)
            self.skipTest(str(e))
        except CheckFailed as e:
            self.fail(str(e))
        log(f"PASS in {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    # A signal raises Terminated, so that main's cleanup runs before the test errors out.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    unittest.main()
