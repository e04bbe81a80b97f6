"""Checks ZeroShard's safetensors files against PyPI's safetensors, both ways.

Run by tools/check_safetensors_compat.sh (which builds the tool and picks the venv):
  1. a checkpoint shard written by //checkpoint:safetensors_compat_tool is read by the official
     library (its Rust parser validates the header), tensor by tensor, byte for byte, with the
     fragment table in __metadata__;
  2. files the official library wrote (numpy dtypes, bf16, empty and 0-d tensors, metadata) are
     read by our reader, byte for byte.
Exits non-zero on the first mismatch.
"""

import argparse
import json
import os
import struct
import subprocess
import sys

import numpy as np
import safetensors
from safetensors import TensorSpec, deserialize, safe_open, serialize_file
from safetensors.numpy import save_file

NUMPY_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16}


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def check_our_shard(tool, work):
    path = os.path.join(work, "rank-00001-of-00002.safetensors")
    expected_path = os.path.join(work, "expected.json")
    subprocess.run([tool, "write-shard", path, expected_path], check=True)
    expected = json.load(open(expected_path))
    data = open(path, "rb").read()
    if len(data) != expected["bytes"]:
        fail(f"{path}: {len(data)} bytes, the writer reported {expected['bytes']}")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len % 8 != 0:
        fail(f"header length {header_len} is not a multiple of 8")

    # deserialize: every tensor's raw bytes, whatever its dtype (numpy has no bf16).
    got = {name: info for name, info in deserialize(data)}
    want = {t["name"]: t for t in expected["tensors"]}
    if set(got) != set(want):
        fail(f"tensor names differ: {sorted(set(got) ^ set(want))[:5]}")
    for name, t in want.items():
        info = got[name]
        if info["dtype"] != t["dtype"] or list(info["shape"]) != [int(d) for d in t["shape"]]:
            fail(f"{name}: {info['dtype']} {info['shape']}, expected {t['dtype']} {t['shape']}")
        if bytes(info["data"]).hex() != t["hex"]:
            fail(f"{name}: bytes differ")

    # safe_open (the lazy reader most users call): metadata and the fp32 tensors as numpy.
    with safe_open(path, framework="np") as f:
        metadata = f.metadata()
        header = json.loads(metadata["zeroshard.checkpoint"])
        table = json.loads(metadata["zeroshard.fragments"])["fragments"]
        keys = {f"{fr['state']}/{fr['tensor']}/{fr['begin']}-{fr['end']}" for fr in table}
        if keys != set(f.keys()):
            fail("the fragment table does not name exactly the file's tensors")
        if header["rank"] != 1 or header["world_size"] != 2 or header["job_id"] != "job-000007":
            fail(f"unexpected header {header}")
        checked = 0
        for name, t in want.items():
            if t["dtype"] == "F32":
                if f.get_tensor(name).tobytes().hex() != t["hex"]:
                    fail(f"{name}: safe_open bytes differ")
                checked += 1
    print(f"OK: safetensors {safetensors.__version__} read our shard: {len(want)} fragments "
          f"byte for byte ({checked} also via safe_open), {len(table)} table entries, "
          f"header of {header_len} bytes")


def read_with_tool(tool, path):
    out = subprocess.run([tool, "read", path], check=True, capture_output=True, text=True)
    result = json.loads(out.stdout)
    return result["metadata"], {t["name"]: t for t in result["tensors"]}


def check_their_files(tool, work):
    rng = np.random.default_rng(7)
    arrays = {
        "0.weight": rng.standard_normal((64, 40)).astype(np.float32),
        "0.bias": rng.standard_normal(64).astype(np.float64),
        "half": rng.standard_normal((3, 5)).astype(np.float16),
        "ids": rng.integers(-(2**40), 2**40, size=7).astype(np.int64),
        "i32": rng.integers(-1000, 1000, size=(2, 2)).astype(np.int32),
        "bytes": rng.integers(0, 255, size=9).astype(np.uint8),
        "mask": rng.integers(0, 2, size=4).astype(np.bool_),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float32),
        'odd "name" \u00e4': np.arange(3, dtype=np.int8),
    }
    metadata = {"format": "np", "note": 'quotes " and \\ and \n newline'}
    path = os.path.join(work, "numpy.safetensors")
    save_file(arrays, path, metadata=metadata)
    got_metadata, got = read_with_tool(tool, path)
    if got_metadata != metadata:
        fail(f"metadata {got_metadata} != {metadata}")
    if set(got) != set(arrays):
        fail(f"names differ: {sorted(set(got) ^ set(arrays))}")
    for name, array in arrays.items():
        t = got[name]
        if [int(d) for d in t["shape"]] != list(array.shape):
            fail(f"{name}: shape {t['shape']} != {array.shape}")
        if t["hex"] != array.tobytes().hex():
            fail(f"{name}: bytes differ")

    # bf16 has no numpy dtype: raw bits through TensorSpec.
    bits = rng.integers(0, 2**16, size=(4, 6)).astype(np.uint16)
    path = os.path.join(work, "bf16.safetensors")
    serialize_file({"w": TensorSpec(dtype="bfloat16", shape=list(bits.shape),
                                    data_ptr=bits.ctypes.data, data_len=bits.nbytes)}, path)
    _, got = read_with_tool(tool, path)
    if got["w"]["dtype"] != "BF16" or got["w"]["hex"] != bits.tobytes().hex():
        fail("bf16 tensor differs")
    print(f"OK: our reader read safetensors {safetensors.__version__}'s files: "
          f"{len(arrays)} numpy tensors and a bf16 one, byte for byte, with metadata")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    check_our_shard(args.tool, args.work)
    check_their_files(args.tool, args.work)


if __name__ == "__main__":
    main()
