#!/usr/bin/env bash
# Runs multi_host_netns_test.py (coordinator and workers in network namespaces joined by a bridge)
# with the binaries of this test's runfiles.
set -euo pipefail
exec /usr/bin/python3 tests/integration/multi_host_netns_test.py "$PWD"
