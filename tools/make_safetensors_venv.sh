#!/usr/bin/env bash
# Makes the tools venv with PyPI's safetensors for tools/check_safetensors_compat.sh.
# By hand only, never in CI (it downloads from PyPI).
# Usage: tools/make_safetensors_venv.sh [VENV_DIR]   (default /opt/zs-safetensors)
set -euo pipefail

VENV=${1:-/opt/zs-safetensors}

# --system-site-packages: the venv sees Debian's numpy (and torch), so pip adds only safetensors.
if [[ ! -x "$VENV/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade pip
"$VENV/bin/python" -m pip install safetensors numpy
"$VENV/bin/python" -c 'import safetensors; print("safetensors", safetensors.__version__, "in", safetensors.__file__)'
