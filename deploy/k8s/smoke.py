"""Runs rendered Kubernetes manifests as local processes (the manifest smoke test).

Each StatefulSet pod's containers run with the manifest's own command, args and environment,
with only what a cluster provides mapped to this machine, explicitly:
  - /usr/local/bin/<binary>      -> the Bazel-built binary (BINARIES, in the runfiles);
  - Service DNS names, 0.0.0.0   -> 127.0.0.1; every pod's IP (status.podIP) is 127.0.0.1;
  - each containerPort           -> a free port of its own per pod (in `host:port`, `=port` args,
                                    and for the probes and Services that name the port);
  - spec.nodeName                -> node-<pod name> (a distinct host per pod);
  - metadata.name                -> the StatefulSet pod name (<name>-<ordinal>);
  - volume mountPaths            -> directories under the run's root: PVCs shared by every pod,
                                    volumeClaimTemplates and emptyDirs per pod, Secrets filled
                                    from `secrets` ({secret name: {key: text}}) with their items.
securityContext, resources and the image are not emulated. restart_container() does what kubelet
does when a container dies (restartPolicy Always): the same container again, in the same pod.
"""

import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

# Where the image keeps each binary (the images' contract) -> its path in the runfiles.
BINARIES = {
    "/usr/local/bin/zeroshard-coordinator": "apps/coordinator/zeroshard-coordinator",
    "/usr/local/bin/zeroshard-worker": "worker/zeroshard-worker",
    "/usr/local/bin/zeroshard": "client/zeroshard",
}
LOOPBACK = "127.0.0.1"


class SmokeError(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def expand(text, env):
    """Kubernetes' $(VAR) expansion: defined variables are replaced, $$ escapes, others stay."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


class Pod:
    """One pod of a rendered workload: its name, its mapped ports and volume directories."""

    def __init__(self, name, spec, labels):
        self.name = name
        self.spec = spec
        self.labels = labels
        self.node = f"node-{name}"
        self.ports = {}  # containerPort -> local port
        self.port_names = {}  # port name -> containerPort
        for container in spec.get("containers", []):
            for port in container.get("ports", []):
                self.ports[port["containerPort"]] = free_port()
                if "name" in port:
                    self.port_names[port["name"]] = port["containerPort"]

    def local_port(self, port):
        """A probe's or Service's port (a number or a name) -> this pod's local port."""
        container_port = self.port_names[port] if isinstance(port, str) else port
        if container_port not in self.ports:
            raise SmokeError(f"pod {self.name} declares no containerPort {port}")
        return self.ports[container_port]


class Process:
    """One container's process; `restarts` says how many times its container was restarted before
    (0: the pod's first)."""

    def __init__(self, pod, container, argv, env, log_path, restarts=0):
        self.pod = pod
        self.container = container
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.restarts = restarts
        self.log = open(log_path, "w")
        self.popen = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    @property
    def label(self):
        return f"{self.pod.name}/{self.container['name']}"

    def tail(self, lines=15):
        self.log.flush()
        with open(self.log_path) as f:
            return "".join(f.readlines()[-lines:])

    def kill(self):
        """SIGKILL to its process group, as when its container is killed; waits for it."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        self.log.close()

    def stop(self, timeout=15):
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.log.close()


class LocalCluster:
    """Starts the pods of rendered manifests as processes under `root`; stop() ends them all."""

    def __init__(self, objects, root, runfiles, secrets):
        self.objects = objects
        self.root = root
        self.runfiles = runfiles
        self.secrets = secrets
        self.services = {}  # Service name -> (selector, {port: targetPort})
        self.pods = []
        self.processes = []
        for obj in objects:
            if obj["kind"] == "Service":
                ports = {p["port"]: p.get("targetPort", p["port"]) for p in obj["spec"]["ports"]}
                self.services[obj["metadata"]["name"]] = (obj["spec"].get("selector", {}), ports)

    # --- the mapping ----------------------------------------------------------------------------

    def service_port(self, service, port):
        selector, ports = self.services[service]
        target = ports.get(port)
        if target is None:
            raise SmokeError(f"Service {service} has no port {port}")
        for pod in self.pods:
            if all(pod.labels.get(k) == v for k, v in selector.items()):
                return pod.local_port(target)
        raise SmokeError(f"Service {service} selects no pod started so far")

    def localize(self, text, pod, mounts):
        """Service names, 0.0.0.0, containerPorts and mount paths in `text`, mapped."""
        def service(match):
            return f"{LOOPBACK}:{self.service_port(match.group(1), int(match.group(2)))}"

        if self.services:
            names = "|".join(re.escape(n) for n in sorted(self.services, key=len, reverse=True))
            text = re.sub(rf"\b({names})(?:\.[a-z0-9.-]*)?:(\d+)\b", service, text)
        text = re.sub(r"\b0\.0\.0\.0:(\d+)\b",
                      lambda m: f"{LOOPBACK}:{pod.ports.get(int(m.group(1)), m.group(1))}", text)
        # `--flag=PORT` of a port this pod declares.
        text = re.sub(r"^(--?[A-Za-z0-9_-]+=)(\d+)$",
                      lambda m: m.group(1) + str(pod.ports.get(int(m.group(2)), m.group(2))),
                      text)
        if mounts:
            paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
            text = re.sub(rf"(?<![\w/.-])({paths})(?=/|$|[^\w.-])",
                          lambda m: mounts[m.group(1)], text)
        return text

    def volume_dirs(self, pod, claim_templates):
        """Volume name -> local directory for `pod`."""
        dirs = {}
        for volume in pod.spec.get("volumes", []):
            name = volume["name"]
            if "persistentVolumeClaim" in volume:
                path = os.path.join(self.root, "pvc", volume["persistentVolumeClaim"]["claimName"])
            elif "emptyDir" in volume:
                path = os.path.join(self.root, "pods", pod.name, name)
            elif "secret" in volume:
                path = os.path.join(self.root, "pods", pod.name, "secret-" + name)
                self.fill_secret(volume["secret"], path)
            else:
                raise SmokeError(f"pod {pod.name}: volume {name} of a kind this test cannot map")
            os.makedirs(path, exist_ok=True)
            dirs[name] = path
        for name in claim_templates:
            dirs[name] = os.path.join(self.root, "pods", pod.name, name)
            os.makedirs(dirs[name], exist_ok=True)
        return dirs

    def fill_secret(self, secret, path):
        name = secret["secretName"]
        if name not in self.secrets:
            raise SmokeError(f"Secret {name} is not one the test made")
        data = self.secrets[name]
        items = secret.get("items") or [{"key": k, "path": k} for k in data]
        os.makedirs(path, exist_ok=True)
        for item in items:
            if item["key"] not in data:
                raise SmokeError(f"Secret {name} has no key {item['key']}")
            file_path = os.path.join(path, item["path"])
            with open(file_path, "w") as f:
                f.write(data[item["key"]])
            os.chmod(file_path, secret.get("defaultMode", 0o644))  # kubelet's default

    def env_of(self, container, pod):
        env = {}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
                continue
            field = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            values = {"metadata.name": pod.name, "spec.nodeName": pod.node,
                      "status.podIP": LOOPBACK}
            if field not in values:
                raise SmokeError(f"{pod.name}: env {var['name']} from {var.get('valueFrom')} "
                                 "cannot be mapped")
            env[var["name"]] = values[field]
        return env

    # --- running --------------------------------------------------------------------------------

    def start_container(self, pod, container, dirs):
        command = container.get("command", [])
        if not command or command[0] not in BINARIES:
            raise SmokeError(f"{pod.name}/{container['name']}: command {command} is not one of "
                             f"the image's binaries {sorted(BINARIES)}")
        mounts = {m["mountPath"]: dirs[m["name"]] for m in container.get("volumeMounts", [])}
        env = self.env_of(container, pod)
        argv = [os.path.join(self.runfiles, BINARIES[command[0]])]
        for arg in command[1:] + container.get("args", []):
            argv.append(self.localize(expand(arg, env), pod, mounts))
        process_env = dict(os.environ)
        process_env.update({k: self.localize(v, pod, mounts) for k, v in env.items()})
        log_path = os.path.join(self.root, "logs", f"{pod.name}-{container['name']}.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        process = Process(pod, container, argv, process_env, log_path)
        self.processes.append(process)
        return process

    def restart_container(self, process):
        """Kills `process` with SIGKILL and starts its container again, as kubelet restarts a
        container of a running pod: in the same pod (its ports, IP and volumes, emptyDirs included,
        are kept), with the same command, args and environment. Its log goes to a new file, as
        `kubectl logs` shows the current container (the previous one's stays in its file). The new
        Process replaces `process` in `processes` and is returned."""
        process.kill()
        restarts = process.restarts + 1
        pod, container = process.pod, process.container
        log_path = os.path.join(self.root, "logs",
                                f"{pod.name}-{container['name']}.restart-{restarts}.log")
        restarted = Process(pod, container, process.argv, process.env, log_path, restarts)
        self.processes[self.processes.index(process)] = restarted
        return restarted

    def start_pod(self, name, spec, labels, claim_templates=()):
        pod = Pod(name, spec, labels)
        self.pods.append(pod)
        dirs = self.volume_dirs(pod, claim_templates)
        if spec.get("initContainers"):
            raise SmokeError(f"{name}: init containers are not run by this test")
        return [self.start_container(pod, c, dirs) for c in spec["containers"]]

    def start(self):
        """Starts every StatefulSet's pods, in the order the manifests list them."""
        for obj in self.objects:
            if obj["kind"] != "StatefulSet":
                continue
            template = obj["spec"]["template"]
            claims = [t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])]
            for ordinal in range(obj["spec"].get("replicas", 1)):
                self.start_pod(f"{obj['metadata']['name']}-{ordinal}", template["spec"],
                               template["metadata"].get("labels", {}), claims)

    def probe(self, process, kind):
        """Whether `process`'s probe of `kind` passes now (httpGet: a 2xx or 3xx answer)."""
        get = process.container[kind]["httpGet"]
        url = f"http://{LOOPBACK}:{process.pod.local_port(get['port'])}{get.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return 200 <= response.status < 400
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout, processes=None):
        """Waits until the readiness probe of every container (or of `processes`) passes; a
        container that exits first, or the deadline, fails with the logs of those not ready."""
        deadline = time.monotonic() + timeout
        pending = list(self.processes if processes is None else processes)
        while pending:
            for process in list(pending):
                if process.popen.poll() is not None:
                    raise SmokeError(f"{process.label} exited with {process.popen.returncode} "
                                     f"before it was ready:\n{process.tail()}")
                if self.probe(process, "readinessProbe"):
                    pending.remove(process)
            if pending and time.monotonic() > deadline:
                raise SmokeError("not ready after %ss: %s" % (timeout, "\n".join(
                    f"{p.label}:\n{p.tail()}" for p in pending)))
            time.sleep(0.1)

    def start_job(self, job):
        """Starts a Job's pod (one container) against this cluster; returns its Process."""
        template = job["spec"]["template"]
        [process] = self.start_pod(f"{job['metadata']['name']}-0", template["spec"],
                                   template["metadata"].get("labels", {}))
        return process

    def stop(self):
        for process in reversed(self.processes):
            process.stop()
