#!/usr/bin/env bash
# Makes the tools venv with PyPI's torch 2.x (fused CPU AdamW) for tests/bench/torch_adamw.py.
# By hand only, never in CI: PyPI's Linux wheel pulls in its CUDA libraries (about 5 GB).
# Usage: tools/make_torch_venv.sh [VENV_DIR]   (default /opt/zs-torch)
set -euo pipefail

VENV=${1:-/opt/zs-torch}
CPU_INDEX=https://download.pytorch.org/whl/cpu

# --system-site-packages: the venv sees Debian's numpy; torch itself comes from pip.
if [[ ! -x "$VENV/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip

# The CPU-only wheel is about 200 MB instead of 5 GB, where its index can be reached.
if curl -sSf --max-time 15 -o /dev/null "$CPU_INDEX/"; then
  "$VENV/bin/python" -m pip install torch --index-url "$CPU_INDEX"
else
  echo "make_torch_venv: $CPU_INDEX unreachable; installing the default PyPI wheel" >&2
  "$VENV/bin/python" -m pip install torch
fi
"$VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "in", torch.__file__)'
