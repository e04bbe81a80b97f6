"""A dead trainer's restart on a real local cluster (a coordinator and 2 workers from the
runfiles, python3 -m zeroshard.launch against it): rank 1's trainer kills itself with SIGKILL in
the middle of step 12; with max_attempts 2 the launcher restarts both trainers, they resume from
the checkpoint of step 10 and end with the parameters of an uninterrupted run, and the job
SUCCEEDS. With max_attempts 1 the launcher does not restart, exits non-zero, and the job FAILS.
"""

import json
import os
import shutil
import struct
import subprocess
import unittest

import zeroshard
from zeroshard import _safetensors
from cluster_support import (runfiles_workspace, start_local_cluster, trainer_python,
                             trainer_torch, wait_until)
from zeroshard._proto.zeroshard.v1 import job_pb2

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attach_restart_script.py")
STEPS = 16
KILL_STEP = 12
CHECKPOINT_EVERY = 5


def read_safetensors(path):
    """{name: (shape, raw little-endian fp32 bytes)} of a file zt.save wrote."""
    tensors, _ = _safetensors.read_safetensors(path)
    return {name: (list(tensor.shape), tensor.data) for name, tensor in tensors.items()}


def max_abs_difference(a, b):
    count = len(a) // 4
    return max((abs(x - y) for x, y in zip(struct.unpack(f"<{count}f", a),
                                            struct.unpack(f"<{count}f", b))), default=0.0)


class AttachRestartTest(unittest.TestCase):
    def setUp(self):
        self.cluster, self.log_dir = start_local_cluster(2, "zs-restart-")
        self.client = zeroshard.Client(self.cluster.address)

    def tearDown(self):
        self.client.close()
        self.cluster.stop_all()
        if not os.environ.get("ZEROSHARD_KEEP_LOGS"):
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def launch(self, out, *script_args):
        """Runs the script under zeroshard.launch on this cluster's 2 workers once they are
        idle; (exit status, the trainers' JSON lines, the launcher's stderr, the job)."""
        wait_until(lambda: len(self.client.workers(state="IDLE")) == 2, 60, "2 idle workers")
        env = dict(os.environ)
        env.pop("ZEROSHARD_RANK", None)
        env["ZEROSHARD_COORDINATOR"] = self.cluster.address
        env["PYTHONPATH"] = os.path.join(runfiles_workspace(), "python")
        env["OMP_NUM_THREADS"] = "1"
        trainer_torch()
        result = subprocess.run(
            [trainer_python(), "-m", "zeroshard.launch", "--workers", "2", SCRIPT, "--steps",
             str(STEPS), "--checkpoint_every", str(CHECKPOINT_EVERY), "--out", out,
             *script_args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
        starts = [json.loads(line) for line in result.stdout.splitlines()
                  if line.startswith("{")]
        self.assertTrue(starts, result.stderr[-4000:])
        names = {start["job_name"] for start in starts}
        self.assertEqual(len(names), 1, starts)
        jobs = [j for j in self.client.list(limit=1000) if j.spec.name in names]
        self.assertEqual(len(jobs), 1, f"one job named {names}: {jobs}")
        final = wait_until(
            lambda: (j := self.client.get(jobs[0].id)).state in (
                job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED) and j,
            60, "the job to end")
        return result.returncode, starts, result.stderr, final

    def test_killed_trainer_is_restarted_and_resumes_from_the_latest_checkpoint(self):
        reference = os.path.join(self.log_dir, "reference.safetensors")
        status, starts, stderr, job = self.launch(reference, "--max_attempts", "2")
        self.assertEqual(status, 0, stderr[-4000:])
        self.assertEqual(sorted((s["restart_count"], s["start_step"]) for s in starts),
                         [(0, 0), (0, 0)])
        self.assertEqual(job_pb2.JobState.Name(job.state), "SUCCEEDED", job.message)
        self.assertEqual(job.attempts, 1)

        resumed = os.path.join(self.log_dir, "resumed.safetensors")
        status, starts, stderr, job = self.launch(resumed, "--max_attempts", "2", "--kill_step",
                                                  str(KILL_STEP))
        self.assertEqual(status, 0, stderr[-4000:])
        # Both ranks started twice: from step 0, then (ZEROSHARD_RESTART_COUNT 1) from the
        # checkpoint of step 10, the latest before the kill in step 12.
        self.assertEqual(sorted((s["rank"], s["restart_count"], s["start_step"]) for s in starts),
                         [(0, 0, 0), (0, 1, 10), (1, 0, 0), (1, 1, 10)])
        self.assertIn("restarting the trainers", stderr)
        self.assertEqual(job_pb2.JobState.Name(job.state), "SUCCEEDED", job.message)
        self.assertEqual(job.attempts, 2)
        self.assertEqual(job.generation, 2)

        # Checkpoints hold the fp32 parameters and optimizer state exactly, the data is seeded
        # by step index and the reductions run in a fixed order: the resumed run retraces the
        # uninterrupted one bit for bit.
        expected, actual = read_safetensors(reference), read_safetensors(resumed)
        self.assertEqual(sorted(expected), sorted(actual))
        for name, (shape, values) in expected.items():
            self.assertEqual(actual[name][0], shape, name)
            self.assertEqual(actual[name][1], values,
                             f"{name}: max |difference| "
                             f"{max_abs_difference(actual[name][1], values):g}")

    def test_without_attempts_left_the_launcher_does_not_restart(self):
        status, starts, stderr, job = self.launch(
            os.path.join(self.log_dir, "killed.safetensors"), "--max_attempts", "1",
            "--kill_step", str(KILL_STEP))
        self.assertNotEqual(status, 0)
        self.assertEqual(sorted((s["rank"], s["restart_count"]) for s in starts),
                         [(0, 0), (1, 0)])
        self.assertNotIn("restarting the trainers", stderr)
        self.assertIn("trainer rank 1 failed (exit status 137)", stderr)
        self.assertEqual(job_pb2.JobState.Name(job.state), "FAILED", job.message)
        self.assertEqual(job.attempts, 1)


if __name__ == "__main__":
    unittest.main()
