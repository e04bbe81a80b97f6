#!/usr/bin/env bash
# Runs export_torch_test.py: Debian's torch loads the files export writes into
# nn.Sequential(...).load_state_dict(strict=True).
set -euo pipefail

# Debian's python3, which has python3-torch (tools/bootstrap.sh).
PYTHON=/usr/bin/python3
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "FAIL: $PYTHON cannot import torch (tools/bootstrap.sh installs python3-torch)" >&2
  exit 1
fi
exec "$PYTHON" checkpoint/export_torch_test.py --fixture checkpoint/export_torch_fixture \
  --work_dir "${TEST_TMPDIR:-$(mktemp -d)}"
