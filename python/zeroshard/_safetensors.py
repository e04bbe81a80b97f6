"""ZeroShard's one safetensors reader and writer in Python (standard library only; torch only for
the tensors handed to the writer and for to_torch).

The format (https://github.com/huggingface/safetensors): an unsigned 64-bit little-endian header
length N, N bytes of JSON header mapping each tensor name to {"dtype", "shape", "data_offsets":
[begin, end]} (byte offsets into the data that follows) plus an optional "__metadata__" object of
strings, then the tensors' bytes back to back.

Reading is as strict as the C++ reader's (checkpoint/safetensors_reader.cc SafetensorsReader::
Open), because checkpoint files come from a volume every worker may write: read_header checks
every dtype, shape and offset against the others and against the file's real size before
anything is allocated from them, and every refusal is a ValueError naming the file and the field.
Writing: write_f32 writes F32 tensors, header keys in the order given, no metadata, the header
padded with spaces to a multiple of 8 bytes.

Users: zeroshard._checkpoint (checkpoint shards, full state files), zeroshard.torch's save, and
the tools and tests that read exported files (tools/safetensors_file.py is a link to this file,
for scripts that import it from tools/ without the zeroshard package):

    tensors, metadata = read_safetensors("model.safetensors")   # name -> Tensor, in data order
    model.load_state_dict(to_torch(tensors))                    # needs torch
"""

import ctypes
import json
import math
import os
import struct
from typing import Dict, NamedTuple, Tuple

# checkpoint/safetensors.h kMaxSafetensorsHeaderBytes (the official safetensors reader's limit).
MAX_HEADER_BYTES = 100_000_000
LENGTH_PREFIX_BYTES = 8
METADATA_KEY = "__metadata__"
INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1

# checkpoint/safetensors.cc kDTypes: name -> bytes per element.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}


def quoted(text):
    """`text` in double quotes, escaped as absl::CHexEscape does (the C++ reader's messages)."""
    out = []
    for byte in text.encode("utf-8", "surrogatepass"):
        char = chr(byte)
        if char in "\"'\\":
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\x{byte:02x}")
    return '"' + "".join(out) + '"'


def read_fully(fd, size, offset, path):
    """`size` bytes of `fd` at `offset` (a bytearray); ValueError naming `path` when the file
    ends first."""
    data = bytearray(size)
    read_into(fd, memoryview(data), offset, path)
    return data


def read_into(fd, out, offset, path):
    """Fills the writable buffer `out` with `fd`'s bytes from `offset`; ValueError naming `path`
    when the file ends first or the read fails."""
    done = 0
    while done < len(out):
        try:
            got = os.preadv(fd, [out[done:]], offset + done)
        except OSError as e:
            raise ValueError(f"{path}: read at byte {offset + done}: {e.strerror}") from None
        if got == 0:
            raise ValueError(f"{path}: the file ends at byte {offset + done}, before the "
                             f"{len(out)} bytes at byte {offset} (truncated while read)")
        done += got


# ---- The header ----

def _kind(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class _Corrupt(Exception):
    """A reason a safetensors header is refused, before the file's name is added."""


def _non_negative_integer(value, what):
    """checkpoint/safetensors_reader.cc NonNegativeInteger: an int in [0, 2^63)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        shown = json.dumps(value) if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else _kind(value)
        raise _Corrupt(f"{what}: {shown} is not a non-negative 64-bit integer")
    return value


def _object_pairs(pairs):
    names = set()
    for name, value in pairs:
        if name in names:
            raise _Corrupt(f"header: duplicate name {quoted(name)}")
        names.add(name)
        for text in (name, value):
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise _Corrupt("header: string is not UTF-8 (an unpaired surrogate)") \
                        from None
    return dict(pairs)


def _not_json(constant):
    raise _Corrupt(f"header: {constant} is not JSON")


class HeaderEntry:
    """One tensor of a header: its name, dtype, shape (a list) and [data_begin, data_end) in the
    data section. Thread contract: not shared."""
    __slots__ = ("name", "dtype", "shape", "data_begin", "data_end")


def _parse_tensor_entry(name, entry):
    """checkpoint/safetensors_reader.cc ParseTensorEntry."""
    where = f"tensor {quoted(name)}"
    if not isinstance(entry, dict):
        raise _Corrupt(f"{where}: {_kind(entry)}, not an object")
    tensor = HeaderEntry()
    tensor.name = name
    for field, value in entry.items():
        if field == "dtype":
            if not isinstance(value, str):
                raise _Corrupt(f"{where}: dtype is {_kind(value)}")
            if value not in DTYPE_SIZES:
                raise _Corrupt(f"{where}: unknown dtype {quoted(value)}")
            tensor.dtype = value
        elif field == "shape":
            if not isinstance(value, list):
                raise _Corrupt(f"{where}: shape is {_kind(value)}")
            tensor.shape = [_non_negative_integer(dim, f"{where}: shape[{d}]")
                            for d, dim in enumerate(value)]
        elif field == "data_offsets":
            if not isinstance(value, list) or len(value) != 2:
                raise _Corrupt(f"{where}: data_offsets is not an array of two integers")
            begin = _non_negative_integer(value[0], f"{where}: data_offsets[0]")
            end = _non_negative_integer(value[1], f"{where}: data_offsets[1]")
            if end < begin:
                raise _Corrupt(f"{where}: data_offsets [{begin}, {end}] end before they begin")
            tensor.data_begin, tensor.data_end = begin, end
        else:
            raise _Corrupt(f"{where}: unknown field {quoted(field)}")
    for field, attribute in (("dtype", "dtype"), ("shape", "shape"),
                             ("data_offsets", "data_begin")):
        if not hasattr(tensor, attribute):
            raise _Corrupt(f"{where}: no {field}")
    size = DTYPE_SIZES[tensor.dtype]
    for dim in tensor.shape:
        size *= dim
        if size > _UINT64_MAX:
            raise _Corrupt(f"{where}: shape overflows 64 bits")
    if size != tensor.data_end - tensor.data_begin:
        shape = ",".join(map(str, tensor.shape))
        raise _Corrupt(f"{where}: dtype {tensor.dtype} x shape [{shape}] is {size} bytes, but "
                       f"data_offsets [{tensor.data_begin}, {tensor.data_end}] hold "
                       f"{tensor.data_end - tensor.data_begin}")
    return tensor


def _parse_header_json(text, corrupt):
    """The header's JSON object, or `corrupt`'s ValueError."""
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_object_pairs,
                            parse_constant=_not_json)
    except _Corrupt as e:
        raise corrupt(str(e)) from None
    except UnicodeDecodeError:
        raise corrupt("header: not UTF-8") from None
    except RecursionError:
        raise corrupt("header: nested too deeply") from None
    except ValueError as e:
        raise corrupt(f"header: not JSON: {e}") from None
    if not isinstance(header, dict):
        raise corrupt(f"the header is {_kind(header)}, not an object")
    return header


def _check_tiling(tensors, data_size, size, corrupt):
    """The tensors (sorted by offset) must tile the data section: each starts where the last
    ended, and the last ends where the file does."""
    expected = 0
    previous = None
    for tensor in tensors:
        where = f"tensor {quoted(tensor.name)} (data_offsets [{tensor.data_begin}, " \
                f"{tensor.data_end}])"
        if tensor.data_begin < expected:
            raise corrupt(f"{where} overlaps tensor {quoted(previous.name)}, which ends at "
                          f"{expected}")
        if tensor.data_begin > expected:
            raise corrupt(f"{where} leaves a gap of {tensor.data_begin - expected} bytes before "
                          "it")
        if tensor.data_end > data_size:
            raise corrupt(f"{where} ends beyond the data section, which holds {data_size} bytes "
                          f"(file size {size}): truncated")
        expected = tensor.data_end
        previous = tensor
    if expected != data_size:
        raise corrupt(f"the tensors cover {expected} bytes of data, but the file holds "
                      f"{data_size} after its header")


def read_header(fd, size, path):
    """checkpoint/safetensors_reader.cc SafetensorsReader::Open: ({tensor name: HeaderEntry} in
    data order, {metadata key: value}, the data section's file offset) of the file `fd` of `size`
    bytes, named `path` in errors. Reads nothing beyond the header, whose length is checked
    against the file's real `size` first; does not take `fd` over."""
    def corrupt(what):
        return ValueError(f"safetensors file {path}: {what}")

    if size < LENGTH_PREFIX_BYTES:
        raise corrupt(f"the file has {size} bytes, fewer than the 8-byte header length")
    (header_bytes,) = struct.unpack("<Q", read_fully(fd, LENGTH_PREFIX_BYTES, 0, path))
    if header_bytes > size - LENGTH_PREFIX_BYTES:
        raise corrupt(f"the header length {header_bytes} reaches beyond the file ({size} "
                      "bytes): truncated or not safetensors")
    if header_bytes > MAX_HEADER_BYTES:
        raise corrupt(f"the header length {header_bytes} exceeds the format's limit of "
                      f"{MAX_HEADER_BYTES}")
    text = read_fully(fd, header_bytes, LENGTH_PREFIX_BYTES, path)
    data_start = LENGTH_PREFIX_BYTES + header_bytes
    header = _parse_header_json(text, corrupt)
    metadata = {}
    tensors = []
    try:
        for key, value in header.items():
            if key == METADATA_KEY:
                if not isinstance(value, dict):
                    raise _Corrupt(f"__metadata__ is {_kind(value)}, not an object")
                for name, text_value in value.items():
                    if not isinstance(text_value, str):
                        raise _Corrupt(f"__metadata__ {quoted(name)} is {_kind(text_value)}, "
                                       "not a string")
                    metadata[name] = text_value
                continue
            tensors.append(_parse_tensor_entry(key, value))
    except _Corrupt as e:
        raise corrupt(str(e)) from None
    tensors.sort(key=lambda t: (t.data_begin, t.data_end))
    _check_tiling(tensors, size - data_start, size, corrupt)
    return {t.name: t for t in tensors}, metadata, data_start


# ---- Whole files ----

class Tensor(NamedTuple):
    dtype: str
    shape: Tuple[int, ...]
    data: bytes  # little-endian elements, row-major


def read_safetensors(path: str) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """Every tensor of the file at `path`, in data order, and its metadata; ValueError naming the
    file and field for anything that is not a valid file (read_header's checks)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        entries, metadata, data_start = read_header(fd, size, path)
        data = read_fully(fd, size - data_start, data_start, path)
    finally:
        os.close(fd)
    view = memoryview(data)
    tensors = {name: Tensor(entry.dtype, tuple(entry.shape),
                            bytes(view[entry.data_begin:entry.data_end]))
               for name, entry in entries.items()}
    return tensors, metadata


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


def _contents(tensors, deferred, produce):
    """(name, tensor) of `tensors`, then of `deferred` as `produce()` yields them."""
    yield from tensors.items()
    if not deferred:
        return
    values = produce()
    try:
        for name, shape in deferred:
            tensor = next(values, None)
            if tensor is None or tensor.numel() != math.prod(shape):
                raise ValueError(f"{name}: produce() yielded no tensor of shape {list(shape)}")
            yield name, tensor
    finally:
        values.close()


def write_f32(path, tensors, replace=False, deferred=(), produce=None):
    """Writes `tensors` ({name: contiguous CPU float32 torch tensor}) as a safetensors file of F32
    tensors of their shapes, in the dict's order, then `deferred` ([(name, shape)]), whose
    tensors `produce()` yields in that order while the file is written (each one is written
    before the next is asked for: zero3's parameters, one gathered module at a time). `replace`:
    written to `path`.tmp first and renamed over `path`, so that a reader never sees a partial
    file."""
    header = {}
    offset = 0
    shapes = [(name, list(tensor.shape)) for name, tensor in tensors.items()]
    shapes += [(name, list(shape)) for name, shape in deferred]
    for name, shape in shapes:
        size = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    target = f"{path}.tmp" if replace else path
    with open(target, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for name, tensor in _contents(tensors, deferred, produce):
            if (str(tensor.dtype) != "torch.float32" or tensor.device.type != "cpu" or
                    not tensor.is_contiguous()):
                raise ValueError(f"{name}: a contiguous CPU float32 tensor expected")
            # Read through its address, not numpy(): numpy() marks the storage not resizable
            # for good, and zero3 frees a parameter's storage by resizing it.
            if tensor.numel():
                out.write(ctypes.string_at(tensor.data_ptr(), tensor.numel() * 4))
    if replace:
        os.replace(target, path)
