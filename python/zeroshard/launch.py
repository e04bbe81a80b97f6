"""Start a PyTorch training script on ZeroShard workers, like torchrun:

    zeroshard-launch --workers 2 train.py [script args...]
    python3 -m zeroshard.launch --workers 2 train.py [script args...]   (the same)

Without ZEROSHARD_COORDINATOR in the environment it starts a local cluster first (a coordinator
and --workers CPU workers: deploy/local/cluster.py, which the installed package carries as
zeroshard/_local_cluster.py) and stops it afterwards. pip does not install the C++ binaries: the
launcher takes them from --bin_dir, else $ZEROSHARD_BIN_DIR, else the first PATH directory that
holds zeroshard-coordinator, zeroshard-worker and zeroshard (run from a checkout: lastly that
checkout's build), and says which it used. A directory may hold them side by side or as Bazel lays
them out (bazel-bin). With ZEROSHARD_COORDINATOR=host:port it uses that cluster: the script's
ranks attach to IDLE workers on this host that serve attached trainers (their --attach_socket),
since a trainer shares memory with its worker. It uses only workers whose socket is a socket
of the workers' user served by a process of that user (the launcher's own user, root, or
--worker_user): anyone holding a worker token can register any host name and socket path, and
such a worker is skipped with a message naming it and who serves its socket. Each trainer checks
again, and checks that the worker that welcomes it is the one it was given.

With more than one rank, OMP_NUM_THREADS=1 is set for the trainers (and a local cluster's
workers) unless the environment sets it, as torchrun does.

It starts one trainer process per rank with ZEROSHARD_RANK, ZEROSHARD_WORLD_SIZE,
ZEROSHARD_WORKERS (the workers' names in rank order), ZEROSHARD_RUN_ID (the job's name),
ZEROSHARD_RUN_KEY (a random key the ranks find the job by: JobSpec.run_key) and
ZEROSHARD_ATTACH_SOCKET (its worker's socket) and ZEROSHARD_RESTART_COUNT (0, then 1, 2, ...
after restarts) set; rank 0's ShardedOptimizer submits the job. torchrun's variables are set too
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so the same script can also run
torch.distributed baselines (gloo) among its ranks.

If a trainer fails (exits non-zero or is killed), the others are stopped. While the job still
has attempts left (its fault policy, ShardedOptimizer's max_attempts) and --max_restarts allows,
every trainer is started again: the script joins the job and resumes from its latest
checkpoint. Otherwise the exit status is the first failure's. When every trainer exits 0 but the
job FAILED all the same (a trainer finished before its first step), the exit status is 1.

SIGTERM and SIGINT (kill, Ctrl-C) are passed on to everything the launcher started (the local
cluster, which stops its launcher's trainers and then its workers and coordinator; or the
trainers), nothing is restarted, the job (if it did not end) is cancelled, and the launcher exits
only once they have, by the same signal (a shell reports 128 + N), as torchrun does.
"""

import argparse
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import secrets
import uuid

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(PACKAGE_DIR))
BIN_DIR_ENV = "ZEROSHARD_BIN_DIR"
# torchrun's default for several ranks per node.
OMP_THREADS_ENV = "OMP_NUM_THREADS"
# Once every trainer exited 0, how long to wait for the job to end (its workers' final
# checkpoint and report) to see whether it failed all the same.
JOB_END_WAIT_S = 30.0
# After SIGTERM, how long a trainer may take to exit before SIGKILL.
TRAINER_STOP_GRACE_S = 10.0
# How long the local cluster waits for its command (this launcher, stopping its trainers) after
# passing a signal on, before it kills it: longer than the trainers' grace, so that the trainers
# are always stopped by the launcher that started them.
CLUSTER_STOP_TIMEOUT_S = TRAINER_STOP_GRACE_S + 10.0


class SignalForwarder:
    """SIGTERM and SIGINT while the launcher runs: the first one received is remembered, each is
    passed on to the children registered (the processes the launcher started), and once they
    have exited the launcher ends by that signal (exit()). Thread contract: the main thread
    (Python runs signal handlers there)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received = None
        self._children = []

    def install(self):
        for sig in SignalForwarder.SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def add(self, child):
        """Passes later signals on to `child` (a Popen), and one already received."""
        self._children.append(child)
        if self.received is not None:
            self._send(child, self.received)

    def _handle(self, signum, _frame):
        if self.received is None:
            self.received = signum
            log(f"got {signal.Signals(signum).name}: passing it on and waiting for what this "
                "launcher started to exit")
        for child in self._children:
            self._send(child, signum)

    @staticmethod
    def _send(child, signum):
        if child.returncode is None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    def exit(self):
        """Ends this process by the signal received, with its default action (killed by it, as
        a shell reports: 128 + N), once everything it started is gone."""
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(self.received, signal.SIG_DFL)
        os.kill(os.getpid(), self.received)
        # A default action that does not end the process (never for SIGTERM or SIGINT).
        sys.exit(128 + self.received)


_signals = None


def signals():
    """The process's SignalForwarder, installed at the first call."""
    global _signals
    if _signals is None:
        _signals = SignalForwarder().install()
    return _signals


def parse_args(argv, prog="python3 -m zeroshard.launch"):
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, required=True, help="ranks (trainers) to run")
    parser.add_argument("--bin_dir", default=None,
                        help="local cluster only: the directory of zeroshard-coordinator, "
                        "zeroshard-worker and zeroshard, side by side or as Bazel lays them out "
                        f"(default: ${BIN_DIR_ENV}, else PATH)")
    parser.add_argument("--log_dir", default=None,
                        help="local cluster only: logs, state and checkpoints")
    parser.add_argument("--worker_threads", type=int, default=None,
                        help="local cluster only: each worker's --threads")
    parser.add_argument("--worker_flag", action="append", default=[],
                        help="local cluster only: an extra flag for every worker (repeatable), "
                        "e.g. --worker_flag=--bucket_pool_size=1")
    parser.add_argument("--wait_s", type=float, default=60.0,
                        help="how long to wait for enough idle workers on this host")
    parser.add_argument("--max_restarts", type=int, default=3,
                        help="restart the trainers at most this many times (the job's "
                        "max_attempts bounds them too)")
    parser.add_argument("--restart_wait_s", type=float, default=180.0,
                        help="after a failure, how long to wait for the coordinator to end the "
                        "failed generation (a worker waits 120 s for a trainer that never "
                        "attaches)")
    parser.add_argument("--worker_user", default=None,
                        help="with ZEROSHARD_COORDINATOR: the user the workers run as when it is "
                        "not this one (they admit this user through --attach_group): a user "
                        "name or uid whose attach sockets are trusted; passed on as "
                        "$ZEROSHARD_WORKER_USER (default: as set, else this user and root only)")
    parser.add_argument("--token_file", default=None,
                        help="file whose first line is the token the trainers (rank 0 submits "
                        "the job) and this launcher present; passed on as $ZEROSHARD_TOKEN "
                        "(default: $ZEROSHARD_TOKEN as set)")
    parser.add_argument("--ca", default=None,
                        help="PEM file of the CA that signed the coordinator's certificate: "
                        "connect with TLS; passed on as $ZEROSHARD_CA")
    parser.add_argument("--cert", default=None,
                        help="PEM client certificate for mTLS (with --key); $ZEROSHARD_CERT")
    parser.add_argument("--key", default=None, help="PEM key of --cert; $ZEROSHARD_KEY")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.max_restarts < 0:
        parser.error("--max_restarts must be >= 0")
    if (args.cert is None) != (args.key is None):
        parser.error("--cert and --key go together")
    return args


def export_credentials(args, env):
    """Puts --token_file/--ca/--cert/--key into `env` (ZEROSHARD_TOKEN, ...), where the trainers
    and this launcher's own channels (zeroshard._channel) read them."""
    from zeroshard import _channel
    if args.token_file is not None:
        try:
            env[_channel.TOKEN_ENV] = _channel.read_token_file(args.token_file)
        except ValueError as e:
            sys.exit(f"zeroshard.launch: --{e}")
    for value, name in ((args.ca, _channel.CA_ENV), (args.cert, _channel.CERT_ENV),
                        (args.key, _channel.KEY_ENV)):
        if value is not None:
            if not os.path.isfile(value):
                sys.exit(f"zeroshard.launch: {value} ({name}) is not a file")
            env[name] = os.path.abspath(value)


def export_worker_user(args, env):
    """--worker_user into `env` ($ZEROSHARD_WORKER_USER), where this launcher's and the trainers'
    socket checks read it; exits naming the flag when no such user exists."""
    from zeroshard import _attach
    if args.worker_user is not None:
        env[_attach.WORKER_USER_ENV] = args.worker_user
    try:
        _attach.trusted_worker_uids(env)
    except ValueError as e:
        sys.exit(f"zeroshard.launch: --worker_user / {e}")


def local_cluster_script():
    """The local-cluster starter: the installed package's copy of deploy/local/cluster.py, else
    (run from a checkout or Bazel's runfiles) the checkout's."""
    for path in (os.path.join(PACKAGE_DIR, "_local_cluster.py"),
                 os.path.join(REPO_ROOT, "deploy", "local", "cluster.py")):
        if os.path.isfile(path):
            return path
    sys.exit("zeroshard.launch: ZEROSHARD_COORDINATOR is not set and this zeroshard package has "
             "no local-cluster starter (zeroshard/_local_cluster.py): install it with pip "
             "(docs/pytorch.md), or set ZEROSHARD_COORDINATOR to a running cluster")


def load_cluster_module(path):
    spec = importlib.util.spec_from_file_location("zeroshard_local_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def find_bin_dir(bin_dir_flag, cluster, environ=None):
    """(directory, where it came from) of the binaries a local cluster runs: --bin_dir, else
    $ZEROSHARD_BIN_DIR, else the first PATH directory holding all of them, else (from a checkout)
    its build. `cluster` is the cluster.py module (its find_binaries says what a
    directory must hold). Exits with what to do when none has them."""
    environ = os.environ if environ is None else environ

    def holds_binaries(directory):
        try:
            cluster.find_binaries(directory)
            return True
        except cluster.ClusterError:
            return False

    for directory, source in ((bin_dir_flag, "--bin_dir"),
                              (environ.get(BIN_DIR_ENV), f"${BIN_DIR_ENV}")):
        if directory:
            try:
                cluster.find_binaries(directory)
            except cluster.ClusterError as e:
                sys.exit(f"zeroshard.launch: {source} {directory}: {e}")
            return os.path.abspath(directory), source
    for directory in environ.get("PATH", "").split(os.pathsep):
        if directory and holds_binaries(directory):
            return os.path.abspath(directory), "PATH"
    checkout_build = cluster.default_bin_dir()
    if os.path.isdir(os.path.join(REPO_ROOT, "proto")) and holds_binaries(checkout_build):
        return checkout_build, "this checkout's build"
    names = ", ".join(os.path.basename(path) for path in cluster.BINARIES.values())
    sys.exit(f"zeroshard.launch: no ZeroShard binaries ({names}) to start a local cluster with: "
             f"pass --bin_dir, set {BIN_DIR_ENV}, or put them on PATH (a checkout builds them "
             f"with: {cluster.BUILD_COMMAND}; tools/install_binaries.sh copies them to "
             "PREFIX/bin; the container image has them in /usr/local/bin)")


def package_on_default_path():
    """Whether a child interpreter imports this package without PYTHONPATH (it is installed)."""
    import site
    installed = site.getsitepackages() + [site.getusersitepackages()]
    root = os.path.realpath(os.path.dirname(PACKAGE_DIR))
    return any(os.path.realpath(path) == root for path in installed)


def run_local_cluster(args):
    """Re-runs this launcher inside a local cluster (which sets ZEROSHARD_COORDINATOR)."""
    cluster = local_cluster_script()
    bin_dir, source = find_bin_dir(args.bin_dir, load_cluster_module(cluster))
    log(f"local cluster by {cluster}, binaries from {source}: {bin_dir}")
    command = [sys.executable, cluster, "--workers", str(args.workers), "--bin_dir", bin_dir,
               "--stop_timeout", str(CLUSTER_STOP_TIMEOUT_S)]
    if args.log_dir:
        command += ["--log_dir", args.log_dir]
    if args.worker_threads:
        command += ["--worker_threads", str(args.worker_threads)]
    command += [f"--worker_flag={flag}" for flag in args.worker_flag]
    command += ["--", sys.executable, "-m", "zeroshard.launch", "--workers", str(args.workers),
                "--wait_s", str(args.wait_s), "--max_restarts", str(args.max_restarts),
                "--restart_wait_s", str(args.restart_wait_s), args.script] + args.script_args
    env = dict(os.environ)
    if not package_on_default_path():  # run from a checkout (PYTHONPATH=python)
        package_root = os.path.dirname(PACKAGE_DIR)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [package_root, env.get("PYTHONPATH", "")] if p)
    # A signal goes to the cluster, which passes it to the launcher it runs (the trainers' one),
    # waits for it, and then stops its workers and coordinator.
    forwarder = signals()
    cluster_process = subprocess.Popen(command, env=env)
    forwarder.add(cluster_process)
    returncode = cluster_process.wait()
    if forwarder.received is not None:
        forwarder.exit()
    return exit_status(returncode)


def idle_attach_workers(coordinator, count, wait_s):
    """`count` IDLE workers on this host that serve attached trainers, by name; only those whose
    socket the workers' user serves (zeroshard._attach.probe_worker_socket): a worker token
    holder may register any host and socket path. Each refused worker is said once, naming it
    and what serves its socket."""
    from zeroshard import _attach
    from zeroshard._channel import coordinator_channel
    from zeroshard._proto.zeroshard.v1 import coordinator_pb2, coordinator_pb2_grpc, worker_pb2
    host = socket.gethostname()
    deadline = time.monotonic() + wait_s
    # (worker id, socket) -> None (trusted) or why not: each is probed once, so that waiting
    # for enough workers does not fill a real worker's listen backlog with probes.
    verdicts = {}

    def trusted(worker):
        key = (worker.id, worker.attach_socket)
        if key not in verdicts:
            try:
                _attach.probe_worker_socket(worker.attach_socket,
                                            f"worker {worker.name} ({worker.id})",
                                            name=worker.name)
                verdicts[key] = None
            except _attach.WrongWorker as e:
                verdicts[key] = str(e)
                log(f"not using worker {worker.name} ({worker.id}): {e}")
        return verdicts[key] is None

    with coordinator_channel(coordinator) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        while True:
            idle = []
            request = coordinator_pb2.ListWorkersRequest(state=worker_pb2.IDLE, page_size=1000)
            while True:  # every page
                response = stub.ListWorkers(request, timeout=30)
                idle.extend(response.workers)
                if not response.next_page_token:
                    break
                request.page_token = response.next_page_token
            candidates = sorted((w for w in idle if w.attach_socket and w.host == host),
                                key=lambda w: w.name)
            usable = [w for w in candidates if trusted(w)]
            if signals().received is not None:
                signals().exit()  # nothing started yet
            if len(usable) >= count:
                return usable[:count]
            if time.monotonic() >= deadline:
                skipped = len(candidates) - len(usable)
                sys.exit(f"zeroshard.launch: {len(usable)} idle workers with an attach socket on "
                         f"host {host}, {count} needed (start them with --attach_socket)" +
                         (f"; {skipped} more refused, their sockets not the workers' user's "
                          "(see above)" if skipped else ""))
            time.sleep(0.2)


def log(message):
    print(f"zeroshard.launch: {message}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def exit_status(returncode):
    """A child's exit status as a shell reports it (128 + N when signal N killed it)."""
    return returncode if returncode >= 0 else 128 - returncode


def run_attempt(args, workers, run_id, run_key, restart_count):
    """Runs one trainer per rank until all exit; when one fails, stops the others (their
    worker's run is over anyway). Returns 0 or the first failure's (rank, exit status)."""
    names = ",".join(w.name for w in workers)
    master_port = free_port()
    trainers = []
    for rank, worker in enumerate(workers):
        env = dict(os.environ)
        env.update({
            "ZEROSHARD_RANK": str(rank),
            "ZEROSHARD_WORLD_SIZE": str(args.workers),
            "ZEROSHARD_WORKERS": names,
            "ZEROSHARD_RUN_ID": run_id,
            "ZEROSHARD_RUN_KEY": run_key,
            "ZEROSHARD_ATTACH_SOCKET": worker.attach_socket,
            "ZEROSHARD_RESTART_COUNT": str(restart_count),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(args.workers),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
        })
        trainers.append(subprocess.Popen([sys.executable, args.script] + args.script_args,
                                         env=env))
        signals().add(trainers[-1])
    failure = None
    remaining = dict(enumerate(trainers))
    while remaining:
        if signals().received is not None:
            # The signal went to every trainer; what has not exited in the grace is killed.
            stop_trainers(remaining.values())
        for rank, trainer in list(remaining.items()):
            code = trainer.poll()
            if code is None:
                continue
            del remaining[rank]
            if code != 0 and failure is None:
                failure = (rank, exit_status(code))
                stop_trainers(remaining.values())
        time.sleep(0.05)
    return failure


def stop_trainers(trainers, grace_s=TRAINER_STOP_GRACE_S):
    """SIGTERM, then SIGKILL whatever is left after `grace_s`; returns once all have exited."""
    for trainer in trainers:
        if trainer.poll() is None:
            trainer.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for trainer in trainers:
        try:
            trainer.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            trainer.kill()
            trainer.wait()


def generation_after_failure(coordinator, job_name, job_key, failed_generation, wait_s):
    """After every trainer of `failed_generation` of job `job_name` (found by its run key
    `job_key`) is gone: the generation the
    restarted trainers will join, or None when the job will not run again (it ended, or the
    coordinator did not end the failed generation within `wait_s`)."""
    import grpc
    from zeroshard._channel import coordinator_channel
    from zeroshard._jobs import find_job
    from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc, job_pb2
    deadline = time.monotonic() + wait_s
    with coordinator_channel(coordinator) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        while True:
            try:
                job = find_job(stub, job_key)
            except grpc.RpcError as e:
                job = None
                if time.monotonic() >= deadline:
                    log(f"cannot ask the coordinator about job {job_name}: {e.code().name}")
                    return None
            else:
                if job is None:
                    # The script failed before rank 0 submitted it: the next try submits it.
                    log(f"no job {job_name} was submitted")
                    return failed_generation
                state = job_pb2.JobState.Name(job.state)
                if job.state in (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED):
                    log(f"job {job.id} ({job_name}) is {state}: {job.message}")
                    return None
                if job.state in (job_pb2.PENDING, job_pb2.RECOVERING):
                    log(f"job {job.id} ({job_name}) is {state} after attempt {job.attempts} of "
                        f"{job.spec.max_attempts}: {job.message}")
                    return job.generation + 1
                if job.generation > failed_generation:
                    log(f"job {job.id} ({job_name}) runs generation {job.generation}")
                    return job.generation
                if time.monotonic() >= deadline:
                    log(f"job {job.id} ({job_name}) still runs generation {job.generation}, "
                        f"whose trainers are gone, after {wait_s:g} s")
                    return None
            time.sleep(0.1)


def cancel_job(coordinator, job_name, job_key, signum):
    """Best effort, once the trainers are gone after a signal: cancels the job unless it ended,
    so that it does not start more generations that no trainer will join."""
    import grpc
    from zeroshard._channel import coordinator_channel
    from zeroshard._jobs import find_job
    from zeroshard._proto.zeroshard.v1 import coordinator_pb2, coordinator_pb2_grpc, job_pb2
    name = signal.Signals(signum).name
    try:
        with coordinator_channel(coordinator) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            job = find_job(stub, job_key)
            if job is None or job.state in (job_pb2.SUCCEEDED, job_pb2.FAILED,
                                            job_pb2.CANCELLED):
                return
            stub.CancelJob(coordinator_pb2.CancelJobRequest(
                job_id=job.id, reason=f"zeroshard.launch stopped by {name}"), timeout=10)
            log(f"cancelled job {job.id} ({job_name}): stopped by {name}")
    except grpc.RpcError as e:
        log(f"could not cancel job {job_name} after {name}: {e.code().name}")


def job_outcome(coordinator, job_name, job_key, wait_s=JOB_END_WAIT_S):
    """Once every trainer exited 0: 1 when the job FAILED all the same (a trainer finished before
    its first step, say), so that the exit status agrees with the job; else 0 (it succeeded, the
    script submitted none, or it did not end within `wait_s`: nothing more to say)."""
    import grpc
    from zeroshard._channel import coordinator_channel
    from zeroshard._jobs import find_job
    from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc, job_pb2
    deadline = time.monotonic() + wait_s
    try:
        with coordinator_channel(coordinator) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            while True:
                job = find_job(stub, job_key)
                if job is None or job.state in (job_pb2.SUCCEEDED, job_pb2.CANCELLED):
                    return 0
                if job.state == job_pb2.FAILED:
                    log(f"every trainer exited 0, but job {job.id} ({job_name}) FAILED: "
                        f"{job.message}")
                    return 1
                if time.monotonic() >= deadline:
                    return 0
                time.sleep(0.1)
    except grpc.RpcError as e:
        log(f"cannot ask the coordinator how job {job_name} ended: {e.code().name}")
        return 0


def run_trainers(args):
    signals()
    coordinator = os.environ["ZEROSHARD_COORDINATOR"]
    workers = idle_attach_workers(coordinator, args.workers, args.wait_s)
    run_id = f"attached-{uuid.uuid4().hex[:12]}"
    # The ranks find their job by this key (JobSpec.run_key), not by its name.
    run_key = secrets.token_hex(16)
    # zeroshard.torch names the script's first ShardedOptimizer's job so, with this key; the
    # restarted script joins it.
    job_name = f"{run_id}-1"
    job_key = f"{run_key}-1"
    generation = 1  # the one the trainers join: a new job's first
    restarts = 0
    while True:
        failure = run_attempt(args, workers, run_id, run_key, restarts)
        if signals().received is not None:
            cancel_job(coordinator, job_name, job_key, signals().received)
            signals().exit()
        if failure is None:
            return job_outcome(coordinator, job_name, job_key)
        rank, status = failure
        log(f"trainer rank {rank} failed (exit status {status})")
        if restarts >= args.max_restarts:
            log(f"not restarting: --max_restarts {args.max_restarts} reached")
            return status
        generation = generation_after_failure(coordinator, job_name, job_key, generation,
                                              args.restart_wait_s)
        if signals().received is not None:
            cancel_job(coordinator, job_name, job_key, signals().received)
            signals().exit()
        if generation is None:
            return status
        restarts += 1
        log(f"restarting the trainers (restart {restarts} of at most {args.max_restarts}, "
            f"ZEROSHARD_RESTART_COUNT={restarts})")


def limit_omp_threads(workers, env):
    """torchrun's rule: with several ranks, OMP_NUM_THREADS=1 unless `env` sets it (to anything,
    empty included), so that the ranks (and the local workers) do not oversubscribe the cores."""
    if workers > 1 and OMP_THREADS_ENV not in env:
        env[OMP_THREADS_ENV] = "1"
        log(f"{OMP_THREADS_ENV}=1 for every rank and local worker, as torchrun sets it for several "
            "ranks (set it yourself to tune)")


def main(argv, prog="python3 -m zeroshard.launch"):
    args = parse_args(argv, prog)
    export_credentials(args, os.environ)
    export_worker_user(args, os.environ)
    limit_omp_threads(args.workers, os.environ)
    if not os.environ.get("ZEROSHARD_COORDINATOR"):
        return run_local_cluster(args)
    return run_trainers(args)


def cli():
    """The zeroshard-launch console script."""
    sys.exit(main(sys.argv[1:], prog="zeroshard-launch"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
