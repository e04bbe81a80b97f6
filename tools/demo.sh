#!/usr/bin/env bash
# The main job. Until the worker daemon and local cluster land (the end-to-end issue), it
# installs what is missing, builds everything and runs a smoke check of what exists.
set -euo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
echo "== building //..."
bazel build //... 2>&1 | grep -v -E "^INFO: From |linux-sandbox" | tail -n 3
echo "== smoke check"
bazel test //common/... //spec/... 2>&1 | grep -E "PASSED|FAILED" || true
echo "The DDP vs ZeRO demo arrives with the end-to-end issue; see README.md's status table."
