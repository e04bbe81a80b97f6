#!/usr/bin/env bash
# Builds the GPU checks (-c opt --config=cuda) and packs them for a GPU machine without Bazel:
# the binaries, the shared libraries they need that such a machine may lack (abseil, OpenBLAS and
# its Fortran runtime for the CPU reference MLP, and this machine's CUDA runtime as a fallback),
# and run.sh, which runs them all. cuBLAS and NCCL are too large to carry (README.md).
# Usage: tests/gpu/bundle.sh [OUT_DIR]   (default: /tmp/zeroshard-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/zeroshard-gpu}
targets=(//tests/gpu:kernels_gpu_test //tests/gpu:engine_gpu_test
  //worker/comm:nccl_communicator_test)
bazel build -c opt --config=cuda "${targets[@]}"
if ! bin=$(bazel info -c opt --config=cuda bazel-bin); then
  echo "bundle: bazel info -c opt --config=cuda bazel-bin failed" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/lib"
for target in "${targets[@]}"; do
  name=${target##*:}
  package=${target#//}
  cp "$bin/${package%%:*}/$name" "$out/"
  # Everything outside glibc that the dynamic loader resolves here.
  ldd "$out/$name" | awk '/=> \// {print $3}' |
    grep -E 'libabsl_|libcudart|libopenblas|libgfortran|libquadmath' |
    xargs -r -I{} cp -L {} "$out/lib/"
done
cp tests/gpu/run.sh "$out/"
du -sh "$out"
echo "copy $out to the GPU machine and run: $(basename "$out")/run.sh"
