"""The Kubernetes manifests: every overlay and the jobs example render with kubectl kustomize,
every rendered object passes kubernetes-validate's schema check (Kubernetes 1.32, strict), the
policy holds (manifests.policy_violations), and each policy check fails on a bad copy."""

import copy
import os
import subprocess
import tempfile
import unittest

import yaml

import manifests

KUBERNETES_VERSION = "1.32.0"
TOOLS_VENV = "/opt/zs-tools"
VALIDATE = os.path.join(TOOLS_VENV, "bin", "kubernetes-validate")
HERE = os.path.dirname(os.path.abspath(__file__))
KUSTOMIZATIONS = ["overlays/cpu", "overlays/gpu", "jobs"]


def read_version():
    with open(os.path.join(HERE, "..", "VERSION")) as f:
        return f.read().strip()


def find(objects, kind, name):
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(matches) != 1:
        raise AssertionError(f"expected one {kind}/{name}, found {len(matches)}")
    return matches[0]


def container(obj, name):
    return next(c for c in manifests.pod_spec(obj)["containers"] if c["name"] == name)


class ManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.root = manifests.copy_tree(HERE, os.path.join(cls.tmp, "k8s"))
        cls.version = read_version()
        cls.rendered = {k: manifests.render(os.path.join(cls.root, k)) for k in KUSTOMIZATIONS}

    def test_every_kustomization_renders_what_it_should(self):
        kinds = lambda k: sorted({o["kind"] for o in self.rendered[k]})
        for overlay in ("overlays/cpu", "overlays/gpu"):
            self.assertEqual(
                kinds(overlay),
                ["NetworkPolicy", "PersistentVolumeClaim", "PodDisruptionBudget", "Service",
                 "StatefulSet"], overlay)
        self.assertEqual(kinds("jobs"), ["Job"])

    def test_schema_validation_of_every_rendered_object(self):
        if not os.access(VALIDATE, os.X_OK):
            self.fail(f"{VALIDATE} is missing: run tools/bootstrap.sh (it makes the tools venv "
                      f"{TOOLS_VENV} with kubernetes-validate)")
        for kustomization, objects in self.rendered.items():
            path = os.path.join(self.tmp, kustomization.replace("/", "-") + ".yaml")
            with open(path, "w") as f:
                yaml.safe_dump_all(objects, f)
            result = subprocess.run(
                [VALIDATE, "--strict", "-k", KUBERNETES_VERSION, path], capture_output=True,
                text=True)
            self.assertEqual(result.returncode, 0, f"{kustomization}:\n{result.stdout}"
                             f"{result.stderr}")
            # One "passed" line per object: none was skipped.
            self.assertEqual(result.stdout.count(" passed for resource "), len(objects), result.stdout)

    def test_schema_validation_rejects_a_bad_object(self):
        if not os.access(VALIDATE, os.X_OK):
            self.fail(f"{VALIDATE} is missing: run tools/bootstrap.sh")
        bad = copy.deepcopy(find(self.rendered["overlays/cpu"], "StatefulSet",
                                 "zeroshard-worker"))
        bad["spec"]["replicas"] = "two"
        path = os.path.join(self.tmp, "bad.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(bad, f)
        result = subprocess.run([VALIDATE, "--strict", "-k", KUBERNETES_VERSION, path],
                                capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0, result.stdout)
        self.assertIn("replicas", result.stdout + result.stderr)

    def test_policy_holds_for_every_kustomization(self):
        for kustomization, objects in self.rendered.items():
            self.assertEqual(manifests.policy_violations(objects, self.version), [], kustomization)

    def test_decided_details(self):
        cpu = self.rendered["overlays/cpu"]
        coordinator = find(cpu, "StatefulSet", "zeroshard-coordinator")
        self.assertEqual(coordinator["spec"]["replicas"], 1)
        self.assertEqual(
            [t["metadata"]["name"] for t in coordinator["spec"]["volumeClaimTemplates"]],
            ["state"])
        self.assertEqual(find(cpu, "PersistentVolumeClaim", "zeroshard-checkpoints")["spec"]
                         ["accessModes"], ["ReadWriteMany"])
        workers = find(cpu, "StatefulSet", "zeroshard-worker")
        for workload in (coordinator, workers):
            claims = [v["persistentVolumeClaim"]["claimName"]
                      for v in manifests.pod_spec(workload)["volumes"]
                      if "persistentVolumeClaim" in v]
            self.assertEqual(claims, ["zeroshard-checkpoints"])
        self.assertEqual(find(cpu, "Service", "zeroshard-workers")["spec"]["clusterIP"], "None")
        worker_labels = manifests.pod_spec(workers) and workers["spec"]["template"]["metadata"][
            "labels"]
        # The PodDisruptionBudget covers the workers, and nothing else.
        pdbs = [o for o in cpu if o["kind"] == "PodDisruptionBudget"]
        self.assertEqual(len(pdbs), 1)
        self.assertEqual(pdbs[0]["spec"]["maxUnavailable"], 1)
        for key, value in pdbs[0]["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(worker_labels.get(key), value)
            self.assertNotEqual(coordinator["spec"]["template"]["metadata"]["labels"].get(key),
                                value)
        # Workers reach each other on any TCP port (a rule with a protocol and no port).
        worker_policy = find(cpu, "NetworkPolicy", "zeroshard-worker")
        self.assertEqual(worker_policy["spec"]["ingress"][0]["ports"], [{"protocol": "TCP"}])
        # The Job's pod carries a label the coordinator's policy admits on gRPC.
        job_labels = self.rendered["jobs"][0]["spec"]["template"]["metadata"]["labels"]
        grpc_rule = find(cpu, "NetworkPolicy", "zeroshard-coordinator")["spec"]["ingress"][0]
        self.assertEqual(grpc_rule["ports"], [{"protocol": "TCP", "port": 50051}])
        admitted = [p["podSelector"]["matchLabels"] for p in grpc_rule["from"]]
        self.assertTrue(any(all(job_labels.get(k) == v for k, v in m.items()) for m in admitted))
        self.assertTrue(any(all(worker_labels.get(k) == v for k, v in m.items())
                            for m in admitted))

    def test_gpu_overlay_gives_each_worker_one_gpu_and_the_cuda_image(self):
        gpu = self.rendered["overlays/gpu"]
        worker = container(find(gpu, "StatefulSet", "zeroshard-worker"), "worker")
        self.assertEqual(worker["image"], f"zeroshard-cuda:{self.version}")
        self.assertEqual(worker["resources"]["limits"]["nvidia.com/gpu"], 1)
        self.assertEqual(worker["resources"]["requests"]["nvidia.com/gpu"], 1)
        env = {e["name"]: e.get("value") for e in worker["env"]}
        self.assertEqual(env["ZEROSHARD_DEVICE"], "cuda:0")
        self.assertIn("--device=$(ZEROSHARD_DEVICE)", worker["args"])
        coordinator = container(find(gpu, "StatefulSet", "zeroshard-coordinator"), "coordinator")
        self.assertEqual(coordinator["image"], f"zeroshard:{self.version}")
        cpu_worker = container(find(self.rendered["overlays/cpu"], "StatefulSet",
                                    "zeroshard-worker"), "worker")
        self.assertNotIn("nvidia.com/gpu", cpu_worker["resources"]["limits"])


class PolicyTest(unittest.TestCase):
    """Each check of policy_violations fails on a copy of the cpu overlay broken in its way."""

    @classmethod
    def setUpClass(cls):
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        root = manifests.copy_tree(HERE, os.path.join(tmp, "k8s"))
        cls.version = read_version()
        cls.cpu = manifests.render(os.path.join(root, "overlays/cpu"))
        cls.job = manifests.render(os.path.join(root, "jobs"))

    def violations_after(self, mutate, objects=None):
        broken = copy.deepcopy(objects if objects is not None else self.cpu)
        mutate(broken)
        return manifests.policy_violations(broken, self.version)

    def worker_pod(self, objects):
        return manifests.pod_spec(find(objects, "StatefulSet", "zeroshard-worker"))

    def assertOneViolation(self, violations, *fragments):
        self.assertEqual(len(violations), 1, violations)
        for fragment in fragments:
            self.assertIn(fragment, violations[0])

    def test_the_unbroken_copy_complies(self):
        self.assertEqual(self.violations_after(lambda objects: None), [])

    def test_root_at_pod_level(self):
        def mutate(objects):
            del self.worker_pod(objects)["securityContext"]["runAsNonRoot"]
        self.assertOneViolation(self.violations_after(mutate), "container worker", "root")

    def test_root_user_at_container_level_overrides_the_pod(self):
        def mutate(objects):
            self.worker_pod(objects)["containers"][0]["securityContext"]["runAsUser"] = 0
        self.assertOneViolation(self.violations_after(mutate), "container worker", "root")

    def test_no_user_at_all(self):
        def mutate(objects):
            del self.worker_pod(objects)["securityContext"]["runAsUser"]
        self.assertOneViolation(self.violations_after(mutate), "root")

    def test_init_container_as_root(self):
        def mutate(objects):
            pod = self.worker_pod(objects)
            init = copy.deepcopy(pod["containers"][0])
            init["name"] = "setup"
            init["securityContext"]["runAsNonRoot"] = False
            pod["initContainers"] = [init]
        self.assertOneViolation(self.violations_after(mutate), "initContainer setup", "root")

    def test_missing_limits_and_requests(self):
        def no_memory_limit(objects):
            del self.worker_pod(objects)["containers"][0]["resources"]["limits"]["memory"]
        self.assertOneViolation(self.violations_after(no_memory_limit), "no limits.memory")

        def no_requests(objects):
            del self.worker_pod(objects)["containers"][0]["resources"]["requests"]
        violations = self.violations_after(no_requests)
        self.assertEqual(sorted(violations), sorted(
            [f"StatefulSet/zeroshard-worker container worker: no requests.{r}"
             for r in ("cpu", "memory")]))

        def no_job_resources(objects):
            del manifests.pod_spec(objects[0])["containers"][0]["resources"]
        self.assertEqual(len(self.violations_after(no_job_resources, self.job)), 4)

    def test_missing_probes(self):
        for probe in ("livenessProbe", "readinessProbe"):
            def mutate(objects, probe=probe):
                del self.worker_pod(objects)["containers"][0][probe]
            self.assertOneViolation(self.violations_after(mutate), f"no {probe}")

    def test_a_job_needs_no_probes(self):
        self.assertNotIn("readinessProbe", manifests.pod_spec(self.job[0])["containers"][0])
        self.assertEqual(manifests.policy_violations(self.job, self.version), [])

    def test_images_pinned_to_the_version(self):
        cases = {
            "zeroshard:latest": "latest",
            "zeroshard": "no tag",
            "registry.example:5000/zeroshard": "no tag",
            "zeroshard:0.0.9": "not tagged",
            "zeroshard@sha256:" + "0" * 64: "digest",
        }
        for image, fragment in cases.items():
            def mutate(objects, image=image):
                self.worker_pod(objects)["containers"][0]["image"] = image
            self.assertOneViolation(self.violations_after(mutate), image, fragment)
        def registry_with_port(objects):
            self.worker_pod(objects)["containers"][0]["image"] = (
                f"registry.example:5000/zeroshard:{self.version}")
        self.assertEqual(self.violations_after(registry_with_port), [])


if __name__ == "__main__":
    unittest.main()
