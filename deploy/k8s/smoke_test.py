"""The rendered cpu overlay, smoke-run as local processes (smoke.py says what is mapped and how):
a coordinator and two workers pass their readiness probes and the jobs example's CLI runs a
`seed` job, during which the coordinator is killed with SIGKILL and restarted as kubelet would;
the workers, never restarted, re-register and the restarted coordinator adopts the running
generation, which goes on to SUCCEEDED. A copy with one flag misspelled fails, on that flag."""

import copy
import json
import os
import subprocess
import tempfile
import time
import unittest

import manifests
import smoke
from cluster_support import load_cluster_module, runfiles_workspace, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
READY_TIMEOUT_S = 90
JOB_TIMEOUT_S = 180
CLI_TIMEOUT_S = 30
# Workers beat every second and register again on the first beat the restarted coordinator does
# not know; it adopts their ranks for 2 leases (6 s).
REREGISTER_TIMEOUT_S = 30
# The job's steps: the example's default (100) ends within a fraction of a second, too soon for a
# coordinator restart to land mid-job; this many run for seconds (1 to 2 ms a step here).
STEPS = 5000


def make_secrets(directory):
    """The Secrets docs/deploy.md has an operator create, made by deploy/local/cluster.py's
    Credentials: zeroshard-tls (a CA and the coordinator's certificate, here for 127.0.0.1 as well
    as its Service name) and zeroshard-tokens (the coordinator's token file and the worker and
    submitter tokens). Returns (the Secrets, the Credentials: the operator's admin token too)."""
    made = load_cluster_module().Credentials(
        directory, tls=True, tokens=True, worker_certs=(),
        server_names=("zeroshard-coordinator", "localhost", "127.0.0.1"))

    def read(path):
        with open(path) as f:
            return f.read()

    cert, key = made.server
    return {
        "zeroshard-tls": {"ca.pem": read(made.ca), "tls.crt": read(cert), "tls.key": read(key)},
        "zeroshard-tokens": {
            "tokens": read(made.coordinator_token_file),
            "worker.token": read(made.token_files["worker"]),
            "submitter.token": read(made.token_files["submitter"]),
        },
    }, made


def with_steps(jobs, steps):
    """A copy of the rendered jobs example whose `submit` runs `steps` steps."""
    jobs = copy.deepcopy(jobs)
    [job] = [o for o in jobs if o["kind"] == "Job"]
    args = manifests.pod_spec(job)["containers"][0]["args"]
    args.insert(args.index("submit") + 1, f"--steps={steps}")
    return job


class SmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        root = manifests.copy_tree(HERE, os.path.join(cls.tmp, "k8s"))
        cls.cpu = manifests.render(os.path.join(root, "overlays", "cpu"))
        cls.jobs = manifests.render(os.path.join(root, "jobs"))
        cls.secrets, cls.credentials = make_secrets(os.path.join(cls.tmp, "secrets"))

    def cluster(self, objects, name):
        cluster = smoke.LocalCluster(objects, os.path.join(self.tmp, name), runfiles_workspace(),
                                     self.secrets)
        self.addCleanup(cluster.stop)  # stops every process, whatever failed
        return cluster

    # --- the operator's CLI -----------------------------------------------------------------------

    def cli(self, cluster, *args, timeout=CLI_TIMEOUT_S):
        """`zeroshard ARGS` as docs/deploy.md has the operator run it from their machine: through a
        port-forward to the coordinator's Service (here: its pod's local port), with the CA and
        the admin token. Returns the CompletedProcess."""
        argv = [os.path.join(runfiles_workspace(), smoke.BINARIES["/usr/local/bin/zeroshard"]),
                f"--coordinator=localhost:{cluster.service_port('zeroshard-coordinator', 50051)}",
                f"--ca={self.credentials.ca}",
                f"--token_file={self.credentials.token_files['admin']}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def get_job(self, cluster, job_id):
        result = self.cli(cluster, "get", job_id, "--output=json")
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout)

    def job_named(self, cluster, name):
        """The id of the job `zeroshard jobs` lists under `name`, or None."""
        result = self.cli(cluster, "jobs")
        self.assertEqual(result.returncode, 0, result.stderr)
        for line in result.stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[-1] == name:
                return fields[0]
        return None

    def live_workers(self, cluster):
        """{name: id} of the workers `zeroshard workers` lists IDLE or BUSY."""
        result = self.cli(cluster, "workers")
        self.assertEqual(result.returncode, 0, result.stderr)
        live = {}
        for line in result.stdout.splitlines()[1:]:
            worker_id, name, _, _, state = line.split()[:5]
            if state in ("IDLE", "BUSY"):
                live[name] = worker_id
        return live

    def wait_for(self, cluster, condition, timeout_s, what, poll_s=0.05):
        """wait_until, failing with the end of every container's log."""
        try:
            return wait_until(condition, timeout_s, what, poll_s)
        except AssertionError as timed_out:
            self.fail(f"{timed_out}; the logs' ends:\n" + "\n".join(
                f"--- {p.label} (restarts: {p.restarts}):\n{p.tail(40)}"
                for p in cluster.processes))

    # --- the tests --------------------------------------------------------------------------------

    def test_rendered_cpu_overlay_runs_a_seed_job_through_a_coordinator_restart(self):
        cluster = self.cluster(self.cpu, "run")
        cluster.start()
        self.assertEqual(sorted(p.label for p in cluster.processes),
                         ["zeroshard-coordinator-0/coordinator", "zeroshard-worker-0/worker",
                          "zeroshard-worker-1/worker"])
        cluster.wait_ready(READY_TIMEOUT_S)
        for process in cluster.processes:
            self.assertTrue(cluster.probe(process, "livenessProbe"), process.label)
        # The workers registered under their pod names (--name=$(POD_NAME)).
        logs = {p.pod.name: p.tail(200) for p in cluster.processes}
        worker_names = ["zeroshard-worker-0", "zeroshard-worker-1"]
        for worker in worker_names:
            self.assertIn("registered as", logs[worker])
            # --host=$(NODE_NAME): each on its own "node".
            self.assertIn(f"name={worker} host=node-{worker}", logs["zeroshard-coordinator-0"])
        [coordinator] = [p for p in cluster.processes if p.container["name"] == "coordinator"]
        workers = [p for p in cluster.processes if p.container["name"] == "worker"]
        worker_pids = {p.pod.name: p.popen.pid for p in workers}
        worker_ids = self.live_workers(cluster)
        self.assertEqual(sorted(worker_ids), worker_names)

        # The jobs example's CLI submits and watches; long enough to be restarted under.
        job = with_steps(self.jobs, STEPS)
        job_args = manifests.pod_spec(job)["containers"][0]["args"]
        [job_name] = [a.split("=", 1)[1] for a in job_args if a.startswith("--name=")]
        submit = cluster.start_job(job)

        def submitted():
            if submit.popen.poll() is not None:
                self.fail(f"the Job's CLI exited with {submit.popen.returncode}:\n{submit.tail()}")
            return self.job_named(cluster, job_name)

        job_id = wait_until(submitted, CLI_TIMEOUT_S, f"a job named {job_name}", poll_s=0.05)

        # Mid-job: RUNNING, with a step done.
        def mid_job():
            state = self.get_job(cluster, job_id)
            if state["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                self.fail(f"{job_id} ended before the coordinator was restarted: {state}")
            if state["state"] == "RUNNING" and int(state.get("progress", {}).get("step", 0)) > 0:
                return state
            return None

        before = wait_until(mid_job, JOB_TIMEOUT_S, f"{job_id} RUNNING with a step done",
                            poll_s=0.05)
        generation = int(before["generation"])
        log_sizes = {p.pod.name: os.path.getsize(p.log_path) for p in workers}
        killed_at = time.monotonic()
        coordinator = cluster.restart_container(coordinator)
        print(f"coordinator killed at step {before['progress']['step']} of {STEPS} "
              f"(generation {generation}) and started again")

        # The coordinator is back on the same ports; the workers, not restarted, re-register and
        # the restarted coordinator adopts their ranks of the running generation.
        cluster.wait_ready(READY_TIMEOUT_S, [coordinator])
        adopted = f"the coordinator adopted {job_id} generation {generation} rank "

        def registered_again(process):
            with open(process.log_path) as log:
                log.seek(log_sizes[process.pod.name])
                lines = [line for line in log if "registered as" in line]
            if lines and adopted not in lines[-1]:
                self.fail(f"{process.label} registered again without its run: {lines[-1]}")
            return bool(lines)

        for process in workers:
            self.wait_for(cluster, lambda process=process: registered_again(process),
                          REREGISTER_TIMEOUT_S,
                          f"{process.label} to register again with its run ({adopted!r})")
        print(f"both workers registered again, {time.monotonic() - killed_at:.2f} s after the kill")
        cluster.wait_ready(READY_TIMEOUT_S, workers)  # /readyz: 200 again
        # Under the ids they had: adopted, not registered anew.
        self.assertEqual(self.live_workers(cluster), worker_ids)

        # The Job's own `submit --watch` rides through the restart (it reconnects while the
        # coordinator is unreachable, --reconnect_for) and exits 0 once the job SUCCEEDED, so the
        # Kubernetes Job completes. Then watch again, to the end, as a user would: the events from
        # the start of the job, one per line.
        submit.popen.wait(CLI_TIMEOUT_S)
        self.assertEqual(submit.popen.returncode, 0, submit.tail())
        self.assertIn("reconnecting", submit.tail(100000))
        deadline = time.monotonic() + JOB_TIMEOUT_S

        def watched():
            result = self.cli(cluster, "watch", job_id, "--output=json",
                              timeout=max(1.0, deadline - time.monotonic()))
            return None if result.returncode == 4 else result  # 4: unreachable; again

        watch = wait_until(watched, JOB_TIMEOUT_S, f"zeroshard watch {job_id}", poll_s=0.2)
        self.assertEqual(watch.returncode, 0, watch.stderr)  # 0: SUCCEEDED
        events = [json.loads(line) for line in watch.stdout.splitlines() if line.strip()]
        self.assertEqual(events[-1].get("state"), "SUCCEEDED", events[-1])

        def index_of(matches, what):
            found = [i for i, event in enumerate(events) if matches(event)]
            self.assertEqual(len(found), 1, f"{what}: events {found}")
            return found[0]

        notice = index_of(lambda e: e.get("type") == "NOTICE" and e.get("message", "").startswith(
            f"coordinator restarted: adopting generation {generation} from its 2 workers"),
            "the restarted coordinator's NOTICE")
        adoption = index_of(lambda e: e.get("type") == "STATE_CHANGED" and e.get("message") ==
                            f"generation {generation} adopted after a coordinator restart",
                            "the adoption")
        self.assertEqual(events[adoption]["state"], "RUNNING")
        self.assertLess(notice, adoption)
        # The kill landed mid-job: a step was reported before the restart.
        self.assertTrue(any(e.get("type") == "PROGRESS" for e in events[:notice]))
        # Adopted, not recovered: one generation, never RECOVERING.
        self.assertEqual([int(e.get("generation", 0)) for e in events
                          if e.get("type") == "GENERATION_STARTED"], [generation])
        self.assertNotIn("RECOVERING", [e.get("state") for e in events])
        print("the restart in the job's events:\n" + "\n".join(
            f"  {e.get('type')} {e.get('state', '')} {e.get('message', '')}"
            for e in events if e.get("type") != "PROGRESS"))
        after = self.get_job(cluster, job_id)
        self.assertEqual(after["state"], "SUCCEEDED")
        self.assertEqual(int(after["generation"]), generation)
        self.assertEqual(after.get("attempts"), 1)
        self.assertEqual(int(after["progress"]["step"]), STEPS)

        # No worker was restarted: the same processes, still running, ready, and listed live.
        for process in workers:
            self.assertIn(process, cluster.processes)
            self.assertEqual(process.popen.pid, worker_pids[process.pod.name])
            self.assertIsNone(process.popen.poll(), process.label)
            self.assertTrue(cluster.probe(process, "readinessProbe"), process.label)
        self.assertEqual(self.live_workers(cluster), worker_ids)
        self.assertEqual(coordinator.restarts, 1)
        # The workers wrote the final checkpoint to the shared checkpoint volume.
        checkpoints = os.path.join(self.tmp, "run", "pvc", "zeroshard-checkpoints")
        self.assertNotEqual(os.listdir(checkpoints), [])

    def test_a_misspelled_flag_fails_the_smoke_run(self):
        broken = copy.deepcopy(self.cpu)
        worker = next(o for o in broken if o["kind"] == "StatefulSet"
                      and o["metadata"]["name"] == "zeroshard-worker")
        args = manifests.pod_spec(worker)["containers"][0]["args"]
        index = args.index("--health_port=8081")
        args[index] = "--helth_port=8081"
        cluster = self.cluster(broken, "misspelled")
        with self.assertRaises(smoke.SmokeError) as failure:
            cluster.start()
            cluster.wait_ready(READY_TIMEOUT_S)
        message = str(failure.exception)
        self.assertIn("zeroshard-worker-", message)
        self.assertIn("exited with", message)
        self.assertIn("Unknown command line flag 'helth_port'", message)


if __name__ == "__main__":
    unittest.main()
