"""Who serves the attach socket (issue 36, row 3): anyone holding a worker token can register a
worker under any host name with any socket path, so the launcher and the trainer check the socket
before they use it: a socket of another local user (SO_PEERCRED, the file's owner) is refused,
naming the worker expected there and what answered, and so is a welcome from a worker other than
the rank's. The rogue socket's server runs as `nobody` (65534), so the tests that need one run
as root (CI and Bazel here do) and skip otherwise.

- TrainerChecksTheSocketTest: zeroshard._attach against a rogue socket and the trainer's own.
- WelcomeIdentityTest: the worker that welcomes a rank must be the one ZEROSHARD_WORKERS names.
- LauncherSkipsARogueWorkerTest: a real local cluster of 1 worker, a rogue registration that
  sorts first (`aaa-rogue`, this host, a socket served by nobody), and zeroshard.launch with
  ZEROSHARD_COORDINATOR set: the rogue is skipped with a message naming both, and the trainer
  trains on the real worker.
- AttachDeadlineTest (row 4): an attached job whose only connection dribbles its hello fails at
  the worker's attach deadline (--attach_timeout), not when the dribbler stops.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import zeroshard
from cluster_support import (load_cluster_module, run_under_trainer_python, runfiles_workspace,
                             start_local_cluster, trainer_python, trainer_torch, wait_until)
from zeroshard import _attach
from zeroshard._proto.zeroshard.v1 import attach_pb2

NOBODY = 65534
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_env_script.py")

# A rogue attach socket: accepts, records how many bytes each connection sent, and closes it.
ROGUE_SERVER = r"""
import socket, sys
path, record = sys.argv[1], sys.argv[2]
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(16)
while True:
    connection, _ = listener.accept()
    connection.settimeout(2)
    received = 0
    try:
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += len(chunk)
    except OSError:
        pass
    connection.close()
    with open(record, "a") as f:
        f.write(f"{received}\n")
"""


def start_rogue_server(test):
    """A process of uid/gid `nobody` serving a socket in a directory of its own; (path, the file
    listing the bytes each connection sent). Stopped at the test's cleanup."""
    if os.geteuid() != 0:
        test.skipTest("needs root to serve the rogue socket as another user")
    directory = tempfile.mkdtemp(prefix="zs-rogue-", dir="/tmp")
    test.addCleanup(shutil.rmtree, directory, True)
    os.chown(directory, NOBODY, NOBODY)
    path = os.path.join(directory, "worker.sock")
    record = os.path.join(directory, "received")
    server = subprocess.Popen([sys.executable, "-c", ROGUE_SERVER, path, record],
                              user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
    test.addCleanup(server.wait)
    test.addCleanup(server.kill)
    wait_until(lambda: os.path.exists(path), 30, "the rogue socket")
    return path, record


def received_bytes(record):
    """Bytes the rogue got on each connection it has closed."""
    if not os.path.exists(record):
        return []
    with open(record) as f:
        return [int(line) for line in f if line.strip()]


class TrainerChecksTheSocketTest(unittest.TestCase):

    # Fails before the fix: AttachConnection connected to any socket it was given and the
    # trainer then sent its hello (and would have sent its model) to whoever served it.
    def test_a_socket_served_by_another_user_is_refused_naming_both(self):
        path, record = start_rogue_server(self)
        with self.assertRaises(_attach.WrongWorker) as raised:
            _attach.AttachConnection(path, timeout=10, worker="worker w0")
        message = str(raised.exception)
        self.assertIn(f"the attach socket {path} registered for worker w0", message)
        self.assertIn(f"uid {NOBODY}", message)
        self.assertIn("not by the workers' user", message)
        self.assertIsInstance(raised.exception, _attach.WorkerLost)
        # Nothing was sent: the rogue saw a connection with no bytes.
        wait_until(lambda: received_bytes(record), 30, "the rogue's record")
        self.assertEqual(received_bytes(record), [0])
        # The launcher's check says the same, from the file's owner already.
        with self.assertRaisesRegex(_attach.WrongWorker,
                                    f"belongs to uid {NOBODY}.*not to the workers' user"):
            _attach.probe_worker_socket(path, "worker w0 (worker-000001)")

    # Fails before the fix: ZEROSHARD_WORKER_USER did not exist (no way to trust the workers'
    # service user, so a deployment with --attach_group could not pass the new check).
    def test_the_workers_user_may_be_named(self):
        path, _ = start_rogue_server(self)
        os.environ[_attach.WORKER_USER_ENV] = str(NOBODY)
        self.addCleanup(os.environ.pop, _attach.WORKER_USER_ENV, None)
        _attach.probe_worker_socket(path, "worker w0")
        _attach.AttachConnection(path, timeout=10, worker="worker w0").close()
        os.environ[_attach.WORKER_USER_ENV] = "no-such-user-zeroshard"
        with self.assertRaisesRegex(ValueError, "ZEROSHARD_WORKER_USER=no-such-user-zeroshard"):
            _attach.trusted_worker_uids()

    def test_the_trainers_own_users_socket_is_accepted(self):
        directory = tempfile.mkdtemp(prefix="zs-own-", dir="/tmp")
        self.addCleanup(shutil.rmtree, directory, True)
        path = os.path.join(directory, "worker.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(listener.close)
        listener.bind(path)
        listener.listen(1)
        _attach.probe_worker_socket(path, "worker w0")
        _attach.AttachConnection(path, timeout=10, worker="worker w0").close()
        os.symlink(path, os.path.join(directory, "link.sock"))
        with self.assertRaisesRegex(_attach.WrongWorker, "is not a socket"):
            _attach.probe_worker_socket(os.path.join(directory, "link.sock"), "worker w0")


class WelcomeIdentityTest(unittest.TestCase):
    """The check on the welcome, before anything is mapped or written."""

    class Env:
        rank = 1
        workers = ["w-a", "w-b"]
        attach_socket = "/tmp/w-b.sock"

    def attachment(self):
        from zeroshard._torch_attachment import Attachment
        attachment = Attachment(self.Env(), settings=None)
        attachment.job_id = "job-000003"
        return attachment

    # Fails before the fix: the welcome said no worker name and nothing was checked, so a
    # socket that another worker of the workers' user served was used as this rank's.
    def test_a_welcome_from_another_worker_is_refused_naming_both(self):
        welcome = attach_pb2.AttachWelcome(worker_name="w-c", worker_id="worker-000009")
        with self.assertRaises(_attach.WrongWorker) as raised:
            self.attachment()._check_worker_identity(welcome)
        self.assertEqual(
            str(raised.exception),
            "the attach socket /tmp/w-b.sock is served by worker w-c (worker-000009), not by "
            "worker w-b, which runs rank 1 of job job-000003 (ZEROSHARD_WORKERS): refusing to "
            "attach")
        with self.assertRaisesRegex(_attach.WrongWorker, "a worker that does not say its name"):
            self.attachment()._check_worker_identity(attach_pb2.AttachWelcome())
        self.attachment()._check_worker_identity(attach_pb2.AttachWelcome(worker_name="w-b"))


class LauncherSkipsARogueWorkerTest(unittest.TestCase):

    def setUp(self):
        trainer_torch()
        self.cluster, self.log_dir = start_local_cluster(1, "zs-trust-")
        self.addCleanup(shutil.rmtree, self.log_dir, True)
        self.addCleanup(self.cluster.stop_all)

    def register_rogue(self, path):
        """Registers `aaa-rogue` on this host with the rogue socket, and heartbeats for it until
        the test ends (as a worker token holder could)."""
        import grpc
        from zeroshard._proto.zeroshard.v1 import (coordinator_pb2, coordinator_pb2_grpc,
                                                   types_pb2)
        channel = grpc.insecure_channel(self.cluster.address)
        self.addCleanup(channel.close)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        worker_id = stub.RegisterWorker(coordinator_pb2.RegisterWorkerRequest(
            name="aaa-rogue", host=socket.gethostname(), device_kind=types_pb2.CPU,
            attach_socket=path), timeout=30).worker_id
        stop = threading.Event()

        def heartbeat():
            while not stop.wait(0.3):
                try:
                    stub.Heartbeat(coordinator_pb2.HeartbeatRequest(worker_id=worker_id),
                                   timeout=10)
                except grpc.RpcError:
                    pass

        thread = threading.Thread(target=heartbeat, daemon=True)
        thread.start()
        self.addCleanup(thread.join)
        self.addCleanup(stop.set)
        return worker_id

    def launch_one_trainer(self):
        """zeroshard.launch --workers 1 on the cluster: the finished process, which succeeded."""
        env = dict(os.environ)
        env.pop("OMP_NUM_THREADS", None)
        env.update({"ZEROSHARD_COORDINATOR": self.cluster.address,
                    "PYTHONPATH": os.path.join(runfiles_workspace(), "python")})
        result = subprocess.run(
            [trainer_python(), "-m", "zeroshard.launch", "--workers", "1", "--wait_s", "30",
             SCRIPT, "--train"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-4000:])
        return result

    def assertTrained(self, result):
        """Its one trainer trained: on the real worker, the only one."""
        reports = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
                   if line.startswith("launch_env ")]
        self.assertEqual(len(reports), 1, result.stdout)

    # Fails before the fix: the launcher took the first idle worker of this host by name,
    # aaa-rogue, and its trainer sent its hello to the rogue socket (which closed it: the
    # launch failed).
    def test_the_rogue_is_skipped_naming_both_and_the_real_worker_trains(self):
        path, record = start_rogue_server(self)
        rogue_id = self.register_rogue(path)
        result = self.launch_one_trainer()
        self.assertIn(f"zeroshard.launch: not using worker aaa-rogue ({rogue_id}): the attach "
                      f"socket {path} registered for worker aaa-rogue ({rogue_id}) belongs to "
                      f"uid {NOBODY}", result.stderr)
        self.assertTrained(result)
        self.assertEqual(sum(received_bytes(record)), 0)  # never sent a byte


    # Fails before the fix: the rogue registration named the real worker's socket, so the
    # launcher's checks of who serves it passed, aaa-rogue (first by name) got rank 0, and the
    # trainer refused the welcome of the real worker: the launch failed.
    def test_a_rogue_naming_a_real_workers_socket_is_skipped_and_the_real_worker_trains(self):
        from zeroshard import client as zs_client
        with zs_client.Client(self.cluster.address) as coordinator:
            [real] = [w for w in coordinator.workers(state="IDLE") if w.attach_socket]
        rogue_id = self.register_rogue(real.attach_socket)
        result = self.launch_one_trainer()
        self.assertIn(f"zeroshard.launch: not using worker aaa-rogue ({rogue_id}): the attach "
                      f"socket {real.attach_socket} registered for worker aaa-rogue ({rogue_id}) "
                      f"is served by the worker daemon {real.name} (process ", result.stderr)
        self.assertTrained(result)


class AttachDeadlineTest(unittest.TestCase):

    def setUp(self):
        cluster_module = load_cluster_module()
        self.log_dir = tempfile.mkdtemp(prefix="zs-deadline-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.log_dir, True)
        args, _ = cluster_module.parse_args([
            "--workers", "1", "--bin_dir", runfiles_workspace(), "--log_dir", self.log_dir,
            "--worker_flag=--attach_timeout=3s"])
        self.cluster = cluster_module.Cluster(args, cluster_module.find_binaries(args.bin_dir),
                                              self.log_dir)
        self.addCleanup(self.cluster.stop_all)
        self.cluster.start_coordinator()
        self.cluster.start_workers()
        self.cluster.wait_for_idle_workers()
        self.client = zeroshard.Client(self.cluster.address)
        self.addCleanup(self.client.close)

    # Fails before the fix: the worker's accept loop sat in the dribbler's read (2 s per read, a
    # byte every 200 ms), so the job stayed RUNNING past its 3 s attach deadline for as long as
    # the dribbler went on (20 s).
    def test_a_dribbling_peer_does_not_keep_the_job_past_its_attach_deadline(self):
        (worker,) = self.client.workers()
        job = self.client.submit({
            "name": "dribbled", "optimizer": {"kind": "SGD", "lr": 0.1}, "mode": "DDP",
            "max_attempts": 1,
            "workload": {"attached": {"tensors": [{"name": "w", "shape": [4]}],
                                      "workers": [worker.name]}}})
        dribbler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(dribbler.close)
        dribbler.connect(worker.attach_socket)
        stop = threading.Event()

        def dribble():  # a 255-byte hello frame, a byte every 200 ms, for at most 20 s
            for byte in [b"\xff", b"\0", b"\0", b"\0"] + [b"\0"] * 96:
                if stop.wait(0.2):
                    return
                try:
                    dribbler.send(byte)
                except OSError:
                    return  # the worker cut it off

        thread = threading.Thread(target=dribble, daemon=True)
        thread.start()
        self.addCleanup(thread.join)
        self.addCleanup(stop.set)
        from zeroshard._proto.zeroshard.v1 import job_pb2
        started = time.monotonic()
        wait_until(lambda: self.client.get(job.id).state == job_pb2.FAILED, 15,
                   "the job failing at its attach deadline")
        self.assertLess(time.monotonic() - started, 15)
        failed = self.client.get(job.id)
        self.assertIn("attached in time", failed.message)


if __name__ == "__main__":
    run_under_trainer_python()
    unittest.main()
