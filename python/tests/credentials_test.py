"""zeroshard.Client's credentials (token, token_file, ca, cert/key and their environment defaults)
against a stand-in coordinator in this process that echoes what it received: the bearer token
over plaintext and TLS, TLS with the right and a wrong CA, mTLS, bad options by name, and the
refusal of a plaintext token to a non-loopback address. The real coordinator's enforcement is
covered by the integration tests."""

import os
import socket
import shutil
import subprocess
import tempfile
import unittest
from concurrent import futures
from unittest import mock

import grpc

import zeroshard
from zeroshard import _channel
from zeroshard import launch
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2

TOKEN = "0123456789abcdef0123456789abcdef"


class EchoCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    """GetJob answers a Job whose submitter is the authorization metadata it got, and whose
    message is the client certificate's CN (mTLS) or empty."""

    def GetJob(self, request, context):
        metadata = dict(context.invocation_metadata())
        common_names = context.auth_context().get("x509_common_name", [])
        return job_pb2.Job(id=request.job_id, submitter=metadata.get("authorization", ""),
                           message=b",".join(common_names).decode())


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=directory)
    return os.path.join(directory, f"{name}.pem")


def issue(directory, ca_name, name):
    """A certificate for CN `name`, valid for 127.0.0.1 and localhost, signed by `ca_name`."""
    openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
            f"{name}.key", "-out", f"{name}.csr", cwd=directory)
    with open(os.path.join(directory, f"{name}.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca_name}.pem", "-CAkey",
            f"{ca_name}.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out",
            f"{name}.pem", cwd=directory)
    return os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key")


def non_loopback_local_address():
    """An IPv4 address of this machine that is not loopback (the source address of a route out;
    a UDP connect sends nothing), or None."""
    for probe in ("192.0.2.1", "10.255.255.255"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                address = s.getsockname()[0]
        except OSError:
            continue
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    return None


def read(path):
    with open(path, "rb") as f:
        return f.read()


class CredentialsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="zs-credentials-")
        cls.ca = make_ca(cls.dir, "test-ca")
        cls.other_ca = make_ca(cls.dir, "other-ca")
        cls.server_cert, cls.server_key = issue(cls.dir, "test-ca", "coordinator")
        cls.client_cert, cls.client_key = issue(cls.dir, "test-ca", "worker-7")
        cls.servers = []
        cls.plain = cls.start_server(None)
        cls.tls = cls.start_server(grpc.ssl_server_credentials(
            [(read(cls.server_key), read(cls.server_cert))]))
        cls.mtls = cls.start_server(grpc.ssl_server_credentials(
            [(read(cls.server_key), read(cls.server_cert))], root_certificates=read(cls.ca),
            require_client_auth=True))

    @classmethod
    def start_server(cls, credentials, host="127.0.0.1"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(EchoCoordinator(), server)
        if credentials is None:
            port = server.add_insecure_port(f"{host}:0")
        else:
            port = server.add_secure_port(f"{host}:0", credentials)
        server.start()
        cls.servers.append(server)
        return f"127.0.0.1:{port}"

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.stop(None)
        shutil.rmtree(cls.dir)

    def setUp(self):
        # The defaults come from the environment: each test sets what it means.
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        for name in (_channel.TOKEN_ENV, _channel.CA_ENV, _channel.CERT_ENV, _channel.KEY_ENV,
                     _channel.INSECURE_ENV):
            os.environ.pop(name, None)

    def get(self, address, **credentials):
        with zeroshard.Client(address, **credentials) as client:
            return client.get("job-000001", timeout=10)

    def test_plaintext_without_token_sends_none(self):
        self.assertEqual(self.get(self.plain).submitter, "")

    def test_token_reaches_a_plaintext_server(self):
        self.assertEqual(self.get(self.plain, token=TOKEN).submitter, f"Bearer {TOKEN}")

    def test_token_defaults_to_the_environment(self):
        os.environ[_channel.TOKEN_ENV] = TOKEN[::-1]
        self.assertEqual(self.get(self.plain).submitter, f"Bearer {TOKEN[::-1]}")
        # An explicit token wins over the environment.
        self.assertEqual(self.get(self.plain, token=TOKEN).submitter, f"Bearer {TOKEN}")

    def test_token_file_first_line(self):
        path = os.path.join(self.dir, "token")
        with open(path, "w") as f:
            f.write(f"  {TOKEN}  \nignored second line\n")
        self.assertEqual(self.get(self.plain, token_file=path).submitter, f"Bearer {TOKEN}")

    def test_tls_with_the_right_ca_and_a_token(self):
        job = self.get(self.tls, ca=self.ca, token=TOKEN)
        self.assertEqual(job.id, "job-000001")
        self.assertEqual(job.submitter, f"Bearer {TOKEN}")

    def test_tls_ca_from_the_environment(self):
        os.environ[_channel.CA_ENV] = self.ca
        self.assertEqual(self.get(self.tls).id, "job-000001")

    def test_wrong_ca_is_refused(self):
        with self.assertRaises(zeroshard.Error) as raised:
            self.get(self.tls, ca=self.other_ca, token=TOKEN)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_plaintext_client_cannot_talk_to_tls(self):
        with self.assertRaises(zeroshard.Error) as raised:
            self.get(self.tls, token=TOKEN)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_mtls_presents_the_client_certificate(self):
        job = self.get(self.mtls, ca=self.ca, cert=self.client_cert, key=self.client_key)
        self.assertEqual(job.message, "worker-7")

    def test_mtls_without_a_certificate_is_refused(self):
        with self.assertRaises(zeroshard.Error) as raised:
            self.get(self.mtls, ca=self.ca)
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE)

    def test_bad_options_name_the_option(self):
        cases = [
            ({"token": "short"}, "token"),
            ({"token": "a token with spaces in it"}, "token"),
            ({"ca": os.path.join(self.dir, "missing.pem")}, "ca"),
            ({"ca": self.ca, "cert": self.client_cert}, "cert"),
            ({"cert": self.client_cert, "key": self.client_key}, "cert"),
            ({"token_file": os.path.join(self.dir, "missing-token")}, "token_file"),
            ({"token": TOKEN, "token_file": os.path.join(self.dir, "x")}, "token_file"),
        ]
        for options, field in cases:
            with self.subTest(options=options):
                with self.assertRaises(zeroshard.Error) as raised:
                    zeroshard.Client(self.plain, **options)
                self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(raised.exception.field, field)

    def test_interceptor_covers_streams(self):
        # WatchJob is unary-stream: the stand-in does not implement it, so the call fails, but
        # with UNIMPLEMENTED from the server, i.e. after the token went through the interceptor.
        with zeroshard.Client(self.plain, token=TOKEN) as client:
            with self.assertRaises(zeroshard.Error) as raised:
                list(client.watch("job-000001", timeout=10))
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNIMPLEMENTED)

    # Fails on the code before issue 25 item 5: the _BearerToken interceptor sent the token in
    # plaintext to any address, so the first Client below was made without complaint, and one
    # without insecure=True to this machine's non-loopback address got the token to the server.
    def test_token_goes_in_plaintext_only_to_loopback_or_with_insecure(self):
        # Refused before any connection: nothing needs to listen there (TEST-NET-1).
        for target in ("192.0.2.1:50051", "coordinator.example:50051", "[fd00::2]:1"):
            with self.subTest(target=target):
                with self.assertRaises(zeroshard.Error) as raised:
                    zeroshard.Client(target, token=TOKEN)
                self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertEqual(raised.exception.field, "token")
                self.assertIn(f"in plaintext to {target}", str(raised.exception))
                self.assertIn("insecure=True", str(raised.exception))
                self.assertIn("ZEROSHARD_INSECURE=1", str(raised.exception))
        # The token from the environment too (zeroshard.torch's trainers build channels so).
        os.environ[_channel.TOKEN_ENV] = TOKEN
        with self.assertRaises(ValueError):
            _channel.coordinator_channel("192.0.2.1:50051")
        del os.environ[_channel.TOKEN_ENV]
        self.assertTrue(_channel.is_loopback_target("localhost:1"))
        self.assertTrue(_channel.is_loopback_target("[::1]:1"))
        self.assertTrue(_channel.is_loopback_target("unix:/tmp/zs.sock"))
        self.assertFalse(_channel.is_loopback_target("ipv4:127.0.0.1:1,10.0.0.1:1"))

        # A real server on every address: over loopback the token is sent as before.
        everywhere = self.start_server(None, host="0.0.0.0")
        port = everywhere.rsplit(":", 1)[1]
        for loopback in ("127.0.0.1", "localhost"):
            self.assertEqual(self.get(f"{loopback}:{port}", token=TOKEN).submitter,
                             f"Bearer {TOKEN}")
        address = non_loopback_local_address()
        if address is None:
            self.skipTest("this machine has no non-loopback IPv4 address: insecure over the "
                          "network not exercised (the refusal above was)")
        target = f"{address}:{port}"
        with self.assertRaises(zeroshard.Error):
            zeroshard.Client(target, token=TOKEN)
        # No token: nothing secret to refuse.
        self.assertEqual(self.get(target).submitter, "")
        self.assertEqual(self.get(target, token=TOKEN, insecure=True).submitter,
                         f"Bearer {TOKEN}")
        os.environ[_channel.INSECURE_ENV] = "1"
        self.assertEqual(self.get(target, token=TOKEN).submitter, f"Bearer {TOKEN}")
        # An explicit insecure=False wins over the environment.
        with self.assertRaises(zeroshard.Error):
            zeroshard.Client(target, token=TOKEN, insecure=False)

    def test_launch_hands_its_credentials_to_the_trainers(self):
        path = os.path.join(self.dir, "launch-token")
        with open(path, "w") as f:
            f.write(TOKEN + "\n")
        args = launch.parse_args(["--workers", "1", "--token_file", path, "--ca", self.ca,
                                  "--cert", self.client_cert, "--key", self.client_key,
                                  "train.py", "--lr", "1"])
        env = {}
        launch.export_credentials(args, env)
        self.assertEqual(env, {_channel.TOKEN_ENV: TOKEN, _channel.CA_ENV: self.ca,
                               _channel.CERT_ENV: self.client_cert,
                               _channel.KEY_ENV: self.client_key})
        self.assertEqual(args.script_args, ["--lr", "1"])
        # What the trainers then build from that environment reaches a TLS coordinator.
        os.environ.update(env)
        self.assertEqual(self.get(self.mtls).message, "worker-7")

    def test_launch_refuses_unusable_credentials(self):
        with self.assertRaises(SystemExit):
            launch.parse_args(["--workers", "1", "--cert", self.client_cert, "train.py"])
        args = launch.parse_args(["--workers", "1", "--token_file",
                                  os.path.join(self.dir, "no-such-token"), "train.py"])
        with self.assertRaises(SystemExit) as raised:
            launch.export_credentials(args, {})
        self.assertIn("token_file", str(raised.exception.code))



class LoopbackRuleTest(unittest.TestCase):
    """is_loopback_target: what a token may go to in plaintext (the C++ clients' rule too,
    security/loopback_test.cc)."""

    def test_literals_localhost_and_unix_sockets_are_loopback(self):
        for target in ("127.0.0.1:50051", "127.1.2.3:1", "localhost:50051", "LocalHost:1",
                       "localhost", "[::1]:50051", "::1", "[::ffff:127.0.0.1]:1",
                       "dns:localhost:1", "dns:/localhost:1", "dns:///localhost:1",
                       "dns:///127.0.0.1:1", "ipv4:127.0.0.1:1,127.0.0.2:2", "ipv6:[::1]:1",
                       "unix:/tmp/zs.sock", "unix-abstract:zeroshard",
                       "dns://8.8.8.8/127.0.0.1:1", "dns://8.8.8.8/[::1]:1"):
            with self.subTest(target=target):
                self.assertTrue(_channel.is_loopback_target(target))

    # Issue 36, row 9. Fails before the fix: "localhost." (trailing dot) and localhost under a
    # dns:// authority counted as loopback, but gRPC asks a DNS server for both, so the token
    # went in plaintext to whatever address that server answered; and ipv4: took "localhost".
    def test_names_a_dns_server_resolves_are_not_loopback(self):
        for target in ("localhost.:1", "LOCALHOST.:1", "dns:///localhost.:1",
                       "dns://8.8.8.8/localhost:1", "dns://8.8.8.8/localhost.:1",
                       "dns://127.0.0.1/localhost:1", "ipv4:localhost:1", "127.0.0.1.:1",
                       "127.1:1", "[::1%lo]:1", "localhost:1?x", "localhost:https", "[::1",
                       "dns://8.8.8.8", "", "coordinator.example:1", "192.0.2.1:1",
                       "ipv4:127.0.0.1:1,10.0.0.1:1"):
            with self.subTest(target=target):
                self.assertFalse(_channel.is_loopback_target(target))
        with self.assertRaises(ValueError) as raised:
            _channel.coordinator_channel("dns://192.0.2.53/localhost:50051", token=TOKEN)
        self.assertIn("in plaintext to dns://192.0.2.53/localhost:50051", str(raised.exception))
        self.assertIn("without a trailing dot or a dns://SERVER/ authority", str(raised.exception))

if __name__ == "__main__":
    unittest.main()
