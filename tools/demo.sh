#!/usr/bin/env bash
# The main job: installs what is missing for it, builds the coordinator, worker and CLI (-c opt), starts
# a local cluster of 4 CPU workers (deploy/local/cluster.py) and runs the DDP vs ZeRO demo on it
# (tools/demo.py). Extra arguments go to demo.py, e.g. `tools/demo.sh --preset medium`.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(//apps/coordinator:zeroshard-coordinator //client:zeroshard //worker:zeroshard-worker)
WORKERS=4

# Only what the demo needs; tools/test.sh installs the rest.
tools/bootstrap.sh --demo

# Debian's python3 has python3-numpy (bootstrap.sh); another python3 first on PATH may not.
PYTHON=python3
if [[ -x /usr/bin/python3 ]]; then PYTHON=/usr/bin/python3; fi

LOG_DIR="$(mktemp -d /tmp/zeroshard-demo-XXXXXX)"
echo "== building ${TARGETS[*]} (bazel build -c opt; the first build takes a while)"
start=$SECONDS
if ! bazel build -c opt "${TARGETS[@]}" >"$LOG_DIR/build.log" 2>&1; then
  tail -n 30 "$LOG_DIR/build.log" >&2
  echo "demo: the build failed; full log: $LOG_DIR/build.log" >&2
  exit 1
fi
echo "   built in $((SECONDS - start)) s"
# The -c opt output directory itself (bazel-bin follows whatever was built last).
if ! BIN_DIR="$(bazel info -c opt bazel-bin 2>"$LOG_DIR/info.log")"; then
  cat "$LOG_DIR/info.log" >&2
  echo "demo: bazel info -c opt bazel-bin failed" >&2
  exit 1
fi

echo "== starting a local cluster: 1 coordinator, $WORKERS workers (logs in $LOG_DIR)"
exec "$PYTHON" deploy/local/cluster.py --workers "$WORKERS" --bin_dir "$BIN_DIR" \
  --log_dir "$LOG_DIR" -- "$PYTHON" tools/demo.py --workers "$WORKERS" "$@"
