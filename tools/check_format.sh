#!/usr/bin/env bash
# Fails (listing the files) when a tracked C++/CUDA/proto source is not clang-formatted.
# With --fix, formats them in place instead.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "clang-format not found (tools/bootstrap.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' '*.proto')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i --style=file "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if ((${#bad[@]})); then
  echo "not clang-formatted (run tools/check_format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "clang-format: ${#files[@]} files clean"
