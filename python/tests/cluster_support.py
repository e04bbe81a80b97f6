"""What the tests that run real local clusters share: the runfiles' workspace (binaries,
deploy/local/cluster.py, python/), deploy/local/cluster.py as a module, polling with a deadline,
running a script under `python3 -m zeroshard.launch` on a fresh cluster, and a trainer started
as zeroshard.launch would start it (TrainerProcess). The trainers run
under trainer_python(): $ZEROSHARD_TRAINER_PYTHON (CI sets the torch 2.x venv's interpreter,
tools/make_torch_venv.sh), else the test's own interpreter (Debian's, torch 1.13).
"""

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


# The interpreter the trainers run under, when it is not the test's own, and the torch version
# it must import (.ci/run sets both; the version also keeps Bazel from reusing results cached
# under another torch).
TRAINER_PYTHON_ENV = "ZEROSHARD_TRAINER_PYTHON"
TRAINER_TORCH_ENV = "ZEROSHARD_TRAINER_TORCH"


def trainer_python():
    """The interpreter that runs `-m zeroshard.launch` and so the trainers (the launcher starts
    them with its own interpreter): $ZEROSHARD_TRAINER_PYTHON, else this test's."""
    return os.environ.get(TRAINER_PYTHON_ENV) or sys.executable


@functools.lru_cache(maxsize=None)
def trainer_torch():
    """(torch.__version__, torch.__file__, sys.prefix) as trainer_python() imports them with the
    package on its path. With $ZEROSHARD_TRAINER_PYTHON set, its torch must be 2.x and its own
    (not Debian's 1.13 through the system packages): else every run would quietly test 1.13;
    with $ZEROSHARD_TRAINER_TORCH set, exactly that version (a local suffix, +cu132, aside)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(runfiles_workspace(), "python"))
    result = subprocess.run(
        [trainer_python(), "-c", "import json, sys, torch, zeroshard.torch; "
         "print(json.dumps([torch.__version__, torch.__file__, sys.prefix]))"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"{trainer_python()} cannot import torch and zeroshard.torch:\n"
                             + result.stderr[-3000:])
    version, location, prefix = json.loads(result.stdout.splitlines()[-1])
    if os.environ.get(TRAINER_PYTHON_ENV):
        if int(version.split(".")[0]) < 2 or not location.startswith(prefix + os.sep):
            raise AssertionError(f"${TRAINER_PYTHON_ENV}={trainer_python()} imports torch "
                                 f"{version} from {location}, not a torch 2.x of its own")
    expected = os.environ.get(TRAINER_TORCH_ENV)
    if expected and version.split("+")[0] != expected:
        raise AssertionError(f"{trainer_python()} imports torch {version}, not "
                             f"${TRAINER_TORCH_ENV}={expected}")
    return version, location, prefix


def run_under_trainer_python():
    """For a test of the trainer side that runs in its own process (no cluster): re-executes
    the test under trainer_python() when that is another interpreter, so that it runs that
    torch; the environment (PYTHONPATH, Bazel's variables) carries over."""
    if trainer_python() != sys.executable:
        version, location, _ = trainer_torch()
        print(f"{os.path.basename(sys.argv[0])}: re-executed under {trainer_python()} (torch "
              f"{version} from {location})", flush=True)
        os.execv(trainer_python(), [trainer_python(), *sys.argv])


def runfiles_workspace():
    """This workspace's directory in the test's runfiles (the checkout outside Bazel)."""
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", "zeroshard"))
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_cluster_module():
    path = os.path.join(runfiles_workspace(), "deploy", "local", "cluster.py")
    spec = importlib.util.spec_from_file_location("zeroshard_local_cluster", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until(condition, timeout_s, what, poll_s=0.02):
    """Polls `condition` every `poll_s` until it returns a true value (returned); fails after
    `timeout_s`. A condition that starts a process wants a longer `poll_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def run_with_cluster_flags(program, arguments, timeout_s=600):
    """Runs `program` + [--bin_dir, --log_dir] + `arguments`, a command that starts its own local
    cluster (zeroshard.launch, a benchmark driver): the binaries from the runfiles, a fresh log
    directory under /tmp (the workers' attach sockets live there, and a unix socket path has at
    most 107 bytes; Bazel's TEST_TMPDIR is longer), removed afterwards. ZEROSHARD_COORDINATOR
    and ZEROSHARD_RANK are left out of its environment, the package is on its PYTHONPATH. Returns the CompletedProcess, echoing the stderr tail of a failed run."""
    root = runfiles_workspace()
    env = dict(os.environ)
    env.pop("ZEROSHARD_COORDINATOR", None)
    env.pop("ZEROSHARD_RANK", None)
    env["PYTHONPATH"] = os.path.join(root, "python")
    env["OMP_NUM_THREADS"] = "1"
    log_dir = tempfile.mkdtemp(prefix="zs-test-", dir="/tmp")
    command = list(program) + ["--bin_dir", root, "--log_dir", log_dir] + list(arguments)
    try:
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, timeout=timeout_s)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-6000:])
    return result


def launch(workers, script, *script_args, timeout_s=600, launcher_args=()):
    """Runs `script` under zeroshard.launch (with `launcher_args`, e.g. --worker_flag=...) on a
    fresh local cluster of `workers`, the trainers under trainer_python(); (exit status,
    stdout)."""
    trainer_torch()
    result = run_with_cluster_flags(
        [trainer_python(), "-m", "zeroshard.launch", "--workers", str(workers), *launcher_args],
        [script, *script_args], timeout_s)
    return result.returncode, result.stdout


def start_local_cluster(workers, prefix):
    """A local cluster (deploy/local/cluster.py's Cluster) of `workers` idle workers from the
    runfiles, logging under a new short /tmp directory (attach socket paths must stay short):
    (cluster, log_dir). Stop it with cluster.stop_all()."""
    cluster_module = load_cluster_module()
    log_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    args, _ = cluster_module.parse_args(["--workers", str(workers), "--bin_dir",
                                         runfiles_workspace(), "--log_dir", log_dir])
    cluster = cluster_module.Cluster(args, cluster_module.find_binaries(args.bin_dir), log_dir)
    cluster.start_coordinator()
    cluster.start_workers()
    cluster.wait_for_idle_workers()
    return cluster, log_dir


class TrainerProcess:
    """One rank's trainer running `script` (in python/tests) with `args`, started as
    zeroshard.launch would start it (its ZEROSHARD_* environment) on `workers` (WorkerInfo,
    rank order) of the cluster at `coordinator`; its output goes to a file, read by polling."""

    def __init__(self, rank, workers, run_id, coordinator, log_dir, script, args=()):
        env = dict(os.environ)
        env.update({
            "ZEROSHARD_COORDINATOR": coordinator,
            "ZEROSHARD_RANK": str(rank),
            "ZEROSHARD_WORLD_SIZE": str(len(workers)),
            "ZEROSHARD_WORKERS": ",".join(w.name for w in workers),
            "ZEROSHARD_RUN_ID": run_id,
            "ZEROSHARD_RUN_KEY": run_id,
            "ZEROSHARD_ATTACH_SOCKET": workers[rank].attach_socket,
            "PYTHONPATH": os.path.join(runfiles_workspace(), "python"),
            "OMP_NUM_THREADS": "1",
        })
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
        self.log_path = os.path.join(log_dir, f"trainer-{rank}.log")
        trainer_torch()
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen([trainer_python(), "-u", path, *args], env=env,
                                            stdout=log, stderr=subprocess.STDOUT)

    def read(self):
        with open(self.log_path) as log:
            return log.read()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
