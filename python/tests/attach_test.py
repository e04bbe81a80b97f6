"""Attached PyTorch trainers on a real local cluster (python3 -m zeroshard.launch, which starts a
coordinator and workers from this test's runfiles): zt.ShardedOptimizer agrees with torch's DDP +
ZeroRedundancyOptimizer within 1e-6 after 30 steps for W = 1, 2, 3 (attach_equivalence_script.py
says what it trains), and bad input raises an exception naming the parameter
(attach_bad_input_script.py).
"""

import json
import os
import subprocess
import shutil
import sys
import tempfile
import unittest


def runfiles_workspace():
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        return os.path.join(srcdir, os.environ.get("TEST_WORKSPACE", "zeroshard"))
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(workers, script, *script_args, timeout_s=600):
    """Runs `script` under zeroshard.launch on a fresh local cluster; (exit status, stdout)."""
    root = runfiles_workspace()
    env = dict(os.environ)
    env.pop("ZEROSHARD_COORDINATOR", None)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "python"),
                                         os.path.dirname(os.path.abspath(__file__))])
    env["OMP_NUM_THREADS"] = "1"
    # Short: the workers' attach sockets live there, and a unix socket path has at most 107
    # bytes (Bazel's TEST_TMPDIR is longer).
    log_dir = tempfile.mkdtemp(prefix="zs-attach-", dir="/tmp")
    command = [sys.executable, "-m", "zeroshard.launch", "--workers", str(workers),
               "--bin_dir", root, "--log_dir", log_dir,
               os.path.join(os.path.dirname(os.path.abspath(__file__)), script)] + list(script_args)
    try:
        result = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, timeout=timeout_s)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-6000:])
    return result.returncode, result.stdout


class AttachEquivalenceTest(unittest.TestCase):
    def check_world_size(self, workers):
        status, out = launch(workers, "attach_equivalence_script.py")
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for line in lines:
            print(json.dumps(line))
        self.assertEqual(len(lines), 5, out)
        for line in lines:
            self.assertEqual(line["world_size"], workers)
            self.assertLessEqual(line["worst_relative"], 1e-6, line)
            self.assertTrue(line["ok"], line)
        self.assertEqual(status, 0)

    def test_one_worker(self):
        self.check_world_size(1)

    def test_two_workers(self):
        self.check_world_size(2)

    def test_three_workers(self):
        self.check_world_size(3)


class SeedExampleTest(unittest.TestCase):
    """examples/torch_seed_mlp.py: the three ways agree within 1e-6 over 80 steps (it exits 1
    otherwise), for AdamW and SGD."""

    def test_adamw_and_sgd(self):
        example = os.path.join(runfiles_workspace(), "examples", "torch_seed_mlp.py")
        for optimizer in ("adamw", "sgd"):
            status, out = launch(2, example, "--optimizer", optimizer)
            print(out[-600:])
            self.assertEqual(status, 0, out)
            self.assertIn("torch vs zeroshard", out)


class AttachBadInputTest(unittest.TestCase):
    def test_every_bad_input_names_the_parameter(self):
        status, out = launch(1, "attach_bad_input_script.py")
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for line in lines:
            print(json.dumps(line))
        self.assertEqual(len(lines), 7, out)
        self.assertEqual([line["case"] for line in lines if not line["ok"]], [])
        self.assertEqual(status, 0)


if __name__ == "__main__":
    unittest.main()
