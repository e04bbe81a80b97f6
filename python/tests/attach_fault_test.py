"""Faults of attached trainers on a real local cluster (coordinator and 2 workers from the
runfiles, trainers started here as zeroshard.launch would): a trainer killed with SIGKILL fails
its generation, the job FAILS (max_attempts 1) and both workers return to IDLE, while the other
trainer raises zt.WorkerLost; a worker killed with SIGKILL makes both trainers raise
zt.WorkerLost within the lease (3 s by default).
"""

import json
import os
import shutil
import signal
import time
import unittest

import zeroshard
from cluster_support import TrainerProcess, start_local_cluster, wait_until
from zeroshard._proto.zeroshard.v1 import job_pb2

LEASE_S = 3.0


class Trainer(TrainerProcess):
    """One rank's trainer process running attach_fault_script.py."""

    def __init__(self, rank, workers, run_id, coordinator, log_dir):
        super().__init__(rank, workers, run_id, coordinator, log_dir, "attach_fault_script.py")

    def steps(self):
        return sum(1 for line in self.read().splitlines() if line.startswith("step "))

    def worker_lost(self):
        for line in self.read().splitlines():
            if line.startswith("{"):
                return json.loads(line).get("worker_lost")
        return None


class AttachFaultTest(unittest.TestCase):
    def setUp(self):
        self.cluster, self.log_dir = start_local_cluster(2, "zs-fault-")
        self.client = zeroshard.Client(self.cluster.address)
        workers = sorted(self.client.workers(state="IDLE"), key=lambda w: w.name)
        self.assertEqual(len(workers), 2)
        self.trainers = [Trainer(rank, workers, f"fault-{os.getpid()}-{len(self.id())}",
                                 self.cluster.address, self.log_dir) for rank in range(2)]
        wait_until(lambda: all(t.steps() >= 3 for t in self.trainers), 60, "3 steps on both ranks")
        self.job = self.client.list()[0]

    def tearDown(self):
        for trainer in self.trainers:
            trainer.kill()
        self.cluster.stop_all()
        if not os.environ.get("ZEROSHARD_KEEP_LOGS"):
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def test_killed_trainer_fails_the_job_and_leaves_the_workers_idle(self):
        self.trainers[1].process.send_signal(signal.SIGKILL)
        lost = wait_until(self.trainers[0].worker_lost, 30, "rank 0 to raise WorkerLost")
        self.assertIn("worker", lost)
        job = wait_until(lambda: (j := self.client.get(self.job.id)).state == job_pb2.FAILED and j,
                         30, "the job to fail")
        # The first failure the coordinator hears ends the generation: the dead trainer's worker
        # (its trainer's connection closed or broke) or its peer, which saw that worker's run
        # fail; that worker lives on, so it "left the group" and was not lost.
        self.assertRegex(job.message, "trainer's connection|trainer closed|peer rank 1 left")
        wait_until(lambda: len(self.client.workers(state="IDLE")) == 2, 30, "idle workers")

    def test_killed_worker_makes_every_trainer_raise_worker_lost_within_the_lease(self):
        killed_at = time.monotonic()
        self.cluster.workers[1].signal_group(signal.SIGKILL)
        for rank, trainer in enumerate(self.trainers):
            lost = wait_until(trainer.worker_lost, 30, f"rank {rank} to raise WorkerLost")
            self.assertIn("worker", lost)
        self.assertLess(time.monotonic() - killed_at, LEASE_S,
                        [t.read()[-500:] for t in self.trainers])


if __name__ == "__main__":
    unittest.main()
