"""Tests of zeroshard.Client against a real local cluster (deploy/local/cluster.py: a coordinator
and 2 CPU workers from this test's runfiles): submit, watch, get, list, workers, plan, cancel, and
the errors of bad specs and unknown ids."""

import os
import subprocess
import sys
import tempfile
import unittest

import grpc

import zeroshard
from cluster_support import load_cluster_module, runfiles_workspace, wait_until
from zeroshard import client as client_module
from zeroshard._proto.zeroshard.v1 import coordinator_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._proto.zeroshard.v1 import shard_plan_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2
from zeroshard._proto.zeroshard.v1 import worker_pb2

WORKERS = 2
# A job of the built-in `seed` model that ends in a second or two.
SEED_STEPS = 20
# A job that runs until it is cancelled.
ENDLESS_STEPS = 10**9
# Generous: the machine's cores are shared with other builds.
JOB_TIMEOUT_S = 120
START_TIMEOUT_S = 60
UNKNOWN_JOB = "job-999999"


def spec_dict(name, steps, **overrides):
    spec = {
        "name": name,
        "workload": {"preset": "seed"},
        "optimizer": {"kind": "ADAMW", "lr": 0.01},
        "mode": "ZERO2",
        "steps": steps,
        "minWorkers": WORKERS,
    }
    spec.update(overrides)
    return spec


class OfflineTest(unittest.TestCase):
    """What needs no coordinator: the package's imports, spec conversion, the address."""

    def test_import_does_not_load_torch(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        program = "import sys, zeroshard; print(sorted(m for m in sys.modules if 'torch' in m))"
        result = subprocess.run(
            [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
        )
        self.assertEqual(result.stdout.strip(), "[]")

    def test_spec_dict_with_json_and_proto_names(self):
        spec = client_module.job_spec(
            spec_dict("named", 7, paramGroups=[{"patterns": ["*.bias"], "weight_decay": 0}])
        )
        self.assertIsInstance(spec, job_pb2.JobSpec)
        self.assertEqual(spec.optimizer.kind, job_pb2.ADAMW)
        self.assertEqual(spec.mode, job_pb2.ZERO2)
        self.assertEqual(spec.steps, 7)
        self.assertEqual(spec.min_workers, WORKERS)
        self.assertEqual(list(spec.param_groups[0].patterns), ["*.bias"])
        self.assertTrue(spec.param_groups[0].HasField("weight_decay"))

    def test_spec_message_passes_through(self):
        spec = job_pb2.JobSpec(name="as-is", steps=3)
        self.assertIs(client_module.job_spec(spec), spec)

    def test_bad_spec_keys_name_the_key(self):
        cases = [
            ({"optimiser": {}}, "spec.optimiser"),
            ({"optimizer": {"kind": "SGD", "lrr": 0.1}}, "spec.optimizer.lrr"),
            ({"paramGroups": [{"patterns": ["a"]}, {"decay": 0}]}, "spec.param_groups[1].decay"),
        ]
        for spec, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(zeroshard.Error) as raised:
                    client_module.job_spec(spec)
                self.assertIs(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(raised.exception.field, field)
                self.assertIn(field.rsplit(".", 1)[-1].split("[")[0], str(raised.exception))

    def test_bad_spec_values_name_the_field(self):
        cases = [
            ({"optimizer": {"lr": "fast"}}, "spec.optimizer.lr"),
            ({"optimizer": {"kind": "ADAMQ"}}, "spec.optimizer.kind"),
            ({"steps": 1.5}, "spec.steps"),
            ({"workload": {"layer_sizes": [10, "x"]}}, "spec.workload.layer_sizes"),
        ]
        for spec, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(zeroshard.Error) as raised:
                    client_module.job_spec(spec)
                self.assertIs(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(raised.exception.field, field)

    def test_spec_of_another_type_is_a_type_error(self):
        with self.assertRaises(TypeError):
            client_module.job_spec(["name", "x"])

    def test_address_from_the_environment(self):
        saved = os.environ.get(client_module.COORDINATOR_ENV)
        try:
            os.environ[client_module.COORDINATOR_ENV] = "127.0.0.1:1"
            with zeroshard.Client() as client:
                self.assertEqual(client.address, "127.0.0.1:1")
            del os.environ[client_module.COORDINATOR_ENV]
            with self.assertRaises(zeroshard.Error) as raised:
                zeroshard.Client()
            self.assertEqual(raised.exception.field, "address")
        finally:
            if saved is not None:
                os.environ[client_module.COORDINATOR_ENV] = saved

    def test_bad_state_filter_names_the_argument(self):
        with zeroshard.Client("127.0.0.1:1") as client:
            with self.assertRaises(zeroshard.Error) as raised:
                client.list(state="DONE")
            self.assertEqual(raised.exception.field, "state")
            with self.assertRaises(zeroshard.Error) as raised:
                client.workers(state="RUNNING")
            self.assertEqual(raised.exception.field, "state")

    def test_unreachable_coordinator_is_unavailable(self):
        # Port 1 on loopback refuses connections: the call fails fast, not at the deadline.
        with zeroshard.Client("127.0.0.1:1") as client:
            with self.assertRaises(zeroshard.Error) as raised:
                client.get("job-000001", timeout=30)
            self.assertIs(raised.exception.code, grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(zeroshard.Error) as raised:
                list(client.watch("job-000001", timeout=30))
            self.assertIs(raised.exception.code, grpc.StatusCode.UNAVAILABLE)


class ClusterTest(unittest.TestCase):
    """One cluster for all the tests; each test leaves the workers idle again."""

    @classmethod
    def setUpClass(cls):
        cluster_module = load_cluster_module()
        log_dir = os.path.join(os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(), "cluster")
        os.makedirs(log_dir, exist_ok=True)
        args, _ = cluster_module.parse_args([
            "--workers", str(WORKERS),
            "--bin_dir", runfiles_workspace(),
            "--log_dir", log_dir,
            "--heartbeat_period", "200ms",
            "--start_timeout", str(START_TIMEOUT_S),
        ])
        binaries = cluster_module.find_binaries(args.bin_dir)
        cls.cluster = cluster_module.Cluster(args, binaries, log_dir)
        try:
            cls.cluster.start_coordinator()
            cls.cluster.start_workers()
            cls.cluster.wait_for_idle_workers()
        except BaseException as e:
            if isinstance(e, cluster_module.ClusterError) and len(e.args) > 1:
                cluster_module.print_log_tails(e.args[1])
            cls.cluster.stop_all()
            raise
        cls.client = zeroshard.Client(cls.cluster.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop_all()

    def tearDown(self):
        # Jobs of a failed test must not hold the workers of the next.
        unfinished = [job for state in ("PENDING", "RUNNING", "RECOVERING")
                      for job in self.client.list(state=state)]
        for job in unfinished:
            self.client.cancel(job.id, reason="test cleanup")
        self.wait_for_idle_workers()

    def wait_for_idle_workers(self):
        wait_until(lambda: len(self.client.workers(state="IDLE")) == WORKERS, JOB_TIMEOUT_S,
                   f"{WORKERS} idle workers")

    def watch_until_state(self, job_id, state):
        """The job's events up to and including its first STATE_CHANGED to `state`."""
        events = []
        for event in self.client.watch(job_id, timeout=JOB_TIMEOUT_S):
            events.append(event)
            if event.type == job_pb2.STATE_CHANGED and event.state == state:
                return events
        self.fail(f"the watch of {job_id} ended without reaching {job_pb2.JobState.Name(state)}: "
                  f"{[job_pb2.JobEventType.Name(e.type) for e in events]}")

    def test_seed_job_runs_to_success(self):
        submitted = self.client.submit(spec_dict("pyclient-seed", SEED_STEPS))
        self.assertIsInstance(submitted, job_pb2.Job)
        self.assertTrue(submitted.id)
        self.assertEqual(submitted.spec.name, "pyclient-seed")
        self.assertEqual(submitted.spec.steps, SEED_STEPS)
        # The coordinator applied the defaults the dict left out.
        self.assertEqual(submitted.spec.max_workers, WORKERS)
        self.assertGreater(submitted.spec.global_batch, 0)

        events = list(self.client.watch(submitted.id, timeout=JOB_TIMEOUT_S))
        types = [event.type for event in events]
        self.assertIn(job_pb2.STATE_CHANGED, types)
        self.assertIn(job_pb2.GENERATION_STARTED, types)
        self.assertIn(job_pb2.PROGRESS, types)
        self.assertEqual([event.sequence for event in events], list(range(1, len(events) + 1)))
        self.assertTrue(all(event.job_id == submitted.id for event in events))
        last = events[-1]
        self.assertEqual((last.type, last.state), (job_pb2.STATE_CHANGED, job_pb2.SUCCEEDED))
        progress_steps = [event.progress.step for event in events if event.type == job_pb2.PROGRESS]
        self.assertEqual(progress_steps, sorted(progress_steps))
        self.assertEqual(progress_steps[-1], SEED_STEPS)

        # Resuming after the first events replays only the rest.
        resumed = list(self.client.watch(submitted.id, after_sequence=2, timeout=JOB_TIMEOUT_S))
        self.assertEqual([event.sequence for event in resumed],
                         [event.sequence for event in events[2:]])

        job = self.client.get(submitted.id)
        self.assertIsInstance(job, job_pb2.Job)
        self.assertEqual(job.state, job_pb2.SUCCEEDED)
        self.assertEqual(job.progress.step, SEED_STEPS)
        self.assertEqual(len(job.worker_ids), WORKERS)

        self.assertIn(submitted.id, [j.id for j in self.client.list()])
        self.assertIn(submitted.id, [j.id for j in self.client.list(state=job_pb2.SUCCEEDED)])
        self.assertIn(submitted.id, [j.id for j in self.client.list(state="SUCCEEDED")])
        self.assertNotIn(submitted.id, [j.id for j in self.client.list(state="RUNNING")])
        self.assertEqual(len(self.client.list(limit=1)), 1)

        # An ended job's plan is its last generation's.
        plan = self.client.plan(submitted.id, rank=WORKERS - 1)
        self.assertEqual(plan.world_size, WORKERS)
        self.assertEqual(plan.generation, job.generation)
        self.assertEqual(plan.rank, WORKERS - 1)
        with self.assertRaises(zeroshard.Error) as raised:
            self.client.plan(submitted.id, generation=job.generation + 1)
        self.assertIs(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        with self.assertRaises(zeroshard.Error) as raised:
            self.client.cancel(submitted.id)
        self.assertIs(raised.exception.code, grpc.StatusCode.FAILED_PRECONDITION)

        self.wait_for_idle_workers()
        workers = self.client.workers()
        self.assertEqual(len(workers), WORKERS)
        for worker in workers:
            self.assertIsInstance(worker, worker_pb2.WorkerInfo)
            self.assertEqual(worker.state, worker_pb2.IDLE)
        self.assertEqual(sorted(w.name for w in workers),
                         [f"worker-{i}" for i in range(WORKERS)])
        self.assertEqual(sorted(w.id for w in workers), sorted(job.worker_ids))
        self.assertEqual(self.client.workers(state=worker_pb2.BUSY), [])

    def test_endless_job_is_planned_and_cancelled(self):
        submitted = self.client.submit(job_pb2.JobSpec(
            name="pyclient-endless",
            workload=job_pb2.WorkloadSpec(preset="seed"),
            optimizer=job_pb2.OptimizerSpec(kind=job_pb2.SGD, lr=0.01, momentum=0.9),
            mode=job_pb2.ZERO2,
            steps=ENDLESS_STEPS,
            min_workers=WORKERS,
        ))
        self.watch_until_state(submitted.id, job_pb2.RUNNING)
        running = self.client.get(submitted.id)
        self.assertEqual(running.state, job_pb2.RUNNING)
        self.assertEqual(sorted(w.id for w in self.client.workers(state="BUSY")),
                         sorted(running.worker_ids))

        plans = [self.client.plan(submitted.id, rank=rank, include_layout=True)
                 for rank in range(WORKERS)]
        for rank, plan in enumerate(plans):
            self.assertIsInstance(plan, shard_plan_pb2.ShardPlan)
            self.assertEqual((plan.job_id, plan.rank, plan.world_size),
                             (submitted.id, rank, WORKERS))
            self.assertEqual(plan.generation, running.generation)
            self.assertEqual(len(plan.tensors), plan.tensor_count)
            self.assertEqual(len(plan.pieces), plan.bucket_count)
        # The seed model: Linear(10, 64) and Linear(64, 10).
        self.assertEqual(plans[0].model_elems, 10 * 64 + 64 + 64 * 10 + 10)
        self.assertEqual(plans[0].layout_hash, plans[1].layout_hash)
        self.assertEqual({t.name for t in plans[0].tensors},
                         {"0.weight", "0.bias", "2.weight", "2.bias"})
        # The ranks' pieces tile the padded flat space, each rank owning its own part.
        ranges = sorted((p.flat_begin, p.flat_end) for plan in plans for p in plan.pieces)
        self.assertEqual(ranges[0][0], 0)
        self.assertEqual(ranges[-1][1], plans[0].total_elems)
        for (_, end), (begin, _) in zip(ranges, ranges[1:]):
            self.assertEqual(end, begin)
        self.assertEqual(len(self.client.plan(submitted.id).tensors), 0)
        with self.assertRaises(zeroshard.Error) as raised:
            self.client.plan(submitted.id, rank=WORKERS)
        self.assertIs(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(raised.exception.field, "rank")

        # The deadline of a watch that outlives it surfaces as an Error, not a grpc.RpcError.
        with self.assertRaises(zeroshard.Error) as raised:
            for _ in self.client.watch(submitted.id, timeout=1.0):
                pass
        self.assertIs(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

        cancelled = self.client.cancel(submitted.id, reason="pyclient test")
        self.assertEqual(cancelled.state, job_pb2.CANCELLED)
        self.assertEqual(cancelled.message, "cancelled: pyclient test")
        events = list(self.client.watch(submitted.id, timeout=JOB_TIMEOUT_S))
        self.assertEqual((events[-1].type, events[-1].state),
                         (job_pb2.STATE_CHANGED, job_pb2.CANCELLED))
        self.assertEqual(self.client.get(submitted.id).state, job_pb2.CANCELLED)
        self.assertIn(submitted.id, [j.id for j in self.client.list(state="CANCELLED")])
        self.wait_for_idle_workers()

    def test_bad_specs_are_invalid_arguments_naming_the_field(self):
        before = {job.id for job in self.client.list()}
        cases = [
            (spec_dict("bad-lr", 5, optimizer={"kind": "ADAMW", "lr": -1}), "spec.optimizer.lr"),
            (spec_dict("bad-preset", 5, workload={"preset": "no-such-preset"}),
             "spec.workload.preset"),
            (job_pb2.JobSpec(name="bad-steps", workload=job_pb2.WorkloadSpec(preset="seed"),
                             optimizer=job_pb2.OptimizerSpec(kind=job_pb2.SGD), steps=-3),
             "spec.steps"),
            (spec_dict("Bad Name", 5), "spec.name"),
            (spec_dict("unknown-key", 5, optimizer={"kind": "ADAMW", "learning_rate": 0.1}),
             "spec.optimizer.learning_rate"),
        ]
        for spec, field in cases:
            with self.subTest(field=field):
                with self.assertRaises(zeroshard.Error) as raised:
                    self.client.submit(spec)
                error = raised.exception
                self.assertIs(error.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(error.field, field)
                self.assertTrue(str(error).startswith(f"INVALID_ARGUMENT: {field}: "), str(error))
        # Nothing was stored.
        self.assertEqual({job.id for job in self.client.list()}, before)

    def test_unknown_job_is_not_found(self):
        calls = {
            "get": lambda: self.client.get(UNKNOWN_JOB),
            "cancel": lambda: self.client.cancel(UNKNOWN_JOB),
            "watch": lambda: list(self.client.watch(UNKNOWN_JOB, timeout=JOB_TIMEOUT_S)),
            "plan": lambda: self.client.plan(UNKNOWN_JOB),
        }
        for name, call in calls.items():
            with self.subTest(method=name):
                with self.assertRaises(zeroshard.Error) as raised:
                    call()
                self.assertIs(raised.exception.code, grpc.StatusCode.NOT_FOUND)
                self.assertIsNone(raised.exception.field)
                self.assertIn(UNKNOWN_JOB, raised.exception.message)


class PagingTest(unittest.TestCase):
    """list() and workers() follow the coordinator's pages: more jobs and workers than its
    largest page (1000) come back complete, in order. A coordinator of its own, without worker
    processes: the workers are registered directly and never heartbeat. They are CUDA workers,
    so the (CPU) jobs stay PENDING."""

    JOBS = 1050
    FAKE_WORKERS = 1050

    @classmethod
    def setUpClass(cls):
        # More PENDING jobs than one submitter may queue by default (1000).
        cls.cluster, cls.log_dir = _start_coordinator_only(
            "zs-paging-", f"--max_pending_jobs_per_submitter={cls.JOBS}")
        cls.client = zeroshard.Client(cls.cluster.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop_all()

    def test_list_and_workers_page_transparently(self):
        with grpc.insecure_channel(self.cluster.address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            registered = [
                stub.RegisterWorker(
                    coordinator_pb2.RegisterWorkerRequest(
                        name=f"paged-{i}", host="host-a", device_kind=types_pb2.CUDA
                    ),
                    timeout=30,
                ).worker_id
                for i in range(self.FAKE_WORKERS)
            ]
        submitted = [
            self.client.submit({"name": f"paged-{i}", "workload": {"preset": "seed"},
                                "optimizer": {"kind": "SGD"}}).id
            for i in range(self.JOBS)
        ]
        newest_first = list(reversed(submitted))

        self.assertEqual([w.id for w in self.client.workers()], registered)
        self.assertEqual([j.id for j in self.client.list()], newest_first)
        self.assertEqual([j.id for j in self.client.list(state="PENDING")], newest_first)
        self.assertEqual([j.id for j in self.client.list(limit=1020)], newest_first[:1020])
        self.assertEqual([j.id for j in self.client.list(limit=3)], newest_first[:3])
        with self.assertRaises(ValueError):
            self.client.list(limit=0)


def _start_coordinator_only(prefix, *coordinator_flags):
    cluster_module = load_cluster_module()
    log_dir = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))
    args, _ = cluster_module.parse_args(
        ["--workers", "0", "--bin_dir", runfiles_workspace(), "--log_dir", log_dir] +
        [f"--coordinator_flag={flag}" for flag in coordinator_flags])
    cluster = cluster_module.Cluster(args, cluster_module.find_binaries(args.bin_dir), log_dir)
    cluster.start_coordinator()
    return cluster, log_dir


if __name__ == "__main__":
    unittest.main()
