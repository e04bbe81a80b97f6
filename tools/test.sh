#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test that needs no GPU.
# Ends with "N passed, M failed" (test targets, from Bazel's summary). Extra arguments go to
# `bazel test` (e.g. a narrower target pattern).
set -uo pipefail
cd "$(dirname "$0")/.."

tools/bootstrap.sh
targets=("$@")
if ((${#targets[@]} == 0)); then targets=("//..."); fi

log=$(mktemp)
bazel test --keep_going "${targets[@]}" 2>&1 | tee "$log" | grep -v -E "^INFO: From |linux-sandbox"
status=${PIPESTATUS[0]}

summary=$(python3 tools/bazel_test_summary.py "$log")
rm -f "$log"
echo "$summary"
exit "$status"
