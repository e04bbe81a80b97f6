"""A small reader of safetensors files, for tools and tests that must not depend on PyPI's
`safetensors` package (CI has none).

The format (https://github.com/huggingface/safetensors): an unsigned 64-bit little-endian header
length N, N bytes of JSON header mapping each tensor name to {"dtype", "shape", "data_offsets":
[begin, end]} (byte offsets into the data that follows) plus an optional "__metadata__" object of
strings, then the tensors' bytes back to back.

    tensors, metadata = read_safetensors("model.safetensors")   # name -> Tensor, in data order
    model.load_state_dict(to_torch(tensors))                    # needs torch
"""

import json
import math
import struct
from typing import Dict, NamedTuple, Tuple

DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}


class Tensor(NamedTuple):
    dtype: str
    shape: Tuple[int, ...]
    data: bytes  # little-endian elements, row-major


def parse_safetensors(blob: bytes) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """Parses a whole file's bytes. Raises ValueError for anything that is not a valid file."""
    if len(blob) < 8:
        raise ValueError(f"{len(blob)} bytes: shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        raise ValueError(f"header length {header_len} reaches beyond the {len(blob)}-byte file")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("__metadata__ values must be strings")
    data = memoryview(blob)[8 + header_len:]
    tensors = {}
    expected_begin = 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        dtype, shape = entry["dtype"], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise ValueError(f"{name}: unknown dtype {dtype}")
        if begin != expected_begin:
            raise ValueError(f"{name}: data starts at {begin}, not at {expected_begin}")
        if end - begin != DTYPE_SIZES[dtype] * math.prod(shape):
            raise ValueError(f"{name}: {end - begin} bytes for {dtype} {list(shape)}")
        if end > len(data):
            raise ValueError(f"{name}: ends at {end}, beyond the {len(data)} bytes of data")
        tensors[name] = Tensor(dtype, shape, bytes(data[begin:end]))
        expected_begin = end
    if expected_begin != len(data):
        raise ValueError(f"the tensors cover {expected_begin} of {len(data)} bytes of data")
    return tensors, metadata


def read_safetensors(path: str) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """Reads and parses the file at `path` (parse_safetensors)."""
    with open(path, "rb") as f:
        return parse_safetensors(f.read())


def to_torch(tensors: Dict[str, Tensor]):
    """The tensors as a torch state dict (name -> torch.Tensor), e.g. for load_state_dict."""
    import torch

    dtypes = {
        "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
        "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32,
        "F64": torch.float64, "I64": torch.int64,
    }
    state = {}
    for name, tensor in tensors.items():
        if tensor.dtype not in dtypes:
            raise ValueError(f"{name}: torch has no {tensor.dtype}")
        if not tensor.data:
            state[name] = torch.empty(tensor.shape, dtype=dtypes[tensor.dtype])
            continue
        flat = torch.frombuffer(bytearray(tensor.data), dtype=dtypes[tensor.dtype])
        state[name] = flat.reshape(tensor.shape)
    return state
