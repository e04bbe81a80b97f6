#!/usr/bin/env bash
# Runs every GPU check of a bundle made by tests/gpu/bundle.sh. The CUDA runtime comes from the
# machine's PyTorch install (its nvidia/* wheels) when it has one, else from the bundle's lib/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
torch_libs=$(python3 -c 'import glob, os, nvidia; print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${torch_libs:+$torch_libs:}$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The CPU reference MLP: single-threaded BLAS, as everywhere in ZeroShard.
export OPENBLAS_NUM_THREADS=1
status=0
for check in "$here"/kernels_gpu_test "$here"/nccl_communicator_test "$here"/engine_gpu_test; do
  echo "=== $(basename "$check")"
  "$check" || status=$?
done
exit $status
