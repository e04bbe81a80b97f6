#!/usr/bin/env bash
# Runs reduce_scatter_study_test.py (the reduce-scatter study's bookkeeping, without a cluster)
# with Debian's python3; the study itself is run by hand (docs/performance.md).
set -euo pipefail
exec /usr/bin/python3 tests/bench/reduce_scatter_study_test.py
