#!/usr/bin/env bash
# Packs the attached-trainer GPU check (attach_cuda_check.py) for a GPU machine without Bazel: a
# --config=cuda build of the coordinator, worker and client, the shared libraries they need that
# such a machine may lack (gRPC, protobuf, Gloo, abseil, OpenSSL, ...; not cuBLAS and NCCL, which
# come from its PyTorch), deploy/local/cluster.py, the zeroshard Python package with its
# generated stubs, and run_attach.sh. Separate from bundle.sh: both together exceed what travels
# (README.md). The GPU machine's python needs torch (CUDA), grpcio and protobuf.
# Usage: tests/gpu/bundle_attach.sh [OUT_DIR]   (default: /tmp/zeroshard-gpu-attach)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/zeroshard-gpu-attach}
targets=(//apps/coordinator:zeroshard-coordinator //worker:zeroshard-worker //client:zeroshard)
bazel build -c opt --config=cuda "${targets[@]}"
if ! bin=$(bazel info -c opt --config=cuda bazel-bin); then
  echo "bundle_attach: bazel info -c opt --config=cuda bazel-bin failed" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out/lib" "$out/repo/deploy/local" "$out/repo/python" "$out/repo/tests/gpu"
for target in "${targets[@]}"; do
  name=${target##*:}
  package=${target#//}
  package=${package%%:*}
  mkdir -p "$out/bin/$package"
  cp "$bin/$package/$name" "$out/bin/$package/"
  # Everything outside glibc that the dynamic loader resolves here, but cuBLAS and NCCL.
  ldd "$out/bin/$package/$name" | awk '/=> \// {print $3}' |
    grep -v -E '/(libc|libm|libpthread|librt|libdl|ld-linux[^/]*)\.so|libcublas|libnccl' |
    xargs -r -I{} cp -L -n {} "$out/lib/"
done
cp deploy/local/cluster.py "$out/repo/deploy/local/"
cp -r python/zeroshard "$out/repo/python/"
rm -rf "$out/repo/python/zeroshard/_proto/zeroshard"
find "$out/repo/python" -name __pycache__ -prune -exec rm -rf {} +
python/generate_stubs.sh "$out/repo/python/zeroshard/_proto"
cp tests/gpu/attach_cuda_check.py tests/gpu/attach_cuda_script.py "$out/repo/tests/gpu/"
cp tests/gpu/run_attach.sh "$out/"
# OpenBLAS (35 MB, for the worker's CPU MLP, unused here but linked) would take the bundle past
# the 64 MiB that travels; xz makes it 4 MB and run_attach.sh unpacks it.
if [[ -f "$out/lib/libopenblas.so.0" ]]; then
  python3 -c 'import lzma, shutil, sys
with open(sys.argv[1], "rb") as src, lzma.open(sys.argv[1] + ".xz", "wb") as dst:
    shutil.copyfileobj(src, dst)' "$out/lib/libopenblas.so.0"
  rm "$out/lib/libopenblas.so.0"
fi
du -sh "$out"
echo "copy $out to the GPU machine and run: $(basename "$out")/run_attach.sh"
