"""How a script's end reaches its job, and the launcher's signals, on real local clusters (a
coordinator and 2 workers from the runfiles; the trainers under trainer_python()):
- an uncaught exception between steps fails the job (its type and message in the job's
  message), and with max_attempts 2 the launcher restarts the trainers and the job succeeds;
- a trainer that exits before its first step fails the job, saying so;
- SIGTERM to zeroshard.launch (which started a local cluster) reaches everything it started,
  and it exits, killed by SIGTERM, only once they are gone;
- ShardedOptimizer(model.parameters()) is a TypeError saying to pass the model.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import zeroshard
from cluster_support import (runfiles_workspace, start_local_cluster, trainer_python,
                             trainer_torch, wait_until)
from zeroshard._proto.zeroshard.v1 import job_pb2

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attach_lifecycle_script.py")
FINAL = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED)


def trainer_env(**extra):
    env = dict(os.environ)
    env.pop("ZEROSHARD_RANK", None)
    env.pop("ZEROSHARD_COORDINATOR", None)
    env["PYTHONPATH"] = os.path.join(runfiles_workspace(), "python")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def proc_stat(pid):
    """(state, ppid, start time) of process `pid` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), fields[19]


def descendants(root):
    """[(pid, start time)] of every process below `root` now."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None:
                children.setdefault(stat[1], []).append((int(entry), stat[2]))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child[0])
    return found


def still_running(processes):
    """Those of `processes` ((pid, start time)) that exist and are not zombies."""
    running = []
    for pid, start in processes:
        stat = proc_stat(pid)
        if stat is not None and stat[2] == start and stat[0] != "Z":
            running.append((pid, start))
    return running


class ScriptEndTest(unittest.TestCase):
    """The job's state says what the trainer did."""

    @classmethod
    def setUpClass(cls):
        cls.cluster, cls.log_dir = start_local_cluster(2, "zs-life-")
        cls.client = zeroshard.Client(cls.cluster.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop_all()
        if not os.environ.get("ZEROSHARD_KEEP_LOGS"):
            shutil.rmtree(cls.log_dir, ignore_errors=True)

    def launch(self, *script_args):
        """The script under zeroshard.launch on the cluster's 2 workers: (exit status, the
        trainers' JSON lines, the launcher's stderr, the ended job)."""
        wait_until(lambda: len(self.client.workers(state="IDLE")) == 2, 120, "2 idle workers",
                   poll_s=0.2)
        trainer_torch()
        result = subprocess.run(
            [trainer_python(), "-m", "zeroshard.launch", "--workers", "2", SCRIPT, *script_args],
            env=trainer_env(ZEROSHARD_COORDINATOR=self.cluster.address), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, timeout=600)
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        self.assertTrue(lines, result.stderr[-4000:])
        names = {line["job_name"] for line in lines if "job_name" in line}
        self.assertEqual(len(names), 1, lines)
        jobs = [j for j in self.client.list(limit=1000) if j.spec.name in names]
        self.assertEqual(len(jobs), 1, f"one job named {names}: {jobs}")
        job = wait_until(lambda: (j := self.client.get(jobs[0].id)).state in FINAL and j, 120,
                         "the job to end", poll_s=0.1)
        return result.returncode, lines, result.stderr, job

    def test_uncaught_exception_between_steps_fails_the_job(self):
        # Fails before the fix: atexit's finish ended the run successfully, so the job was
        # SUCCEEDED although every trainer died of a ValueError.
        status, _, stderr, job = self.launch("--case", "raise", "--raise_after", "3",
                                             "--max_attempts", "1")
        self.assertNotEqual(status, 0, stderr[-4000:])
        self.assertEqual(job_pb2.JobState.Name(job.state), "FAILED", job.message)
        self.assertIn("ValueError: boom after step 3", job.message)

    def test_uncaught_exception_is_retried_per_max_attempts(self):
        # Fails before the fix: the job SUCCEEDED at the first attempt's exception, so the
        # launcher did not restart the trainers and exited with status 1.
        status, lines, stderr, job = self.launch("--case", "raise", "--raise_after", "3",
                                                 "--max_attempts", "2")
        self.assertEqual(status, 0, stderr[-4000:])
        self.assertEqual(job_pb2.JobState.Name(job.state), "SUCCEEDED", job.message)
        self.assertEqual(job.attempts, 2)
        done = sorted((line["rank"], line["steps_done"]) for line in lines
                      if "steps_done" in line and line["restart_count"] == 1)
        self.assertEqual(done, [(0, 6), (1, 6)], stderr[-4000:])

    def test_exit_before_the_first_step_fails_the_job_saying_so(self):
        # Fails before the fix: the job FAILED with "metrics.loss_scale: 0 must be > 0" (the
        # worker reported a step's metrics although no step ran), and the launcher exited 0.
        status, _, stderr, job = self.launch("--case", "exit_early")
        self.assertEqual(status, 1, stderr[-4000:])
        self.assertIn("every trainer exited 0, but job", stderr)
        self.assertEqual(job_pb2.JobState.Name(job.state), "FAILED", job.message)
        self.assertIn("exited before its first step", job.message)
        self.assertNotIn("loss_scale", job.message)


    def test_consolidated_load_retires_no_checkpoint_silently_and_a_copy_loads(self):
        # Fails before the fix: the consolidated load retired the sharded dict's checkpoint
        # without a word, its load then said "pruned, moved, or never committed", and the copied
        # step directory was refused for its name ("is not the absolute path of a checkpoint's
        # manifest.json").
        copy_dir = tempfile.mkdtemp(prefix="zs-copy-", dir="/tmp")
        try:
            status, lines, stderr, job = self.launch("--case", "hand_off", "--copy_dir",
                                                     copy_dir)
        finally:
            shutil.rmtree(copy_dir, ignore_errors=True)
        self.assertEqual(status, 0, stderr[-4000:])
        self.assertEqual(job_pb2.JobState.Name(job.state), "SUCCEEDED", job.message)
        results = [line for line in lines if "copy_loaded_equal" in line]
        self.assertEqual(sorted(r["rank"] for r in results), [0, 1], stderr[-4000:])
        for result in results:
            manifest = result["sharded_manifest"]
            self.assertTrue(any(manifest in w and "no longer loads" in w and
                                "The rule:" in w for w in result["warnings"]), result)
            self.assertIsNotNone(result["sharded_error"], result)
            self.assertIn("the job retired", result["sharded_error"])
            self.assertIn("superseded-step-000000000003-", result["sharded_error"])
            self.assertIn("The rule:", result["sharded_error"])
            self.assertIsNone(result["copy_error"], result)
            self.assertTrue(result["copy_loaded_equal"], result)


class LauncherSignalTest(unittest.TestCase):
    def test_sigterm_stops_everything_the_launcher_started_before_it_exits(self):
        # Fails before the fix: the launcher died at once of the SIGTERM, and its local
        # cluster (coordinator, workers) and both trainers went on running.
        root = runfiles_workspace()
        log_dir = tempfile.mkdtemp(prefix="zs-sig-", dir="/tmp")
        marker_dir = os.path.join(log_dir, "markers")
        os.mkdir(marker_dir)
        trainer_torch()
        with open(os.path.join(log_dir, "launcher.out"), "w") as out, \
                open(os.path.join(log_dir, "launcher.err"), "w") as err:
            launcher = subprocess.Popen(
                [trainer_python(), "-m", "zeroshard.launch", "--workers", "2", "--bin_dir", root,
                 "--log_dir", log_dir, SCRIPT, "--case", "forever", "--marker_dir", marker_dir],
                env=trainer_env(), stdout=out, stderr=err, start_new_session=True)
        started = []
        try:
            markers = [os.path.join(marker_dir, f"rank-{rank}") for rank in range(2)]
            wait_until(lambda: all(os.path.exists(m) for m in markers) or launcher.poll(), 180,
                       "both trainers' first step", poll_s=0.1)
            self.assertIsNone(launcher.poll(), self.read(log_dir, "launcher.err"))
            trainers = set()
            for marker in markers:
                with open(marker) as f:
                    trainers.add(int(f.read()))
            started = descendants(launcher.pid)
            pids = {pid for pid, _ in started}
            self.assertTrue(trainers <= pids, (trainers, started))
            # The cluster's starter, the coordinator, 2 workers, the trainers' launcher, 2
            # trainers.
            self.assertGreaterEqual(len(started), 7, started)
            launcher.send_signal(signal.SIGTERM)
            returncode = launcher.wait(timeout=120)
            self.assertEqual(returncode, -signal.SIGTERM, self.read(log_dir, "launcher.err"))
            # Gone as the launcher exits; the poll only covers /proc catching up (the assertion
            # below names what is left when it times out).
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not still_running(started), 2.0, "the started processes' end")
            self.assertEqual(still_running(started), [],
                             "still running after the launcher exited")
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
            for pid, _ in still_running(started):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not os.environ.get("ZEROSHARD_KEEP_LOGS"):
                shutil.rmtree(log_dir, ignore_errors=True)

    @staticmethod
    def read(log_dir, name):
        with open(os.path.join(log_dir, name)) as f:
            return f.read()[-4000:]


class ConstructorTest(unittest.TestCase):
    def test_parameters_instead_of_the_model_is_a_type_error_saying_what_to_pass(self):
        # Fails before the fix: AttributeError: 'generator' object has no attribute
        # 'named_parameters'.
        trainer_torch()
        result = subprocess.run(
            [trainer_python(), "-c",
             "import torch, zeroshard.torch as zt\n"
             "model = torch.nn.Linear(2, 2)\n"
             "try:\n"
             "    zt.ShardedOptimizer(model.parameters(), 'adamw', lr=1e-3)\n"
             "except TypeError as e:\n"
             "    print('TypeError:', e)\n"],
            env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("TypeError: ShardedOptimizer takes the model (a torch.nn.Module), not "
                      "generator", result.stdout)
        self.assertIn("ShardedOptimizer(model, ", result.stdout)
        self.assertIn("param_groups=", result.stdout)


if __name__ == "__main__":
    unittest.main()
