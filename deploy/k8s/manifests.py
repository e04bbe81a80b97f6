"""Rendering and policy of the Kubernetes manifests (deploy/k8s), for the manifest tests.

render() runs `kubectl kustomize`; policy_violations() says what a rendered set breaks of the
rules in docs/deploy.md ("What the tests check"): non-root, resources, probes, pinned images.
"""

import shutil
import subprocess

import yaml

KUBECTL = "/usr/bin/kubectl"

# Kinds whose spec holds a pod template, and where.
_POD_TEMPLATE_KINDS = {"StatefulSet", "Deployment", "DaemonSet", "ReplicaSet", "Job"}


class RenderError(Exception):
    pass


def render(kustomization_dir):
    """The objects `kubectl kustomize DIR` renders, as dicts."""
    result = subprocess.run([KUBECTL, "kustomize", kustomization_dir], capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise RenderError(f"kubectl kustomize {kustomization_dir}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def pod_spec(obj):
    """The pod spec of a workload object, or None for other kinds."""
    if obj.get("kind") == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if obj.get("kind") in _POD_TEMPLATE_KINDS:
        return obj["spec"]["template"]["spec"]
    if obj.get("kind") == "Pod":
        return obj["spec"]
    return None


def containers(obj):
    """(kind of container, container) of a workload: init containers, then the others."""
    spec = pod_spec(obj) or {}
    return [("initContainer", c) for c in spec.get("initContainers", [])] + [
        ("container", c) for c in spec.get("containers", [])
    ]


def _name(obj):
    return f"{obj['kind']}/{obj['metadata']['name']}"


def _runs_as_non_root(pod_security, container_security):
    """runAsNonRoot and a non-zero runAsUser, each from the container or else the pod."""
    def setting(key):
        if key in container_security:
            return container_security[key]
        return pod_security.get(key)

    user = setting("runAsUser")
    return setting("runAsNonRoot") is True and isinstance(user, int) and user != 0


def policy_violations(objects, version):
    """Every rule a rendered set of objects breaks, one line each (empty: it complies).

    Every container (init containers too) runs as non-root (runAsNonRoot and a non-zero
    runAsUser, at pod or container level), has requests and limits for cpu and memory, and a
    liveness and a readiness probe; every image is pinned by a tag, not `latest`, that equals
    `version` (deploy/VERSION). Exception: a Job's containers run to completion, where probes
    mean nothing (kubelet would only restart or unlist a pod that ends anyway), so they need
    no probes; everything else holds for them too.
    """
    violations = []
    for obj in objects:
        spec = pod_spec(obj)
        if spec is None:
            continue
        pod_security = spec.get("securityContext", {})
        run_to_completion = obj["kind"] in ("Job", "CronJob")
        for kind, container in containers(obj):
            where = f"{_name(obj)} {kind} {container.get('name')}"
            if not _runs_as_non_root(pod_security, container.get("securityContext", {})):
                violations.append(f"{where}: may run as root (needs runAsNonRoot: true and a "
                                  "non-zero runAsUser)")
            resources = container.get("resources", {})
            for section in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in resources.get(section, {}):
                        violations.append(f"{where}: no {section}.{resource}")
            if not run_to_completion:
                for probe in ("livenessProbe", "readinessProbe"):
                    if probe not in container:
                        violations.append(f"{where}: no {probe}")
            image = container.get("image", "")
            # The tag is after the last ':' of the last path component (a registry may have a port).
            last = image.rsplit("/", 1)[-1]
            tag = last.split(":", 1)[1] if ":" in last else ""
            if "@" in image:
                violations.append(f"{where}: image {image} is pinned by digest, not by the "
                                  f"version tag {version}")
            elif not tag:
                violations.append(f"{where}: image {image} has no tag")
            elif tag == "latest":
                violations.append(f"{where}: image {image} uses the tag latest")
            elif tag != version:
                violations.append(f"{where}: image {image} is not tagged {version} "
                                  "(deploy/VERSION)")
    return violations


def copy_tree(source, destination):
    """Copies `source` with symlinks resolved: kustomize refuses files whose real path lies outside
    the kustomization's root, as Bazel's runfiles symlinks do."""
    shutil.copytree(source, destination, symlinks=False)
    return destination
