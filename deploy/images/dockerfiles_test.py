"""Checks that Dockerfile and Dockerfile.cuda build what deploy/images/build.sh builds.

Both sides are compared with deploy/images/image.txt, which build.sh reads: the same packages,
copied files, user/UID/GID, home, entrypoint, environment and label keys; the version default is
deploy/VERSION's. The drift cases edit a copy of a Dockerfile and expect the check to object.
"""

import json
import os
import re
import shlex
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))


def read(path):
    with open(path) as f:
        return f.read()


class Manifest:
    """image.txt, parsed the way build.sh's `directive` reads it."""

    def __init__(self, text):
        self.lines = []
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if fields:
                self.lines.append(fields)

    def directive(self, name):
        return [fields[1:] for fields in self.lines if fields[0] == name]

    def single(self, name):
        (fields,) = self.directive(name)
        return fields

    def packages(self, flavor):
        return {
            package
            for fields in self.directive("package")
            if fields[0] in ("all", flavor)
            for package in fields[1:]
        }


def dockerfile_instructions(text):
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    instructions = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    return instructions


def key_values(arguments):
    """ENV/LABEL arguments `K=V K2="V 2"` as a dict."""
    return dict(word.split("=", 1) for word in shlex.split(arguments))


def build_script_config(script):
    """The label and environment keys build.sh gives `umoci config` (cuda-only ones apart)."""
    labels = set(re.findall(r'--config\.label="([\w.]+)=', script))
    env = set(re.findall(r'--config\.env="(\w+)=', script))
    cuda_block = script[script.index('if [[ "$flavor" == cuda ]]; then\n    # What the NVIDIA'):]
    cuda_block = cuda_block[: cuda_block.index("fi\n")]
    cuda_env = set(re.findall(r'--config\.env="(\w+)=', cuda_block))
    return labels, env - cuda_env, cuda_env


def check(dockerfile_text, flavor, manifest, script, version):
    """Every way the Dockerfile differs from what build.sh builds, as messages."""
    problems = []
    instructions = dockerfile_instructions(dockerfile_text)

    def all_of(keyword):
        return [arguments for kw, arguments in instructions if kw == keyword]

    if all_of("FROM") != ["debian:bookworm-slim"]:
        problems.append(f"FROM {all_of('FROM')}: build.sh makes a Debian bookworm rootfs")

    args = dict(a.split("=", 1) if "=" in a else (a, None) for a in all_of("ARG"))
    if args.get("VERSION") != version:
        problems.append(f"ARG VERSION={args.get('VERSION')}, deploy/VERSION is {version}")

    runs = " && ".join(all_of("RUN"))
    installed = set()
    for command in runs.split("&&"):
        words = command.split()
        if "apt-get" in words and "install" in words:
            installed |= {w for w in words[words.index("install") + 1:] if not w.startswith("-")}
    expected_packages = manifest.packages(flavor)
    if installed != expected_packages:
        problems.append(
            f"packages: missing {sorted(expected_packages - installed)}, "
            f"extra {sorted(installed - expected_packages)}"
        )

    name, uid, gid, home = manifest.single("user")
    user_commands = [c.split() for c in runs.split("&&")]
    groupadd = [c for c in user_commands if c and c[0] == "groupadd"]
    useradd = [c for c in user_commands if c and c[0] == "useradd"]
    if len(groupadd) != 1 or groupadd[0][-1] != name or f"--gid {gid}" not in " ".join(groupadd[0]):
        problems.append(f"groupadd must make group {name} with --gid {gid}: {groupadd}")
    useradd_line = " ".join(useradd[0]) if len(useradd) == 1 else ""
    for flag in (f"--uid {uid}", f"--gid {gid}", f"--home-dir {home}"):
        if flag not in useradd_line:
            problems.append(f"useradd lacks {flag}: {useradd_line!r}")
    if not useradd_line.endswith(f" {name}"):
        problems.append(f"useradd must make user {name}: {useradd_line!r}")
    install_dirs = [c for c in user_commands if c[:2] == ["install", "-d"]]
    install_line = " ".join(install_dirs[0]) if len(install_dirs) == 1 else ""
    if f"-o {uid} -g {gid}" not in install_line:
        problems.append(f"the home directories must be owned by {uid}:{gid}: {install_line!r}")
    wanted_dirs = {home} | {f"{home}/{d}" for (d,) in manifest.directive("home_dir")}
    made_dirs = {w for w in install_line.split() if w.startswith("/")}
    if made_dirs != wanted_dirs:
        problems.append(f"home directories {sorted(made_dirs)}, expected {sorted(wanted_dirs)}")

    copies = {tuple(arguments.split()) for arguments in all_of("COPY")}
    expected_copies = {
        (f"bin/{os.path.basename(path)}", path) for _label, path in manifest.directive("binary")
    }
    (python_source, python_dest), = manifest.directive("python")
    expected_copies.add((f"python/{os.path.basename(python_source)}", python_dest))
    if flavor == "cuda":
        (cuda_lib_dir,) = manifest.single("cuda_lib_dir")
        expected_copies.add(("cuda-lib/", cuda_lib_dir + "/"))
    if copies != expected_copies:
        problems.append(
            f"COPY: missing {sorted(expected_copies - copies)}, "
            f"extra {sorted(copies - expected_copies)}"
        )

    if all_of("USER") != [f"{uid}:{gid}"]:
        problems.append(f"USER {all_of('USER')}, expected {uid}:{gid}")
    if all_of("WORKDIR") != [home]:
        problems.append(f"WORKDIR {all_of('WORKDIR')}, expected {home}")
    entrypoints = [json.loads(e) for e in all_of("ENTRYPOINT")]
    if entrypoints != [manifest.single("entrypoint")]:
        problems.append(f"ENTRYPOINT {entrypoints}, expected {manifest.single('entrypoint')}")

    label_keys, env_keys, cuda_env_keys = build_script_config(script)
    labels = {}
    for arguments in all_of("LABEL"):
        labels.update(key_values(arguments))
    if set(labels) != label_keys:
        problems.append(f"LABEL keys {sorted(labels)}, build.sh sets {sorted(label_keys)}")
    env = {}
    for arguments in all_of("ENV"):
        env.update(key_values(arguments))
    expected_env = env_keys | (cuda_env_keys if flavor == "cuda" else set())
    if set(env) != expected_env:
        problems.append(f"ENV keys {sorted(env)}, build.sh sets {sorted(expected_env)}")
    if env.get("HOME") != home:
        problems.append(f"ENV HOME={env.get('HOME')}, expected {home}")
    return problems


class DockerfilesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.manifest = Manifest(read(os.path.join(HERE, "image.txt")))
        cls.script = read(os.path.join(HERE, "build.sh"))
        cls.version = read(os.path.join(REPO_ROOT, "deploy", "VERSION")).strip()
        cls.dockerfiles = {
            "cpu": read(os.path.join(HERE, "Dockerfile")),
            "cuda": read(os.path.join(HERE, "Dockerfile.cuda")),
        }

    def check(self, text, flavor):
        return check(text, flavor, self.manifest, self.script, self.version)

    def test_dockerfiles_match_the_build_script(self):
        for flavor, text in self.dockerfiles.items():
            with self.subTest(flavor=flavor):
                self.assertEqual(self.check(text, flavor), [])

    def test_the_contract(self):
        # Issue 15's shared contract, which the manifests of deploy/k8s rely on.
        self.assertEqual(
            self.manifest.single("user"), ["zeroshard", "65532", "65532", "/var/lib/zeroshard"]
        )
        self.assertEqual(
            sorted(path for _label, path in self.manifest.directive("binary")),
            [
                "/usr/local/bin/zeroshard",
                "/usr/local/bin/zeroshard-coordinator",
                "/usr/local/bin/zeroshard-worker",
            ],
        )

    def test_build_script_takes_everything_from_the_manifest(self):
        self.assertIn("image.txt", self.script)
        for literal in ("65532", "/var/lib/zeroshard", "/usr/local/bin/zeroshard", "libgrpc"):
            self.assertNotIn(literal, self.script, "build.sh must read it from image.txt")

    def test_drift_is_caught(self):
        cpu = self.dockerfiles["cpu"]
        cuda = self.dockerfiles["cuda"]
        drifts = {
            "uid": (cpu.replace("--uid 65532", "--uid 1000"), "cpu"),
            "user": (cpu.replace("USER 65532:65532", "USER 0:0"), "cpu"),
            "package dropped": (cpu.replace(" libyaml-cpp0.7", ""), "cpu"),
            "package added": (cpu.replace("python3-grpcio", "python3-grpcio curl"), "cpu"),
            "binary path": (
                cpu.replace(
                    "/usr/local/bin/zeroshard-worker\n", "/usr/bin/zeroshard-worker\n"
                ),
                "cpu",
            ),
            "entrypoint": (
                cpu.replace('ENTRYPOINT ["/usr/local/bin/zeroshard"]', 'ENTRYPOINT ["/bin/sh"]'),
                "cpu",
            ),
            "workdir": (cpu.replace("WORKDIR /var/lib/zeroshard", "WORKDIR /"), "cpu"),
            "label": (cpu.replace("org.opencontainers.image.revision", "revision"), "cpu"),
            "cuda libraries": (cuda.replace("COPY cuda-lib/ /usr/local/cuda/lib64/\n", ""), "cuda"),
            "cuda env": (cuda.replace("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_X=all"), "cuda"),
            "cpu file as cuda": (cpu, "cuda"),
            "version": (cpu.replace("ARG VERSION=", "ARG VERSION=9"), "cpu"),
        }
        for what, (text, flavor) in drifts.items():
            with self.subTest(drift=what):
                changed = text != self.dockerfiles[flavor]
                self.assertTrue(changed, f"the {what} edit changed nothing")
                self.assertNotEqual(self.check(text, flavor), [])

    def test_manifest_drift_is_caught(self):
        # A package added to image.txt (read by build.sh) but not to the Dockerfiles.
        text = read(os.path.join(HERE, "image.txt")) + "package all libcurl4\n"
        problems = check(
            self.dockerfiles["cpu"], "cpu", Manifest(text), self.script, self.version
        )
        self.assertTrue(any("libcurl4" in p for p in problems), problems)


if __name__ == "__main__":
    unittest.main()
