#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test that needs no GPU.
# Ends with "N passed, M failed" (test targets, from Bazel's summary) and exits non-zero on any
# failure. Extra arguments go to `bazel test` (e.g. a narrower target pattern).
set -uo pipefail
cd "$(dirname "$0")/.."

# OpenBLAS 0.3.21 picks kernels on this machine kind's CPUs that misbehave without these hints
# (docs/design.md, "OpenBLAS"): keep the environment's, else pin the ones the project runs with.
# Bazel passes them to builds and tests (.bazelrc), and local clusters to their workers.
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
export OPENBLAS_L2_SIZE="${OPENBLAS_L2_SIZE:-512}"

if ! tools/bootstrap.sh; then
  echo "test: tools/bootstrap.sh failed; nothing was built or run"
  echo "0 passed, 1 failed"
  exit 1
fi
targets=("$@")
if ((${#targets[@]} == 0)); then targets=("//..."); fi

log=$(mktemp)
bazel test --keep_going "${targets[@]}" 2>&1 | tee "$log" | grep -v -E "^INFO: From |linux-sandbox"
status=${PIPESTATUS[0]}

summary=$(python3 tools/bazel_test_summary.py "$log")
rm -f "$log"
if [[ ! "$summary" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  echo "test: could not count the results in bazel test's output"
  echo "0 passed, 1 failed"
  exit 1
fi
passed=${BASH_REMATCH[1]}
failed=${BASH_REMATCH[2]}
# Bazel can fail without naming a failed test (a crash, an analysis error under --keep_going,
# no test targets): count that as one failure, so the last line never says "0 failed" then.
if ((status != 0 && failed == 0)); then
  echo "test: bazel test exited with status $status, but its summary names no failed test"
  failed=1
fi
echo "$passed passed, $failed failed"
if ((status == 0 && failed != 0)); then status=1; fi
exit "$status"
