"""zeroshard.launch's conventions (issue 27, item 2): where it takes the binaries of a local
cluster from (--bin_dir, then $ZEROSHARD_BIN_DIR, then PATH; Bazel's layout or side by side), and
torchrun's OMP_NUM_THREADS=1 for several ranks unless the user set it: unit checks of both rules,
then real local clusters at W = 2 (binaries from the runfiles) where launch_env_script.py reports
what its ranks and the workers got.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from cluster_support import load_cluster_module, runfiles_workspace
from zeroshard import launch

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_env_script.py")


def make_binaries(directory, bazel_layout, names=None):
    """Empty executables standing for the binaries in `directory`."""
    cluster = load_cluster_module()
    for relative in cluster.BINARIES.values():
        if names is not None and os.path.basename(relative) not in names:
            continue
        path = os.path.join(directory, relative if bazel_layout else os.path.basename(relative))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(path, stat.S_IRWXU)
    return directory


class FindBinDirTest(unittest.TestCase):
    def setUp(self):
        self.cluster = load_cluster_module()
        self.root = tempfile.mkdtemp(prefix="zs-bin-dir-")
        self.flat = make_binaries(os.path.join(self.root, "flat"), bazel_layout=False)
        self.bazel = make_binaries(os.path.join(self.root, "bazel"), bazel_layout=True)
        self.partial = make_binaries(os.path.join(self.root, "partial"), bazel_layout=False,
                                     names=("zeroshard-coordinator", "zeroshard"))
        self.empty = os.path.join(self.root, "empty")
        os.makedirs(self.empty)

    def tearDown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def find(self, flag=None, **environ):
        return launch.find_bin_dir(flag, self.cluster, environ)

    def test_the_flag_then_the_environment_then_path(self):
        path = os.pathsep.join([self.partial, self.flat])
        self.assertEqual(self.find(self.bazel, ZEROSHARD_BIN_DIR=self.flat, PATH=path),
                         (self.bazel, "--bin_dir"))
        self.assertEqual(self.find(None, ZEROSHARD_BIN_DIR=self.bazel, PATH=path),
                         (self.bazel, "$ZEROSHARD_BIN_DIR"))
        # The first PATH directory that holds all three (not the one with two of them).
        self.assertEqual(self.find(None, PATH=path), (self.flat, "PATH"))
        self.assertEqual(self.find(None, ZEROSHARD_BIN_DIR="", PATH=path), (self.flat, "PATH"))

    def test_a_directory_without_the_binaries_is_refused_naming_its_source(self):
        for flag, environ, names in ((self.empty, {"PATH": self.flat}, "--bin_dir"),
                                     (None, {"ZEROSHARD_BIN_DIR": self.partial,
                                             "PATH": self.flat}, "$ZEROSHARD_BIN_DIR")):
            with self.assertRaises(SystemExit) as raised:
                launch.find_bin_dir(flag, self.cluster, environ)
            message = str(raised.exception.code)
            self.assertIn(names, message)
            self.assertIn("zeroshard-worker", message)

    def test_none_anywhere_says_the_three_ways(self):
        # As in an installed package: no checkout (and so no checkout's build) around it.
        with mock.patch.object(launch, "REPO_ROOT", self.root), \
                self.assertRaises(SystemExit) as raised:
            self.find(None, PATH=os.pathsep.join([self.empty, self.partial]))
        message = str(raised.exception.code)
        for way in ("--bin_dir", "ZEROSHARD_BIN_DIR", "PATH", "tools/install_binaries.sh"):
            self.assertIn(way, message)


class OmpThreadsRuleTest(unittest.TestCase):
    def test_torchruns_rule(self):
        env = {}
        launch.limit_omp_threads(2, env)
        self.assertEqual(env, {"OMP_NUM_THREADS": "1"})
        for users in ("3", ""):  # set, even to nothing: kept
            env = {"OMP_NUM_THREADS": users}
            launch.limit_omp_threads(4, env)
            self.assertEqual(env, {"OMP_NUM_THREADS": users})
        env = {}
        launch.limit_omp_threads(1, env)  # one rank: left alone
        self.assertEqual(env, {})


class LaunchEnvironmentTest(unittest.TestCase):
    """W = 2 on real local clusters, as a user runs it: no ZEROSHARD_COORDINATOR."""

    def launch(self, launcher_args, **environ):
        """(the ranks' reports by rank, the launcher's stderr)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("ZEROSHARD_COORDINATOR", "ZEROSHARD_RANK", "OMP_NUM_THREADS",
                            "ZEROSHARD_BIN_DIR")}
        env["PYTHONPATH"] = os.path.join(runfiles_workspace(), "python")
        env.update(environ)
        log_dir = tempfile.mkdtemp(prefix="zs-launch-", dir="/tmp")  # short socket paths
        try:
            result = subprocess.run(
                [sys.executable, "-m", "zeroshard.launch", "--workers", "2", "--log_dir",
                 log_dir, *launcher_args, SCRIPT], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, timeout=300)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
        self.assertEqual(result.returncode, 0, result.stderr[-4000:])
        reports = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
                   if line.startswith("launch_env ")]
        return {report["rank"]: report for report in reports}, result.stderr

    def test_several_ranks_get_one_omp_thread_and_so_do_the_workers(self):
        reports, stderr = self.launch(["--bin_dir", runfiles_workspace()])
        self.assertEqual(sorted(reports), [0, 1])
        for report in reports.values():
            self.assertEqual(report["omp_num_threads"], "1")
            self.assertEqual(report["worker_omp_num_threads"], ["1", "1"])
        self.assertIn("zeroshard.launch: OMP_NUM_THREADS=1 for every rank", stderr)
        self.assertIn(f", binaries from --bin_dir: {runfiles_workspace()}\n", stderr)

    def test_the_users_value_is_kept(self):
        reports, stderr = self.launch([], OMP_NUM_THREADS="3",
                                      ZEROSHARD_BIN_DIR=runfiles_workspace())
        self.assertEqual(sorted(reports), [0, 1])
        for report in reports.values():
            self.assertEqual(report["omp_num_threads"], "3")
            self.assertEqual(report["worker_omp_num_threads"], ["3", "3"])
        self.assertNotIn("OMP_NUM_THREADS=1", stderr)
        self.assertIn(f", binaries from $ZEROSHARD_BIN_DIR: {runfiles_workspace()}\n", stderr)


if __name__ == "__main__":
    unittest.main()
