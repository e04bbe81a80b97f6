#!/usr/bin/env bash
# Runs e2e_vs_torch_test.py (the end-to-end benchmark's bookkeeping, without torch or a cluster)
# with Debian's python3; the benchmark itself is run by hand (docs/performance.md).
set -euo pipefail
exec /usr/bin/python3 tests/bench/e2e_vs_torch_test.py
