"""A collective call that only some ranks make, on a real local cluster (coordinator and 2
workers from the runfiles, trainers started here as zeroshard.launch would): it fails on every
rank within seconds, naming the call and the rank that did not join, and the job FAILS with that
message (docs/pytorch.md, "Collective calls"); a second ShardedOptimizer while one is alive is
refused at once, naming the first.
"""

import json
import os
import re
import shutil
import unittest

import zeroshard
from cluster_support import TrainerProcess, start_local_cluster, wait_until
from zeroshard._proto.zeroshard.v1 import job_pb2

# Within seconds on an idle machine; bounded generously for CI's load (the measured time is
# printed). Before the fix each case hung for minutes (2 for state_dict's manifest wait, then
# the collectives' 5-minute timeout).
BOUND_S = 30.0


class Trainer(TrainerProcess):
    """One rank's trainer process running attach_collective_calls_script.py."""

    def __init__(self, rank, workers, run_id, coordinator, log_dir, case, mode):
        super().__init__(rank, workers, run_id, coordinator, log_dir,
                         "attach_collective_calls_script.py", (case, mode))

    def result(self):
        """The script's JSON line ({"raised": ...} or {"done": true}), once printed."""
        for line in self.read().splitlines():
            if line.startswith("{") and ("raised" in line or "done" in line):
                return json.loads(line)
        return None

    def json_line(self, key):
        for line in self.read().splitlines():
            if line.startswith("{") and f'"{key}"' in line:
                return json.loads(line)
        return None

    def entered(self, call):
        match = re.search(rf"^entered {call} ([0-9.]+)$", self.read(), re.M)
        return float(match.group(1)) if match else None


class CollectiveCallsTest(unittest.TestCase):
    def setUp(self):
        self.cluster, self.log_dir = start_local_cluster(2, "zs-calls-")
        self.client = zeroshard.Client(self.cluster.address)
        self.workers = sorted(self.client.workers(state="IDLE"), key=lambda w: w.name)
        self.assertEqual(len(self.workers), 2)
        self.trainers = []

    def tearDown(self):
        for trainer in self.trainers:
            trainer.kill()
        self.cluster.stop_all()
        if not os.environ.get("ZEROSHARD_KEEP_LOGS"):
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def start(self, case, mode):
        run_id = f"calls-{os.getpid()}-{case}-{mode}".replace("_", "-")
        self.trainers = [Trainer(rank, self.workers, run_id, self.cluster.address, self.log_dir,
                                 case, mode) for rank in range(2)]

    def logs(self):
        return [t.read()[-3000:] for t in self.trainers]

    def results(self):
        return [wait_until(t.result, 240, f"rank {rank}'s outcome")
                for rank, t in enumerate(self.trainers)]

    def expect_job_failed_with(self, pattern):
        job = wait_until(lambda: (jobs := self.client.list()) and
                         jobs[0].state in (job_pb2.FAILED, job_pb2.SUCCEEDED) and jobs[0],
                         60, "the job to end")
        self.assertEqual(job_pb2.JobState.Name(job.state), "FAILED", job.message)
        self.assertRegex(job.message, pattern)
        return job

    def check_state_dict_on_rank_0(self, mode):
        # Fails before the fix: rank 0's state_dict() raised after 2 minutes (no manifest) and
        # rank 1 hung in step()'s collectives until their 5-minute timeout.
        self.start("state_dict_on_rank_0", mode)
        results = self.results()
        entered = self.trainers[0].entered("state_dict")
        self.assertIsNotNone(entered, self.logs())
        for rank, result in enumerate(results):
            self.assertIn("raised", result, (rank, self.logs()))
            elapsed = result["at"] - entered
            print(f"{mode}: rank {rank} raised {elapsed:.2f} s after rank 0 called state_dict(): "
                  f"{result['raised']}: {result['message']}", flush=True)
            self.assertLess(elapsed, BOUND_S, self.logs())
            # Both name the call and the rank that did not join it.
            self.assertIn("opt.state_dict()", result["message"])
            self.assertIn("rank 1", result["message"])
            self.assertIn("Collective calls", result["message"])
        self.assertRegex(results[0]["message"],
                         r"opt\.state_dict\(\) on rank 0 .*rank 1 called backward")
        self.assertRegex(results[1]["message"],
                         r"backward on rank 1 .*rank 0 called opt\.state_dict\(\)")
        self.expect_job_failed_with(r"opt\.state_dict\(\)")

    def test_state_dict_on_rank_0_only_fails_both_ranks_zero2(self):
        self.check_state_dict_on_rank_0("zero2")

    def test_state_dict_on_rank_0_only_fails_both_ranks_ddp(self):
        self.check_state_dict_on_rank_0("ddp")

    def test_uneven_step_counts_fail_both_ranks(self):
        # Fails before the fix: rank 0's worker ended its run (finish) while rank 1's step hung
        # in the collectives, with no message, until their 5-minute timeout.
        self.start("uneven_steps", "zero1")
        results = self.results()
        entered = self.trainers[0].entered("finish")
        self.assertIsNotNone(entered, self.logs())
        for rank, result in enumerate(results):
            self.assertIn("raised", result, (rank, self.logs()))
            elapsed = result["at"] - entered
            print(f"rank {rank} raised {elapsed:.2f} s after rank 0 called zt.finish(): "
                  f"{result['raised']}: {result['message']}", flush=True)
            self.assertLess(elapsed, BOUND_S, self.logs())
            self.assertIn("zt.finish()", result["message"])
            self.assertIn("backward", result["message"])
            self.assertIn("at step 2", result["message"])
        self.assertRegex(results[0]["message"], r"zt\.finish\(\).* on rank 0 .*rank 1 called")
        self.assertRegex(results[1]["message"], r"backward on rank 1 .*rank 0 called zt\.finish")
        self.expect_job_failed_with(r"zt\.finish\(\)")

    def test_a_second_sharded_optimizer_is_refused_naming_the_first(self):
        # Fails before the fix: the second optimizer was built without a word (no "refused"
        # line); its job would then have waited for the workers the first job holds, and its
        # first forward hung with no message.
        self.start("two_optimizers", "zero2")
        results = self.results()
        for rank, (trainer, result) in enumerate(zip(self.trainers, results)):
            self.assertEqual(result, {"done": True}, (rank, self.logs()))
            refused = trainer.json_line("refused")
            self.assertIsNotNone(refused, self.logs())
            message = refused["refused"]
            self.assertRegex(message, r"another ShardedOptimizer is alive in this process "
                             r"\(built at .*attach_collective_calls_script\.py:\d+, attached, "
                             r"job ")
            self.assertIn("zt.finish(first_optimizer)", message)
            self.assertLess(refused["at"] - trainer.entered("ShardedOptimizer"), BOUND_S)
        job = wait_until(lambda: (jobs := self.client.list()) and
                         jobs[0].state in (job_pb2.FAILED, job_pb2.SUCCEEDED) and jobs[0],
                         60, "the job to end")
        self.assertEqual(job_pb2.JobState.Name(job.state), "SUCCEEDED", job.message)
        self.assertEqual(len(self.client.list()), 1)


if __name__ == "__main__":
    unittest.main()
