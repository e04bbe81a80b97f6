#!/usr/bin/env bash
# Runs the attached-trainer GPU check of a bundle made by tests/gpu/bundle_attach.sh with the
# machine's python3 (torch with CUDA, grpcio, protobuf). cuBLAS, NCCL and the CUDA runtime come
# from that PyTorch's nvidia/* wheels; the rest from the bundle's lib/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
if [[ -f "$here/lib/libopenblas.so.0.xz" && ! -f "$here/lib/libopenblas.so.0" ]]; then
  "$python" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1] + ".xz") as src, open(sys.argv[1], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$here/lib/libopenblas.so.0" || exit 2
fi
torch_libs=$("$python" -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${torch_libs:+$torch_libs:}$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPENBLAS_NUM_THREADS=1
exec "$python" "$here/repo/tests/gpu/attach_cuda_check.py" --bin_dir "$here/bin" \
  --repo_root "$here/repo" "$@"
