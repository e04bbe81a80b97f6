#!/usr/bin/env bash
# Runs torch_adamw_test.py (ZeroShard's AdamW against torch.optim.AdamW) as the command of a local
# cluster: deploy/local/cluster.py with a coordinator and 2 workers from this test's runfiles.
set -euo pipefail

# Debian's python3, which has python3-torch and python3-numpy (tools/bootstrap.sh).
PYTHON=/usr/bin/python3
if ! "$PYTHON" -c "import numpy, torch" 2>/dev/null; then
  echo "FAIL: $PYTHON cannot import numpy and torch (tools/bootstrap.sh installs" \
    "python3-numpy and python3-torch)" >&2
  exit 1
fi
exec "$PYTHON" deploy/local/cluster.py --workers 2 --bin_dir "$PWD" \
  --log_dir "${TEST_TMPDIR:-$(mktemp -d)}/cluster" --heartbeat_period 200ms \
  -- "$PYTHON" tests/integration/torch_adamw_test.py
