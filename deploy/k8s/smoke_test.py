"""The rendered cpu overlay, smoke-run as local processes (smoke.py says what is mapped and how):
a coordinator and two workers pass their readiness probes and the jobs example's CLI runs a
`seed` job to SUCCEEDED. A copy with one flag misspelled fails, on that flag."""

import copy
import os
import tempfile
import unittest

import manifests
import smoke
from cluster_support import load_cluster_module, runfiles_workspace

HERE = os.path.dirname(os.path.abspath(__file__))
READY_TIMEOUT_S = 90
JOB_TIMEOUT_S = 180


def make_secrets(directory):
    """The Secrets docs/deploy.md has an operator create, made by deploy/local/cluster.py's
    Credentials: zeroshard-tls (a CA and the coordinator's certificate, here for 127.0.0.1 as well
    as its Service name) and zeroshard-tokens (the coordinator's token file and the worker and
    submitter tokens)."""
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
    }


class SmokeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        root = manifests.copy_tree(HERE, os.path.join(cls.tmp, "k8s"))
        cls.cpu = manifests.render(os.path.join(root, "overlays", "cpu"))
        cls.jobs = manifests.render(os.path.join(root, "jobs"))
        cls.secrets = make_secrets(os.path.join(cls.tmp, "secrets"))

    def cluster(self, objects, name):
        cluster = smoke.LocalCluster(objects, os.path.join(self.tmp, name), runfiles_workspace(),
                                     self.secrets)
        self.addCleanup(cluster.stop)  # stops every process, whatever failed
        return cluster

    def test_rendered_cpu_overlay_runs_a_seed_job(self):
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
        for worker in ("zeroshard-worker-0", "zeroshard-worker-1"):
            self.assertIn("registered as", logs[worker])
            # --host=$(NODE_NAME): each on its own "node".
            self.assertIn(f"name={worker} host=node-{worker}", logs["zeroshard-coordinator-0"])
        [(code, output)] = cluster.run_to_completion(self.jobs, JOB_TIMEOUT_S)
        print(f"the Job's output:\n{output}")
        self.assertEqual(code, 0, output)
        self.assertIn("SUCCEEDED", output)
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
