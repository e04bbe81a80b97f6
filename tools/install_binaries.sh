#!/usr/bin/env bash
# Copies ZeroShard's binaries (zeroshard-coordinator, zeroshard-worker and the zeroshard CLI) to
# PREFIX/bin, where zeroshard-launch finds them on PATH (pip installs only the Python package).
# Without --bin_dir it builds them first: `bazel build -c opt` plus BAZEL_FLAGS (e.g.
# --config=cuda). They link Debian's shared libraries (gRPC, protobuf, abseil, Gloo, OpenBLAS...):
# run them on a machine with the packages tools/bootstrap.sh installs, or use the container image
# (deploy/images), which carries both.
# Usage: tools/install_binaries.sh [--bin_dir DIR] PREFIX [BAZEL_FLAGS...]
#   DIR: an existing build's output directory (bazel-bin, e.g. .bazel/bin) instead of building.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 [--bin_dir DIR] PREFIX [BAZEL_FLAGS...]" >&2
  exit 2
}
bin_dir=""
if [[ "${1:-}" == "--bin_dir" ]]; then
  (($# >= 2)) || usage
  bin_dir=$2
  shift 2
elif [[ "${1:-}" == --bin_dir=* ]]; then
  bin_dir=${1#--bin_dir=}
  shift
fi
(($# >= 1)) || usage
prefix=$1
shift
[[ -z "$bin_dir" || $# -eq 0 ]] || usage # BAZEL_FLAGS only when building

# Bazel's layout: what each binary is called in bazel-bin.
BINARIES=(apps/coordinator/zeroshard-coordinator worker/zeroshard-worker client/zeroshard)
if [[ -z "$bin_dir" ]]; then
  targets=()
  for binary in "${BINARIES[@]}"; do targets+=("//${binary%/*}:${binary##*/}"); done
  bazel build -c opt "$@" "${targets[@]}"
  bin_dir=$(bazel info -c opt "$@" bazel-bin 2>/dev/null)
fi
for binary in "${BINARIES[@]}"; do
  if [[ ! -x "$bin_dir/$binary" ]]; then
    echo "install_binaries: $bin_dir/$binary is missing (build it, or drop --bin_dir)" >&2
    exit 1
  fi
done
mkdir -p "$prefix/bin"
for binary in "${BINARIES[@]}"; do
  # install(1) writes a new file: a running copy is not overwritten in place.
  install -m 0755 "$bin_dir/$binary" "$prefix/bin/${binary##*/}"
  echo "install_binaries: $prefix/bin/${binary##*/}"
done
