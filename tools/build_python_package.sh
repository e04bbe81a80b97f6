#!/usr/bin/env bash
# Builds the zeroshard Python package's sdist and wheel into OUT_DIR (default python/dist), offline,
# with Debian's python3-setuptools and python3-wheel: python/setup.py generates the protobuf and
# gRPC stubs from proto/ (python/generate_stubs.sh: Debian's protoc 3.21) and copies
# deploy/local/cluster.py into the package. The wheel is built from the sdist, as `python -m build`
# does, so it shows that the sdist needs neither proto/ nor deploy/. The checkout is only read: the
# build runs in a staging copy of python/ beside copies of proto/ and deploy/.
# Usage: tools/build_python_package.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

OUT_DIR=$(mkdir -p "${1:-python/dist}" && cd "${1:-python/dist}" && pwd)
PYTHON=/usr/bin/python3
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

mkdir -p "$STAGE/python" "$STAGE/deploy/local"
cp python/pyproject.toml python/setup.py python/README.md python/generate_stubs.sh "$STAGE/python/"
cp -r python/zeroshard "$STAGE/python/"
# Stubs generated into the checkout by hand (docs/pytorch.md's PYTHONPATH route) and caches: the
# build generates its own.
rm -rf "$STAGE/python/zeroshard/_proto/zeroshard"
find "$STAGE/python" -name __pycache__ -prune -exec rm -rf {} +
cp -r proto "$STAGE/"
cp deploy/VERSION "$STAGE/deploy/"
cp deploy/local/cluster.py "$STAGE/deploy/local/"

build() { # HOOK DIRECTORY: a PEP 517 hook of setuptools, run in DIRECTORY; prints the file's name
  (cd "$2" && "$PYTHON" -c '
import sys
from setuptools import build_meta
print(getattr(build_meta, sys.argv[1])(sys.argv[2]))' "$1" "$OUT_DIR" | tail -n 1)
}

sdist=$(build build_sdist "$STAGE/python")
mkdir "$STAGE/unpacked"
tar -xzf "$OUT_DIR/$sdist" -C "$STAGE/unpacked"
wheel=$(build build_wheel "$STAGE/unpacked/${sdist%.tar.gz}")
echo "build_python_package: $OUT_DIR/$sdist"
echo "build_python_package: $OUT_DIR/$wheel"
