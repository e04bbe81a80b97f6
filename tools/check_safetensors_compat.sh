#!/usr/bin/env bash
# Checks by hand that PyPI's safetensors reads our checkpoint files and that our reader reads
# its files (tools/check_safetensors_compat.py). Not in CI: it needs the venv that
# tools/make_safetensors_venv.sh makes from PyPI.
# Usage: tools/check_safetensors_compat.sh [VENV_DIR]   (default /opt/zs-safetensors)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-/opt/zs-safetensors}
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "check_safetensors_compat: no venv at $VENV (run tools/make_safetensors_venv.sh)" >&2
  exit 1
fi
bazel build //checkpoint:safetensors_compat_tool
TOOL="$PWD/.bazel/bin/checkpoint/safetensors_compat_tool"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/python" tools/check_safetensors_compat.py --tool "$TOOL" --work "$WORK"
