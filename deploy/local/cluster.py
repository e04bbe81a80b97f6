#!/usr/bin/env python3
"""A local ZeroShard cluster: one coordinator and N CPU workers as separate processes on loopback.

    python3 deploy/local/cluster.py --workers 4                      # until Ctrl-C
    python3 deploy/local/cluster.py --workers 4 -- zeroshard-script  # run a command, then stop

Starts the coordinator on a free port, waits until it serves, starts the workers (worker-0 ..
worker-N-1), waits until all of them are registered and idle, then prints the coordinator's
address and the dashboard's URL (http://127.0.0.1:<metrics port>/). A COMMAND after `--` runs
with ZEROSHARD_COORDINATOR=host:port (and the other ZEROSHARD_* variables below) in its
environment; the launcher exits with its status. Every process's output goes to the log
directory. On exit, Ctrl-C, SIGTERM or an error every process is stopped (SIGTERM, then SIGKILL
after a deadline); each runs in its own process group so that nothing is left behind.

Secured (docs/operations.md, "TLS and tokens"): --tls makes a CA and the coordinator's certificate
(for 127.0.0.1 and localhost) with the openssl CLI under LOG_DIR/tls and serves TLS; --tokens
writes LOG_DIR/tls/tokens with a random token per role (admin, submitter, viewer, worker) and
starts the coordinator with it. The workers then authenticate with the worker token, or with
--worker_auth=cert by a client certificate each (CN worker-N, listed as `cert:worker-N worker
worker-N`). A COMMAND gets ZEROSHARD_CA and ZEROSHARD_TOKEN (the submitter's token) and
ZEROSHARD_TOKEN_DIR (admin.token, submitter.token, viewer.token, worker.token).

Python 3 standard library (and, for --tls, the openssl CLI) only.
"""

import argparse
import ipaddress
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_COMMAND = (
    "bazel build -c opt //apps/coordinator:zeroshard-coordinator //client:zeroshard "
    "//worker:zeroshard-worker"
)
BINARIES = {
    "coordinator": "apps/coordinator/zeroshard-coordinator",
    "client": "client/zeroshard",
    "worker": "worker/zeroshard-worker",
}


# The credentials the CLI and the Python client read from the environment (the coordinator's
# address is ZEROSHARD_COORDINATOR).
CREDENTIAL_ENV = ("ZEROSHARD_CA", "ZEROSHARD_CERT", "ZEROSHARD_KEY", "ZEROSHARD_TOKEN",
                  "ZEROSHARD_TOKEN_DIR")


class ClusterError(Exception):
    """An expected failure: printed as one line (plus log tails), never as a traceback."""


class Terminated(Exception):
    """Raised from the SIGTERM/SIGHUP handler so that the cleanup in `finally` runs."""


def log(message):
    print(f"cluster: {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
        if not command:
            raise ClusterError("nothing after '--': give a command or drop the '--'")
    else:
        own, command = argv, []
    parser = argparse.ArgumentParser(
        prog="cluster.py",
        description="Start a local ZeroShard cluster (coordinator + N CPU workers).",
        epilog="With '-- COMMAND...' runs COMMAND against the cluster, then stops it.",
    )
    parser.add_argument("--workers", type=int, required=True, help="number of workers (>= 0)")
    parser.add_argument(
        "--bin_dir",
        default=None,
        help="directory holding the binaries: coordinator/, client/ and worker/ as Bazel lays "
        "them out, or zeroshard-coordinator, zeroshard and zeroshard-worker side by side (default: "
        "this checkout's .bazel/bin, else bazel-bin; `bazel info -c opt bazel-bin` names the -c "
        "opt one)",
    )
    parser.add_argument(
        "--log_dir", default=None, help="where logs and state go (default: a new dir under /tmp)"
    )
    parser.add_argument(
        "--checkpoint_root",
        default=None,
        help="the --checkpoint_root of the coordinator and every worker: where checkpoints are "
        "written, resumed from and exported from (default: checkpoints/ in the log directory)",
    )
    parser.add_argument(
        "--heartbeat_period", default="1s", help="coordinator heartbeat period (default 1s)"
    )
    parser.add_argument(
        "--worker_threads",
        type=int,
        default=None,
        help="--threads for each worker (default: the worker's own default)",
    )
    parser.add_argument(
        "--worker_flag",
        action="append",
        default=[],
        help="extra flag passed to every worker (repeatable), e.g. --worker_flag=--labels=a=b",
    )
    parser.add_argument(
        "--coordinator_flag",
        action="append",
        default=[],
        help="extra flag passed to the coordinator (repeatable), e.g. "
        "--coordinator_flag=--max_pending_jobs_per_submitter=5000",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="serve TLS with a CA and certificates made now with openssl (under LOG_DIR/tls)",
    )
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="start the coordinator with a token file holding a random token per role",
    )
    parser.add_argument(
        "--worker_auth",
        choices=["token", "cert"],
        default="token",
        help="with --tokens: workers present the worker token, or a client certificate each "
        "(needs --tls)",
    )
    parser.add_argument(
        "--start_timeout", type=float, default=60.0, help="seconds to wait for the cluster to be up"
    )
    parser.add_argument(
        "--stop_timeout",
        type=float,
        default=10.0,
        help="seconds to wait after SIGTERM before SIGKILL",
    )
    args = parser.parse_args(own)
    if args.workers < 0:
        parser.error("--workers must be >= 0")
    if args.worker_threads is not None and args.worker_threads < 1:
        parser.error("--worker_threads must be >= 1")
    if args.worker_auth == "cert" and not (args.tls and args.tokens):
        parser.error("--worker_auth=cert needs --tls and --tokens")
    return args, command


def openssl(args, cwd):
    try:
        result = subprocess.run(["openssl"] + args, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise ClusterError(f"cannot run openssl: {e.strerror}") from None
    if result.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def subject_alt_name(name):
    """A certificate's subjectAltName entry for an IP address or a DNS name."""
    try:
        ipaddress.ip_address(name)
        return f"IP:{name}"
    except ValueError:
        return f"DNS:{name}"


class Credentials:
    """The CA, certificates and tokens of a secured local cluster, made under `directory`."""

    ROLES = ("admin", "submitter", "viewer", "worker")

    def __init__(self, directory, tls, tokens, worker_certs,
                 server_names=("127.0.0.1", "localhost")):
        """`server_names`: the addresses and DNS names the coordinator's certificate is for."""
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.ca = None
        self.server = None  # (cert, key)
        self.worker_certs = {}  # worker name -> (cert, key)
        self.token_files = {}  # role -> file holding the token
        self.coordinator_token_file = None
        if tls:
            self.ca = self._make_ca()
            self.server = self._issue("coordinator", server_names)
            for name in worker_certs:
                self.worker_certs[name] = self._issue(name)
        if tokens:
            lines = ["# token role name"]
            for role in self.ROLES:
                token = secrets.token_hex(32)
                lines.append(f"{token} {role} local-{role}")
                self.token_files[role] = self._write(f"{role}.token", token + "\n")
            lines.extend(f"cert:{name} worker {name}" for name in self.worker_certs)
            self.coordinator_token_file = self._write("tokens", "\n".join(lines) + "\n")

    def _write(self, name, text):
        path = os.path.join(self.dir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def _make_ca(self):
        openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj",
                 "/CN=zeroshard-local-ca", "-keyout", "ca.key", "-out", "ca.pem"], self.dir)
        return os.path.join(self.dir, "ca.pem")

    def _issue(self, name, names=("127.0.0.1", "localhost")):
        openssl(["req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr"], self.dir)
        self._write(f"{name}.ext", "subjectAltName=" + ",".join(map(subject_alt_name, names))
                    + "\n")
        openssl(["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "30", "-extfile", f"{name}.ext", "-out",
                 f"{name}.pem"], self.dir)
        return os.path.join(self.dir, f"{name}.pem"), os.path.join(self.dir, f"{name}.key")

    def coordinator_flags(self):
        flags = []
        if self.server:
            flags += [f"--tls_cert_file={self.server[0]}", f"--tls_key_file={self.server[1]}"]
            if self.worker_certs:
                flags.append(f"--tls_client_ca_file={self.ca}")
        if self.coordinator_token_file:
            flags.append(f"--token_file={self.coordinator_token_file}")
        return flags

    def client_flags(self, role):
        """The CLI's flags to act as `role` (worker: a worker's own come from worker_flags)."""
        flags = [f"--ca={self.ca}"] if self.ca else []
        if role in self.token_files:
            flags.append(f"--token_file={self.token_files[role]}")
        return flags

    def worker_flags(self, name):
        if name in self.worker_certs:
            cert, key = self.worker_certs[name]
            return [f"--ca={self.ca}", f"--cert={cert}", f"--key={key}"]
        return self.client_flags("worker")

    def command_env(self, env):
        """This cluster's credentials in `env`, and none of the environment's own (they would be
        another cluster's: the CLI and the Python client read them)."""
        for name in CREDENTIAL_ENV:
            env.pop(name, None)
        if self.ca:
            env["ZEROSHARD_CA"] = self.ca
        if self.token_files:
            with open(self.token_files["submitter"]) as f:
                env["ZEROSHARD_TOKEN"] = f.readline().strip()
            env["ZEROSHARD_TOKEN_DIR"] = self.dir


def dashboard_enabled(args):
    """Whether the coordinator serves its dashboard: on unless a --dashboard flag turns it off
    (the last one given wins, as with the coordinator's own flags)."""
    enabled = True
    for flag in args.coordinator_flag:
        name, _, value = flag.lstrip("-").partition("=")
        if name == "dashboard":
            enabled = value.lower() not in ("false", "0", "no")
        elif name == "nodashboard":
            enabled = False
    return enabled


def default_bin_dir():
    """The checkout's convenience symlink to the last build's outputs (.bazel/bin with the
    repository's --symlink_prefix, bazel-bin without it)."""
    for candidate in (".bazel/bin", "bazel-bin"):
        path = os.path.join(REPO_ROOT, candidate)
        if os.path.isdir(path):
            return path
    return os.path.join(REPO_ROOT, ".bazel/bin")


def find_binaries(bin_dir):
    """The binaries in `bin_dir`, laid out as Bazel builds them (BINARIES: bazel-bin, a test's
    runfiles) or side by side (an install prefix's bin/, tools/install_binaries.sh)."""
    paths = {}
    missing = []
    for key, relative in BINARIES.items():
        for path in (os.path.join(bin_dir, relative),
                     os.path.join(bin_dir, os.path.basename(relative))):
            if os.path.isfile(path) and os.access(path, os.X_OK):
                paths[key] = path
                break
        else:
            missing.append(os.path.join(bin_dir, relative))
    if missing:
        raise ClusterError(
            f"missing binaries: {', '.join(missing)} (or side by side in {bin_dir}); build them "
            f"with: {BUILD_COMMAND}"
        )
    return paths


def tail(path, lines=20):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return [f"(cannot read {path}: {e.strerror})"]
    return text.splitlines()[-lines:]


class Process:
    """One child process in its own process group (its own session), output in one log file."""

    def __init__(self, name, argv, log_path, env):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            self._log.close()
            raise ClusterError(f"cannot start {name} ({argv[0]}): {e.strerror}") from None
        self.pgid = self.popen.pid  # start_new_session: the child leads its own group

    def exited(self):
        return self.popen.poll() is not None

    def signal_group(self, sig):
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass  # the whole group is gone
        except PermissionError:
            pass

    def close_log(self):
        if not self._log.closed:
            self._log.close()


class Cluster:
    def __init__(self, args, binaries, log_dir):
        self.args = args
        self.binaries = binaries
        self.log_dir = log_dir
        self.state_dir = os.path.join(log_dir, "coordinator-state")
        # One directory for the coordinator and every worker, as a shared volume would be.
        self.checkpoint_root = os.path.abspath(
            args.checkpoint_root or os.path.join(log_dir, "checkpoints")
        )
        self.port_file = os.path.join(log_dir, "coordinator.ports")
        self.processes = []  # in start order
        self.coordinator = None
        self.workers = []
        self.address = None
        self.metrics_port = None
        worker_certs = ([f"worker-{i}" for i in range(args.workers)]
                        if args.worker_auth == "cert" else [])
        self.credentials = Credentials(os.path.join(log_dir, "tls"), args.tls, args.tokens,
                                       worker_certs)

    # --- starting ---------------------------------------------------------------------------

    def child_env(self):
        # The whole environment passes through, OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE included.
        env = dict(os.environ)
        env["OPENBLAS_NUM_THREADS"] = "1"  # workers share the cores; single-threaded is deterministic
        return env

    def start_coordinator(self):
        os.makedirs(self.state_dir, exist_ok=True)
        os.makedirs(self.checkpoint_root, exist_ok=True)
        try:
            os.remove(self.port_file)
        except FileNotFoundError:
            pass
        argv = [
            self.binaries["coordinator"],
            "--listen=127.0.0.1:0",
            "--metrics_port=0",
            f"--state_dir={self.state_dir}",
            f"--port_file={self.port_file}",
            f"--checkpoint_root={self.checkpoint_root}",
            f"--heartbeat_period={self.args.heartbeat_period}",
        ]
        argv.extend(self.credentials.coordinator_flags())
        argv.extend(self.args.coordinator_flag)
        self.coordinator = self._start("coordinator", argv)
        deadline = time.monotonic() + self.args.start_timeout
        while time.monotonic() < deadline:
            if self.coordinator.exited():
                raise ClusterError(
                    f"the coordinator exited with status {self.coordinator.popen.returncode} "
                    "before serving",
                    [self.coordinator],
                )
            ports = self._read_ports()
            if ports is not None:
                grpc_port, self.metrics_port = ports
                self.address = f"127.0.0.1:{grpc_port}"
                return
            time.sleep(0.05)
        raise ClusterError(
            f"the coordinator did not serve within {self.args.start_timeout:g}s "
            f"(no {self.port_file})",
            [self.coordinator],
        )

    def _read_ports(self):
        try:
            with open(self.port_file) as f:
                fields = f.read().split()
        except FileNotFoundError:
            return None
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            return None
        grpc_port, metrics_port = int(fields[0]), int(fields[1])
        return (grpc_port, metrics_port) if grpc_port > 0 else None

    def start_workers(self):
        for i in range(self.args.workers):
            argv = [
                self.binaries["worker"],
                f"--coordinator={self.address}",
                "--device=cpu",
                f"--name=worker-{i}",
                f"--checkpoint_root={self.checkpoint_root}",
            ]
            argv.extend(self.credentials.worker_flags(f"worker-{i}"))
            if self.args.worker_threads is not None:
                argv.append(f"--threads={self.args.worker_threads}")
            # Where attached PyTorch trainers (python3 -m zeroshard.launch) connect; a unix
            # socket path must fit sockaddr_un (107 bytes).
            attach_socket = os.path.join(os.path.abspath(self.log_dir), f"worker-{i}.sock")
            if len(attach_socket) <= 107:
                argv.append(f"--attach_socket={attach_socket}")
            argv.extend(self.args.worker_flag)
            self.workers.append(self._start(f"worker-{i}", argv))

    def _start(self, name, argv):
        process = Process(name, argv, os.path.join(self.log_dir, f"{name}.log"), self.child_env())
        self.processes.append(process)
        return process

    def idle_worker_names(self):
        """Names in `zeroshard workers --state=idle`, or None when the CLI fails. The CLI gets
        only flags: no address or credentials from the environment."""
        env = {name: value for name, value in os.environ.items()
               if name not in CREDENTIAL_ENV + ("ZEROSHARD_COORDINATOR",)}
        try:
            result = subprocess.run(
                [
                    self.binaries["client"],
                    f"--coordinator={self.address}",
                    *self.credentials.client_flags("admin"),
                    "workers",
                    "--state=idle",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=15,
                env=env,
            )
        except subprocess.TimeoutExpired:
            return None
        if result.returncode != 0:
            return None
        names = set()
        for line in result.stdout.splitlines()[1:]:  # the first line is the table's header
            fields = line.split()
            if len(fields) >= 2:
                names.add(fields[1])
        return names

    def wait_for_idle_workers(self):
        wanted = {f"worker-{i}" for i in range(self.args.workers)}
        deadline = time.monotonic() + self.args.start_timeout
        seen = set()
        while True:
            for process in [self.coordinator] + self.workers:
                if process.exited():
                    raise ClusterError(
                        f"{process.name} exited with status {process.popen.returncode} "
                        "during start-up",
                        [process],
                    )
            names = self.idle_worker_names()
            if names is not None:
                seen = names & wanted
                if seen == wanted:
                    return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        missing = sorted(wanted - seen, key=lambda n: int(n.split("-")[1]))
        raise ClusterError(
            f"only {len(seen)} of {len(wanted)} workers registered as idle within "
            f"{self.args.start_timeout:g}s (missing: {', '.join(missing)})",
            [self.coordinator] + [w for w in self.workers if w.name in missing],
        )

    # --- running ----------------------------------------------------------------------------

    def command_env(self):
        env = dict(os.environ)
        env["ZEROSHARD_COORDINATOR"] = self.address
        env["ZEROSHARD_CLI"] = os.path.abspath(self.binaries["client"])
        env["ZEROSHARD_LOG_DIR"] = self.log_dir
        env["ZEROSHARD_CHECKPOINT_ROOT"] = self.checkpoint_root
        env["ZEROSHARD_WORKERS"] = str(self.args.workers)
        # The workers' process ids, comma-separated, in worker order (for tools that read their
        # /proc/<pid>/status, such as the demo's per-worker peak RSS).
        env["ZEROSHARD_WORKER_PIDS"] = ",".join(str(w.popen.pid) for w in self.workers)
        self.credentials.command_env(env)
        return env

    def run_command(self, command):
        """Runs COMMAND in the foreground process group (so Ctrl-C reaches it); its exit status."""
        try:
            child = subprocess.Popen(command, env=self.command_env())
        except OSError as e:
            raise ClusterError(f"cannot run {command[0]}: {e.strerror}") from None
        try:
            returncode = child.wait()
        except BaseException:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(self.args.stop_timeout)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            raise
        return returncode if returncode >= 0 else 128 - returncode

    def wait_forever(self):
        """Until Ctrl-C/SIGTERM. Reports processes that exit; a dead coordinator ends the wait."""
        reported = set()
        while True:
            for process in self.processes:
                if process.exited() and process.name not in reported:
                    reported.add(process.name)
                    log(
                        f"{process.name} exited with status {process.popen.returncode} "
                        f"(log: {process.log_path})"
                    )
                    if process is self.coordinator:
                        raise ClusterError("the coordinator exited", [process])
            time.sleep(0.5)

    # --- stopping ---------------------------------------------------------------------------

    def stop_all(self):
        """SIGTERM to every group (workers first, so they can leave the coordinator), then the
        coordinator; SIGKILL whatever is left after the deadline. Never raises."""
        for group in (self.workers, [self.coordinator] if self.coordinator else []):
            if not group:
                continue
            for process in group:
                process.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + self.args.stop_timeout
            for process in group:
                remaining = max(0.0, deadline - time.monotonic())
                try:
                    process.popen.wait(remaining)
                except subprocess.TimeoutExpired:
                    log(f"{process.name} did not stop within {self.args.stop_timeout:g}s: SIGKILL")
                    process.signal_group(signal.SIGKILL)
                    process.popen.wait()
        # Anything a child may have left in its group (the leader is reaped by now).
        for process in self.processes:
            process.signal_group(signal.SIGKILL)
            process.close_log()


def print_log_tails(processes):
    for process in processes:
        print(f"--- last lines of {process.log_path} ---", file=sys.stderr)
        for line in tail(process.log_path):
            print(f"    {line}", file=sys.stderr)
    sys.stderr.flush()


def on_terminate(signum, _frame):
    raise Terminated(signum)


def main(argv):
    try:
        args, command = parse_args(argv)
    except ClusterError as e:
        log(f"error: {e}")
        return 2
    bin_dir = args.bin_dir or default_bin_dir()
    try:
        binaries = find_binaries(bin_dir)
    except ClusterError as e:
        log(f"error: {e}")
        return 1
    if args.log_dir:
        log_dir = os.path.abspath(args.log_dir)
        os.makedirs(log_dir, exist_ok=True)
    else:
        log_dir = tempfile.mkdtemp(prefix="zeroshard-cluster-")
    signal.signal(signal.SIGTERM, on_terminate)
    signal.signal(signal.SIGHUP, on_terminate)

    cluster = None
    try:
        cluster = Cluster(args, binaries, log_dir)
        log(f"logs in {log_dir}")
        cluster.start_coordinator()
        log(f"coordinator serving at {cluster.address} (metrics: http://127.0.0.1:"
            f"{cluster.metrics_port}/metrics)")
        if args.workers > 0:
            cluster.start_workers()
            log(f"started {args.workers} workers; waiting until they are registered and idle")
            cluster.wait_for_idle_workers()
        log(f"{args.workers} workers idle")
        if dashboard_enabled(args):
            login = ""
            if "viewer" in cluster.credentials.token_files:
                login = f" (log in with the token in {cluster.credentials.token_files['viewer']})"
            log(f"dashboard: http://127.0.0.1:{cluster.metrics_port}/{login}")
        print(f"ZEROSHARD_COORDINATOR={cluster.address}", flush=True)
        if command:
            log(f"running: {' '.join(command)}")
            status = cluster.run_command(command)
            log(f"command exited with status {status}")
            return status
        cli = os.path.abspath(binaries["client"])
        flags = " ".join([f"--coordinator={cluster.address}"]
                         + cluster.credentials.client_flags("admin"))
        log(f"try: {cli} {flags} workers")
        log("Ctrl-C stops the cluster")
        cluster.wait_forever()
        return 0
    except ClusterError as e:
        message = e.args[0]
        log(f"error: {message}")
        if len(e.args) > 1:
            print_log_tails(e.args[1])
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except Terminated as e:
        log(f"got signal {e.args[0]}")
        return 128 + e.args[0]
    finally:
        if cluster is not None:
            # A second Ctrl-C/SIGTERM/SIGHUP must not cut the cleanup short.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            cluster.stop_all()
            log(f"stopped; logs in {log_dir}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
