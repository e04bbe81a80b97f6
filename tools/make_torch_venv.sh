#!/usr/bin/env bash
# Makes the torch 2.x venv: PyPI's torch, pinned, on Debian's /usr/bin/python3. CI runs the attach
# suite's trainers under it besides Debian's torch 1.13 (.ci/run runs this script first, then the
# "torch2" test targets with $ZEROSHARD_TRAINER_PYTHON), tools/python_package_test.py installs the
# package against it, and tests/bench's torch comparisons use it. Quick (2 s) when the pinned torch
# is there; another version is replaced by the pinned one. PyPI's Linux wheel pulls in its CUDA
# libraries (about 5 GB, 2-3 minutes here; the CPU-only index, download.pytorch.org, is not
# reachable from CI's machines, so it is not tried). Not in tools/bootstrap.sh: tools/test.sh
# does not need it.
# Usage: tools/make_torch_venv.sh [VENV_DIR]   (default /opt/zs-torch)
set -euo pipefail

VENV=${1:-/opt/zs-torch}
TORCH_VERSION=2.15.0

SUDO=""
if [[ "$(id -u)" != 0 ]] && [[ ! -w "$(dirname "$VENV")" ]]; then SUDO="sudo"; fi

# The pinned torch, imported from the venv itself (not Debian's 1.13 through the system
# packages), with what the trainers also import: numpy, grpcio and protobuf (Debian's).
venv_ready() {
  "$VENV/bin/python" - "$VENV" "$TORCH_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata, os, sys
venv, version = sys.argv[1:]
import torch, numpy, grpc, google.protobuf
sys.exit(importlib.metadata.version("torch") != version
         or not os.path.realpath(torch.__file__).startswith(os.path.realpath(venv) + os.sep))
EOF
}

if venv_ready; then
  echo "make_torch_venv: $VENV has torch $TORCH_VERSION"
  exit 0
fi
echo "make_torch_venv: installing torch==$TORCH_VERSION into $VENV (about 5 GB)"
# --system-site-packages: the venv sees Debian's numpy, grpcio and protobuf, the versions the
# attach suite runs with under torch 1.13; torch and its own dependencies come from PyPI into the
# venv, ahead of Debian's on sys.path. A venv whose interpreter no longer runs is made anew.
if ! "$VENV/bin/python" -c "" 2>/dev/null; then
  $SUDO /usr/bin/python3 -m venv --clear --system-site-packages "$VENV"
fi
# --no-cache-dir: the wheels are not kept a second time under ~/.cache/pip.
$SUDO "$VENV/bin/python" -m pip install -q --no-cache-dir "torch==$TORCH_VERSION"
if ! venv_ready; then
  echo "make_torch_venv: $VENV still lacks a working torch $TORCH_VERSION" >&2
  "$VENV/bin/python" -c "import torch, numpy, grpc, google.protobuf" || true
  exit 1
fi
"$VENV/bin/python" -c 'import torch; print("make_torch_venv: torch", torch.__version__, "in", torch.__file__)'
