#!/usr/bin/env python3
"""Install checks of the zeroshard Python package (issue 27): pip installs it, as users do, into
three venvs kept under a cache directory (made once, reused; the package is reinstalled each run),
and each imports it and its generated stubs, runs `zeroshard-launch --help`, and trains through
the installed entry point on a real local cluster of the repository's built binaries:

- debian: /usr/bin/python3 -m venv --system-site-packages (Debian's grpcio 1.51, protobuf 4.21
  and torch 1.13): `pip install --no-index --no-build-isolation ./python`, i.e. from the
  checkout, offline, with Debian's setuptools; the [torch] extra is satisfied by Debian's torch.
  Job: binaries from $ZEROSHARD_BIN_DIR, an attached torch model and a built-in seed job, W = 2.
- pypi: a venv without system packages: the sdist (tools/build_python_package.sh), built by pip
  in isolation (setuptools from PyPI) with grpcio and protobuf from PyPI. Job: the binaries
  copied to PREFIX/bin by tools/install_binaries.sh and found on PATH, a seed job (no torch).
- torch: the torch 2.x venv of tools/make_torch_venv.sh (default /opt/zs-torch), when it exists
  (skipped, saying so, when it does not: it is about 5 GB and made by hand). That venv is not
  modified: the wheel goes into a venv of the cache that sees the torch venv's packages through
  a .pth file. Job: binaries from --bin_dir, an attached torch 2.x model.

Prints one line per check with its duration and ends with "python_package_test: N passed, M
failed" (exit status 1 when a check failed).

Usage: /usr/bin/python3 tools/python_package_test.py --bin_dir DIR [--cache DIR]
                                                     [--torch_venv DIR]
  DIR: the binaries (bazel-bin or .bazel/bin after `bazel build //...`).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "python", "tests", "launch_env_script.py")
STUB_MODULES = [f"zeroshard._proto.zeroshard.v1.{proto}_{kind}"
                for proto in ("attach", "checkpoint", "coordinator", "job", "shard_plan", "types",
                              "worker")
                for kind in ("pb2", "pb2_grpc")]
# What the launcher and the CLI read: none may leak in from the caller's environment.
CLEARED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "OMP_NUM_THREADS",
               "ZEROSHARD_COORDINATOR", "ZEROSHARD_BIN_DIR", "ZEROSHARD_RANK", "ZEROSHARD_CA",
               "ZEROSHARD_CERT", "ZEROSHARD_KEY", "ZEROSHARD_TOKEN", "PIP_REQUIRE_VIRTUALENV")

# Run inside a venv: what `import zeroshard` brought, as JSON.
IMPORT_PROBE = """
import importlib, json, sys
import google.protobuf, grpc, zeroshard
report = {"zeroshard": zeroshard.__file__, "grpc": [grpc.__version__, grpc.__file__],
          "protobuf": [google.protobuf.__version__, google.protobuf.__file__]}
for name in sys.argv[1:]:
    importlib.import_module(name)
from zeroshard._proto.zeroshard.v1 import job_pb2
spec = job_pb2.JobSpec(name="probe", steps=3)
assert job_pb2.JobSpec.FromString(spec.SerializeToString()) == spec
try:
    import torch
except ImportError:
    pass
else:
    import zeroshard.torch
    report["torch"] = [torch.__version__, torch.__file__]
print(json.dumps(report))
"""


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, function, *args):
        """Runs one check: it passes unless it raises. Returns what it returned, or None."""
        print(f"=== {name}", flush=True)
        start = time.monotonic()
        try:
            result = function(*args)
        except Exception as e:  # a failed check, reported; the others still run
            self.failed += 1
            print(f"FAIL {name} ({time.monotonic() - start:.1f} s): {e}", flush=True)
            return None
        self.passed += 1
        print(f"ok   {name} ({time.monotonic() - start:.1f} s)", flush=True)
        return result


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def run(command, env, cwd, timeout=600, check=True):
    """Runs `command`; its CompletedProcess (output as text). A non-zero exit fails the check
    (when `check`), with the end of its output."""
    print("  $ " + " ".join(command), flush=True)
    result = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise CheckFailed(f"exit status {result.returncode}:\n{result.stdout[-3000:]}\n"
                          f"{result.stderr[-3000:]}")
    return result


class Venv:
    """A venv of the cache: made once (by /usr/bin/python3), then reused."""

    def __init__(self, path, system_site_packages, extra_site=None):
        self.path = path
        self.python = os.path.join(path, "bin", "python")
        if not os.path.isfile(os.path.join(path, "bin", "pip")):
            shutil.rmtree(path, ignore_errors=True)  # a half-made one
            command = ["/usr/bin/python3", "-m", "venv", path]
            if system_site_packages:
                command.insert(3, "--system-site-packages")
            subprocess.run(command, check=True)
        self.site_packages = subprocess.run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
        if extra_site is not None:
            # Seen after the venv's own packages and before the system's.
            with open(os.path.join(self.site_packages, "zs_extra_site.pth"), "w") as f:
                f.write(extra_site + "\n")

    def env(self, path_prefix=()):
        env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
        env["PATH"] = os.pathsep.join([*path_prefix, os.path.join(self.path, "bin"),
                                       env.get("PATH", "")])
        return env

    def pip(self, args, work, **kwargs):
        return run([self.python, "-m", "pip", "--disable-pip-version-check", *args],
                   self.env(), work, **kwargs)

    def install(self, spec, work, pip_args=()):
        self.pip(["uninstall", "-y", "-q", "zeroshard"], work, check=False)
        self.pip(["install", "-q", *pip_args, spec], work)

    def probe(self, work):
        """The import probe's report; checks that zeroshard came from this venv."""
        result = run([self.python, "-c", IMPORT_PROBE, *STUB_MODULES], self.env(), work)
        report = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"  {report}", flush=True)
        expect(report["zeroshard"].startswith(self.site_packages),
               f"zeroshard imported from {report['zeroshard']}, not {self.site_packages}")
        return report

    def help_matches_module(self, work):
        """`zeroshard-launch --help` works and offers what `python -m zeroshard.launch` does."""
        entry = run(["zeroshard-launch", "--help"], self.env(), work)
        expect(entry.stdout.startswith("usage: zeroshard-launch"), entry.stdout[:200])
        module = run([self.python, "-m", "zeroshard.launch", "--help"], self.env(), work)

        def options(text):
            return sorted({word.strip("[],") for word in text.split() if word.startswith("--")})

        expect(options(entry.stdout) == options(module.stdout),
               f"zeroshard-launch offers {options(entry.stdout)}, python -m zeroshard.launch "
               f"{options(module.stdout)}")

    def launch(self, launcher_args, script_args, work, env_extra=None, path_prefix=()):
        """`zeroshard-launch --workers 2 ... launch_env_script.py ...` on a fresh local cluster:
        (the ranks' reports by rank, the launcher's stderr)."""
        env = self.env(path_prefix)
        env.update(env_extra or {})
        log_dir = tempfile.mkdtemp(prefix="zs-pkg-", dir="/tmp")  # short attach socket paths
        try:
            result = run(["zeroshard-launch", "--workers", "2", "--log_dir", log_dir,
                          *launcher_args, SCRIPT, *script_args], env, work)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
        reports = {}
        for line in result.stdout.splitlines():
            if line.startswith("launch_env "):
                report = json.loads(line.split(" ", 1)[1])
                reports[report["rank"]] = report
                print(f"  {line}", flush=True)
        expect(sorted(reports) == [0, 1], f"reports of ranks {sorted(reports)}:\n"
               f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        # The installed package's copy of deploy/local/cluster.py started the cluster.
        expect(f"local cluster by {self.site_packages}/zeroshard/_local_cluster.py"
               in result.stderr, result.stderr[-2000:])
        for report in reports.values():
            expect(report["executable"].startswith(self.path), report)
            expect(report["omp_num_threads"] == "1", report)
            expect(report["worker_omp_num_threads"] == ["1", "1"], report)
        return reports, result.stderr


def check_sdist(sdist):
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in ["PKG-INFO", "pyproject.toml", "setup.py", "zeroshard/_local_cluster.py",
                   "zeroshard/_proto/zeroshard/v1/coordinator_pb2_grpc.py"]:
        expect(needed in names, f"{sdist} has no {needed}")
    for absent in ["generate_stubs.sh", "proto", "tests"]:
        expect(not any(name == absent or name.startswith(absent + "/") for name in names),
               f"{sdist} carries {absent}")


def debian_checks(checks, args, work):
    venv = Venv(os.path.join(args.cache, "debian"), system_site_packages=True)
    python_dir = os.path.join(REPO_ROOT, "python")
    checks.run("debian: pip install --no-index --no-build-isolation ./python", venv.install,
               python_dir, work, ["--no-index", "--no-build-isolation"])

    def imports():
        report = venv.probe(work)
        for package in ("grpc", "protobuf", "torch"):
            expect(report[package][1].startswith("/usr/lib/python3/dist-packages/"),
                   f"{package} from {report[package][1]}, not Debian's")

    checks.run("debian: import zeroshard, its stubs and zeroshard.torch (Debian's packages)",
               imports)
    checks.run("debian: zeroshard-launch --help", venv.help_matches_module, work)

    def torch_extra():
        result = venv.pip(["install", "--dry-run", "--no-index", "--no-build-isolation",
                           f"{python_dir}[torch]"], work)
        would = [line for line in result.stdout.splitlines() if line.startswith("Would install")]
        expect(would and "torch" not in would[0].replace("zeroshard", ""), result.stdout)

    checks.run("debian: the [torch] extra is satisfied by Debian's torch 1.13", torch_extra)

    def job():
        reports, stderr = venv.launch([], ["--train", "--seed_job"], work,
                                      {"ZEROSHARD_BIN_DIR": args.bin_dir})
        expect(f"binaries from $ZEROSHARD_BIN_DIR: {args.bin_dir}" in stderr, stderr[-2000:])
        expect(reports[0]["state"] == "SUCCEEDED" and reports[0]["step"] == 5, reports[0])
        expect(reports[0]["torch"].startswith("1.13"), reports[0])

    checks.run("debian: zeroshard-launch with $ZEROSHARD_BIN_DIR: attached torch + seed job, W=2",
               job)


def pypi_checks(checks, args, work, sdist):
    venv = Venv(os.path.join(args.cache, "pypi"), system_site_packages=False)
    checks.run("pypi: pip install the sdist (build isolation; grpcio, protobuf from PyPI)",
               venv.install, sdist, work)

    def imports():
        report = venv.probe(work)
        for package in ("grpc", "protobuf"):
            expect(report[package][1].startswith(venv.site_packages),
                   f"{package} from {report[package][1]}, not from PyPI in the venv")
        expect("torch" not in report, "torch is importable in a venv without system packages")

    checks.run("pypi: import zeroshard and its stubs (PyPI's grpcio and protobuf)", imports)
    checks.run("pypi: zeroshard-launch --help", venv.help_matches_module, work)

    def job():
        prefix = os.path.join(work, "prefix")
        run([os.path.join(REPO_ROOT, "tools", "install_binaries.sh"), "--bin_dir", args.bin_dir,
             prefix], dict(os.environ), REPO_ROOT)
        bin_dir = os.path.join(prefix, "bin")
        reports, stderr = venv.launch([], ["--seed_job"], work, path_prefix=[bin_dir])
        expect(f"binaries from PATH: {bin_dir}" in stderr, stderr[-2000:])
        expect(reports[0]["state"] == "SUCCEEDED" and reports[0]["step"] == 5, reports[0])

    checks.run("pypi: tools/install_binaries.sh to PREFIX/bin, zeroshard-launch finds them on "
               "PATH: seed job, W=2", job)


def torch_checks(checks, args, work, wheel):
    torch_python = os.path.join(args.torch_venv, "bin", "python")
    if not os.path.isfile(torch_python):
        print(f"SKIP torch: no torch 2.x venv at {args.torch_venv} (tools/make_torch_venv.sh "
              "makes it, about 5 GB, by hand); its three checks did not run", flush=True)
        return
    torch_site = subprocess.run(
        [torch_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    venv = Venv(os.path.join(args.cache, "torch"), system_site_packages=True,
                extra_site=torch_site)
    checks.run(f"torch: pip install the wheel[torch] (torch from {args.torch_venv})",
               venv.install, f"{wheel}[torch]", work)

    def imports():
        report = venv.probe(work)
        version, location = report["torch"]
        expect(location.startswith(torch_site), f"torch from {location}, not {torch_site}")
        expect(int(version.split(".")[0]) >= 2, f"torch {version} in {args.torch_venv}")

    checks.run("torch: import zeroshard, its stubs and zeroshard.torch (torch 2.x)", imports)
    checks.run("torch: zeroshard-launch --help", venv.help_matches_module, work)

    def job():
        reports, stderr = venv.launch(["--bin_dir", args.bin_dir], ["--train"], work)
        expect(f"binaries from --bin_dir: {args.bin_dir}" in stderr, stderr[-2000:])
        expect(int(reports[0]["torch"].split(".")[0]) >= 2, reports[0])

    checks.run("torch: zeroshard-launch --bin_dir: attached torch 2.x model, W=2", job)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin_dir", required=True, help="the built binaries (e.g. .bazel/bin)")
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/zeroshard-python-venvs"),
                        help="where the venvs are kept between runs")
    parser.add_argument("--torch_venv", default="/opt/zs-torch",
                        help="tools/make_torch_venv.sh's venv (skipped when missing)")
    args = parser.parse_args(argv)
    args.bin_dir = os.path.realpath(args.bin_dir)
    os.makedirs(args.cache, exist_ok=True)
    checks = Checks()
    work = tempfile.mkdtemp(prefix="zs-python-package-")
    try:
        dist = os.path.join(work, "dist")
        built = checks.run("tools/build_python_package.sh: sdist, and the wheel built from it",
                           run, [os.path.join(REPO_ROOT, "tools", "build_python_package.sh"),
                                 dist], dict(os.environ), REPO_ROOT)
        sdists = glob.glob(os.path.join(dist, "zeroshard-*.tar.gz"))
        wheels = glob.glob(os.path.join(dist, "zeroshard-*.whl"))
        if built is not None and len(sdists) == 1 and len(wheels) == 1:
            checks.run("the sdist carries the stubs and the cluster starter, not proto/",
                       check_sdist, sdists[0])
        debian_checks(checks, args, work)
        if built is not None:
            pypi_checks(checks, args, work, sdists[0])
            torch_checks(checks, args, work, wheels[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"python_package_test: {checks.passed} passed, {checks.failed} failed", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
