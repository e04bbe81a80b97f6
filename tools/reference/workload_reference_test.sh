#!/usr/bin/env bash
# Checks that the C++ generator (//worker/workloads:dump_workload) and the NumPy reference
# (workload_reference.py) write byte-identical inputs and initial student and teacher weights.
set -euo pipefail

DUMP=worker/workloads/dump_workload
REFERENCE=tools/reference/workload_reference.py
WORK="${TEST_TMPDIR:-$(mktemp -d)}"

PYTHON=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import numpy" 2>/dev/null; then
    PYTHON="$candidate"
    break
  fi
done
if [[ -z "$PYTHON" ]]; then
  echo "FAIL: no python3 with numpy (tools/bootstrap.sh installs python3-numpy)" >&2
  exit 1
fi

compare() {
  local name="$1"
  shift
  local cpp="$WORK/$name/cpp" numpy="$WORK/$name/numpy"
  mkdir -p "$cpp" "$numpy"
  "$DUMP" --out="$cpp" "$@"
  "$PYTHON" "$REFERENCE" --out="$numpy" "$@"
  local cpp_files numpy_files
  cpp_files="$(cd "$cpp" && ls)"
  numpy_files="$(cd "$numpy" && ls)"
  if [[ "$cpp_files" != "$numpy_files" ]]; then
    echo "FAIL $name: different files: [$cpp_files] vs [$numpy_files]" >&2
    exit 1
  fi
  for file in $cpp_files; do
    if [[ ! -s "$cpp/$file" ]]; then
      echo "FAIL $name: $file is empty" >&2
      exit 1
    fi
    if ! cmp "$cpp/$file" "$numpy/$file"; then
      echo "FAIL $name: $file differs" >&2
      exit 1
    fi
  done
  echo "ok $name: $(echo "$cpp_files" | wc -l) files identical"
}

compare seed_preset_seed_0 --preset=seed --seed=0 --samples=8
compare seed_preset_large_seed --preset=seed --seed=18446744073709551615 --samples=3
compare custom_sizes --layer_sizes=7,3,5,2 --seed=12345 --samples=9
compare small_preset --preset=small --seed=1 --samples=2
