"""Reading ZeroShard's sharded checkpoints (checkpoint/manifest.h, checkpoint/shard_file.h) and
writing the full state files that a worker restores from, in pure Python with torch.

Internal to zeroshard.torch (state_dict(consolidated=True), load_state_dict). A checkpoint is a
step directory holding manifest.json and one safetensors file per rank; each file's tensors are
1-D fragments named "<state>/<tensor>/<begin>-<end>" and its "__metadata__" holds the shard
header and the fragment table as protobuf JSON.

The checkpoint volume is writable by every worker, so nothing read from it is trusted. The rules
are the C++ reader's (checkpoint/manifest.cc ValidateManifest, checkpoint/safetensors_reader.cc
SafetensorsReader::Open, checkpoint/shard_file.cc ShardReader::Open, checkpoint/
checkpoint_reader.cc CheckpointReader::Open), so that what one refuses the other refuses too:
  - files[].path is a plain file name, and every file is opened relative to the step
    directory's fd without following a link (O_NOFOLLOW); a link is refused, naming it;
  - manifest.json is read only up to MAX_MANIFEST_BYTES (16 MiB), a safetensors header only up
    to 100,000,000 bytes and never beyond the file;
  - every declared dtype, shape and data offset is checked against the others and against the
    file's real size, and the fragments of all files must cover each tensor's elements
    [0, numel) exactly once (no gap, no overlap), before anything is allocated from them.
Checksums are not verified here (the workers verify every fragment they load).

Every refusal is a ValueError naming the file and the field (the error load_state_dict
documents).
"""

import errno
import json
import os
import stat
import struct

import torch
from google.protobuf import json_format

from zeroshard._proto.zeroshard.v1 import checkpoint_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2

MANIFEST_FILE_NAME = "manifest.json"
# checkpoint/manifest.h: kManifestFormatVersion, kMaxNamedWorldSize.
_MANIFEST_FORMAT_VERSION = 1
_MAX_NAMED_WORLD_SIZE = 99999
# checkpoint/shard_file.h: kShardFormatVersion.
_SHARD_FORMAT_VERSION = 1
# checkpoint/manifest.h kMaxManifestBytes: a manifest of the largest world size is well under
# 10 MiB, and a larger manifest.json (a sparse file costs the volume nothing) is refused before
# it is read.
MAX_MANIFEST_BYTES = 16 << 20
# checkpoint/safetensors.h kMaxSafetensorsHeaderBytes (the official safetensors reader's limit).
_MAX_HEADER_BYTES = 100_000_000
_LENGTH_PREFIX_BYTES = 8
_HEADER_KEY = "zeroshard.checkpoint"
_FRAGMENTS_KEY = "zeroshard.fragments"
_METADATA_KEY = "__metadata__"
_STEP_DIR_PREFIX = "step-"
_STEP_DIGITS = 12
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1

# checkpoint/safetensors.cc kDTypes: name -> bytes per element.
_SAFETENSORS_DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}
# checkpoint/shard_file.cc FragmentDTypeSize and ToSafetensorsDType.
_FRAGMENT_DTYPES = {
    types_pb2.FLOAT32: (4, "F32"),
    types_pb2.BFLOAT16: (2, "BF16"),
    types_pb2.FLOAT16: (2, "F16"),
    types_pb2.FLOAT64: (8, "F64"),
}

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
# O_NONBLOCK: opening a FIFO planted in place of a file must not block (regular files ignore it).
_OPEN_FILE_FLAGS = _OPEN_FLAGS | os.O_NONBLOCK


def _quoted(text):
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


def _fragment_key(state, tensor, begin, end):
    return f"{state}/{tensor}/{begin}-{end}"


def _key_of(fragment):
    return _fragment_key(fragment.state, fragment.tensor, fragment.begin, fragment.end)


def _step_of_dir_name(name):
    """checkpoint/manifest.cc ParseStepDirName: the step "step-000000000012" stands for, or
    None."""
    if not name.startswith(_STEP_DIR_PREFIX):
        return None
    digits = name[len(_STEP_DIR_PREFIX):]
    if len(digits) < _STEP_DIGITS or not digits.isascii() or not digits.isdigit():
        return None
    step = int(digits)
    if step > _INT64_MAX or f"{step:0{_STEP_DIGITS}d}" != digits:
        return None
    return step


def _read_fully(fd, size, offset, path):
    """`size` bytes of `fd` at `offset` (a bytearray); ValueError naming `path` when the file
    ends first."""
    data = bytearray(size)
    _read_into(fd, memoryview(data), offset, path)
    return data


def _read_into(fd, out, offset, path):
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


def _describe_file_type(mode):
    """checkpoint/directory.cc DescribeFileType."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a file of unknown type"


def _refused(path, mode, expected):
    """checkpoint/directory.cc RefusedEntry's words: "<path> is a symbolic link, where a
    regular file is expected: refused (checkpoint storage never follows links)"."""
    return (f"{path} is {_describe_file_type(mode)}, where {expected} is expected: refused" +
            (" (checkpoint storage never follows links)" if stat.S_ISLNK(mode) else ""))


def _lstat_mode(path, dir_fd=None):
    try:
        return os.lstat(path, dir_fd=dir_fd).st_mode
    except OSError:
        return None


def _open_step_dir(manifest_path):
    """(an fd of the step directory holding `manifest_path`, opened without following a link
    (the directories above it are the caller's, and may be links); the directory's path)."""
    step_dir = os.path.dirname(manifest_path) or "."
    try:
        return os.open(step_dir, _OPEN_FLAGS | os.O_DIRECTORY), step_dir
    except FileNotFoundError:
        raise ValueError(f"manifest: {manifest_path} does not exist (the checkpoint was pruned, "
                         "moved, or never committed)") from None
    except OSError as e:
        # O_DIRECTORY | O_NOFOLLOW on a link fails with ENOTDIR (Linux) or ELOOP.
        mode = _lstat_mode(step_dir)
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and mode is not None:
            raise ValueError(f"manifest: {manifest_path}: "
                             f"{_refused(step_dir, mode, 'a directory')}") from None
        raise ValueError(f"manifest: {manifest_path}: open directory {step_dir}: "
                         f"{e.strerror}") from None


def _open_file_at(dir_fd, name, path, where, missing):
    """(an fd of the regular file `name` in the directory `dir_fd`, opened without following a
    link, its size). Errors start with `where` and name `path`; `missing` is the whole message
    when the file does not exist."""
    try:
        fd = os.open(name, _OPEN_FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise ValueError(missing) from None
    except OSError as e:
        mode = _lstat_mode(name, dir_fd) if e.errno in (errno.ELOOP, errno.EISDIR) else None
        if mode is not None:
            raise ValueError(f"{where}{_refused(path, mode, 'a regular file')}") from None
        raise ValueError(f"{where}open {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{where}{_refused(path, st.st_mode, 'a regular file')}")
        return fd, st.st_size
    except BaseException:
        os.close(fd)
        raise


# ---- The manifest ----

def _validate_manifest(manifest):
    """checkpoint/manifest.cc ValidateManifest: the field at fault and why, or None. Paths are
    also refused with a backslash or a NUL."""
    if manifest.format_version != _MANIFEST_FORMAT_VERSION:
        return f"format_version: {manifest.format_version}, not {_MANIFEST_FORMAT_VERSION}"
    if not manifest.job_id:
        return "job_id: empty"
    if manifest.step < 0:
        return f"step: {manifest.step} < 0"
    if manifest.generation < 0:
        return f"generation: {manifest.generation} < 0"
    if not 1 <= manifest.world_size <= _MAX_NAMED_WORLD_SIZE:
        return f"world_size: {manifest.world_size} outside [1, {_MAX_NAMED_WORLD_SIZE}]"
    if len(manifest.files) != manifest.world_size:
        return f"files: {len(manifest.files)} files for world_size {manifest.world_size}"
    seen = set()
    for i, file in enumerate(manifest.files):
        where = f"files[{i}]"
        if not 0 <= file.rank < manifest.world_size:
            return f"{where}.rank: {file.rank} outside [0, {manifest.world_size})"
        if file.rank in seen:
            return f"{where}.rank: rank {file.rank} is listed twice"
        seen.add(file.rank)
        path = file.path
        if path in ("", ".", "..") or any(c in path for c in "/\\\0"):
            return f"{where}.path: {_quoted(path)} is not a file name"
        if file.bytes < _LENGTH_PREFIX_BYTES:
            return f"{where}.bytes: {file.bytes} is too small for a safetensors file"
    if not manifest.HasField("commit_time"):
        return "commit_time: unset"
    return None


def _read_manifest_at(dir_fd, step_dir, path, expected_job_id):
    """The validated manifest `path` (MANIFEST_FILE_NAME or another name in `step_dir`, whose fd
    is `dir_fd`)."""
    fd, size = _open_file_at(
        dir_fd, os.path.basename(path), path, "manifest: ",
        f"manifest: {path} does not exist (the checkpoint was pruned, moved, or never committed)")
    try:
        if size > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest: {path} holds {size} bytes, more than the "
                             f"{MAX_MANIFEST_BYTES} this reader accepts (refused unread)")
        chunks = []
        total = 0
        while total <= MAX_MANIFEST_BYTES:  # the size may change while it is read
            try:
                chunk = os.read(fd, min(MAX_MANIFEST_BYTES + 1 - total,
                                        max(size + 1 - total, 1 << 16)))
            except OSError as e:
                raise ValueError(f"manifest: {path}: read: {e.strerror}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_MANIFEST_BYTES:
            raise ValueError(f"manifest: {path} grew past the {MAX_MANIFEST_BYTES} bytes this "
                             "reader accepts while it was read (refused)")
    finally:
        os.close(fd)
    manifest = checkpoint_pb2.CheckpointManifest()
    try:
        json_format.Parse(b"".join(chunks).decode("utf-8"), manifest, ignore_unknown_fields=True)
    except (UnicodeDecodeError, json_format.ParseError, RecursionError) as e:
        raise ValueError(f"manifest: {path} is not a checkpoint manifest: {e}") from None
    if manifest.format_version > _MANIFEST_FORMAT_VERSION:
        raise ValueError(f"manifest: {path}: format_version {manifest.format_version} is newer "
                         f"than this reader's {_MANIFEST_FORMAT_VERSION}")
    invalid = _validate_manifest(manifest)
    if invalid is not None:
        raise ValueError(f"manifest: {path}: {invalid}")
    dir_step = _step_of_dir_name(os.path.basename(os.path.abspath(step_dir)))
    if dir_step is not None and dir_step != manifest.step:
        raise ValueError(f"manifest: {path}: step {manifest.step} in the directory of step "
                         f"{dir_step}")
    if expected_job_id is not None and manifest.job_id != expected_job_id:
        raise ValueError(f"manifest: {path}: job_id {_quoted(manifest.job_id)}, but the "
                         f"checkpoint of job {_quoted(expected_job_id)} was expected (a "
                         "checkpoint of another job is read only when the caller says so)")
    return manifest


def read_manifest(path, expected_job_id=None):
    """The CheckpointManifest of `path` (a manifest.json), validated as the C++ reader does.
    With `expected_job_id`, a manifest of another job is refused; None reads any job's (the
    caller names this source on purpose). ValueError naming the path and field when it is
    missing, a link, larger than MAX_MANIFEST_BYTES or invalid."""
    dir_fd, step_dir = _open_step_dir(path)
    try:
        return _read_manifest_at(dir_fd, step_dir, path, expected_job_id)
    finally:
        os.close(dir_fd)


# ---- safetensors ----

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


def _non_negative_integer(value, what):
    """checkpoint/safetensors_reader.cc NonNegativeInteger: an int in [0, 2^63)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64_MAX:
        shown = json.dumps(value) if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else _kind(value)
        raise _Corrupt(f"{what}: {shown} is not a non-negative 64-bit integer")
    return value


class _Corrupt(Exception):
    """A reason a safetensors header is refused, before the file's name is added."""


def _object_pairs(pairs):
    names = set()
    for name, value in pairs:
        if name in names:
            raise _Corrupt(f"header: duplicate name {_quoted(name)}")
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


class _SafetensorsTensor:
    __slots__ = ("name", "dtype", "shape", "data_begin", "data_end")


def _parse_tensor_entry(name, entry):
    """checkpoint/safetensors_reader.cc ParseTensorEntry."""
    where = f"tensor {_quoted(name)}"
    if not isinstance(entry, dict):
        raise _Corrupt(f"{where}: {_kind(entry)}, not an object")
    tensor = _SafetensorsTensor()
    tensor.name = name
    for field, value in entry.items():
        if field == "dtype":
            if not isinstance(value, str):
                raise _Corrupt(f"{where}: dtype is {_kind(value)}")
            if value not in _SAFETENSORS_DTYPE_SIZES:
                raise _Corrupt(f"{where}: unknown dtype {_quoted(value)}")
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
            raise _Corrupt(f"{where}: unknown field {_quoted(field)}")
    for field, attribute in (("dtype", "dtype"), ("shape", "shape"),
                             ("data_offsets", "data_begin")):
        if not hasattr(tensor, attribute):
            raise _Corrupt(f"{where}: no {field}")
    size = _SAFETENSORS_DTYPE_SIZES[tensor.dtype]
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


def _read_safetensors(fd, size, path):
    """checkpoint/safetensors_reader.cc SafetensorsReader::Open: ({tensor name: _SafetensorsTensor},
    {metadata key: value}, the data section's file offset). Reads nothing beyond the header,
    whose length is checked against the file's real `size` first."""
    def corrupt(what):
        return ValueError(f"safetensors file {path}: {what}")

    if size < _LENGTH_PREFIX_BYTES:
        raise corrupt(f"the file has {size} bytes, fewer than the 8-byte header length")
    (header_bytes,) = struct.unpack("<Q", _read_fully(fd, _LENGTH_PREFIX_BYTES, 0, path))
    if header_bytes > size - _LENGTH_PREFIX_BYTES:
        raise corrupt(f"the header length {header_bytes} reaches beyond the file ({size} "
                      "bytes): truncated or not safetensors")
    if header_bytes > _MAX_HEADER_BYTES:
        raise corrupt(f"the header length {header_bytes} exceeds the format's limit of "
                      f"{_MAX_HEADER_BYTES}")
    text = _read_fully(fd, header_bytes, _LENGTH_PREFIX_BYTES, path)
    data_start = _LENGTH_PREFIX_BYTES + header_bytes
    data_size = size - data_start
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
    metadata = {}
    tensors = []
    try:
        for key, value in header.items():
            if key == _METADATA_KEY:
                if not isinstance(value, dict):
                    raise _Corrupt(f"__metadata__ is {_kind(value)}, not an object")
                for name, text_value in value.items():
                    if not isinstance(text_value, str):
                        raise _Corrupt(f"__metadata__ {_quoted(name)} is {_kind(text_value)}, "
                                       "not a string")
                    metadata[name] = text_value
                continue
            tensors.append(_parse_tensor_entry(key, value))
    except _Corrupt as e:
        raise corrupt(str(e)) from None
    # The tensors must tile the data section: in offset order, each starts where the last ended.
    tensors.sort(key=lambda t: (t.data_begin, t.data_end))
    expected = 0
    previous = None
    for tensor in tensors:
        where = f"tensor {_quoted(tensor.name)} (data_offsets [{tensor.data_begin}, " \
                f"{tensor.data_end}])"
        if tensor.data_begin < expected:
            raise corrupt(f"{where} overlaps tensor {_quoted(previous.name)}, which ends at "
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
    return {t.name: t for t in tensors}, metadata, data_start


# ---- Shard files ----

def _validate_state_name(state):
    if not 1 <= len(state) <= 64:
        return f"state name {_quoted(state)} is not 1 to 64 characters"
    if any(not (c.isascii() and (c.isalnum() or c in "_.-")) for c in state):
        return f"state name {_quoted(state)} has a character outside [A-Za-z0-9_.-]"
    return None


def _validate_header(header):
    """checkpoint/shard_file.cc ValidateHeader: why `header` is invalid, or None."""
    if not header.job_id:
        return "header.job_id: empty"
    if header.step < 0:
        return f"header.step: {header.step} < 0"
    if header.generation < 0:
        return f"header.generation: {header.generation} < 0"
    if header.world_size < 1:
        return f"header.world_size: {header.world_size} < 1"
    if not 0 <= header.rank < header.world_size:
        return f"header.rank: {header.rank} outside [0, {header.world_size})"
    if header.optimizer_step < 0:
        return f"header.optimizer_step: {header.optimizer_step} < 0"
    scale = header.loss_scale
    if not (scale > 0 and scale != float("inf")):
        return f"header.loss_scale: {scale} is not finite and > 0"
    if header.loss_scale_good_steps < 0:
        return f"header.loss_scale_good_steps: {header.loss_scale_good_steps} < 0"
    if header.param_dtype not in _FRAGMENT_DTYPES:
        return f"header.param_dtype: {_dtype_name(header.param_dtype)} is not a tensor dtype"
    if not header.tensors:
        return "header.tensors: empty"
    names = set()
    for i, tensor in enumerate(header.tensors):
        if not tensor.name:
            return f"header.tensors[{i}].name: empty"
        if tensor.name in names:
            return f"header.tensors[{i}].name: duplicate {_quoted(tensor.name)}"
        names.add(tensor.name)
        for dim in tensor.shape:
            if dim < 0:
                return f"header.tensors[{i}] {_quoted(tensor.name)}: negative dimension {dim}"
    if header.tensor_steps and len(header.tensor_steps) != len(header.tensors):
        return (f"header.tensor_steps: {len(header.tensor_steps)} entries for "
                f"{len(header.tensors)} tensors")
    for i, step in enumerate(header.tensor_steps):
        if not 0 <= step <= header.optimizer_step:
            return (f"header.tensor_steps[{i}]: {step} outside [0, optimizer_step "
                    f"{header.optimizer_step}]")
    states = set()
    for i, state in enumerate(header.states):
        invalid = _validate_state_name(state)
        if invalid is not None:
            return f"header.states[{i}]: {invalid}"
        if state in states:
            return f"header.states[{i}]: duplicate {_quoted(state)}"
        states.add(state)
    return None


def _dtype_name(dtype):
    try:
        return types_pb2.DType.Name(dtype)
    except ValueError:
        return str(dtype)


def _elements(header):
    """{tensor name: element count} of a valid header; ValueError text when a count overflows
    int64 (checkpoint/shard_file.cc ValidateFragments)."""
    elements = {}
    for tensor in header.tensors:
        count = 1
        for dim in tensor.shape:
            count *= dim
            if count > _INT64_MAX:
                return None, f"header.tensors {_quoted(tensor.name)}: shape overflows int64"
        elements[tensor.name] = count
    return elements, None


def _validate_fragments(header, fragments):
    """checkpoint/shard_file.cc ValidateFragments: why the fragment table is invalid, or
    None."""
    elements, invalid = _elements(header)
    if invalid is not None:
        return invalid
    states = set(header.states)
    ranges = {}
    for i, f in enumerate(fragments):
        where = f"fragments[{i}] {_quoted(_key_of(f))}"
        if f.state not in states:
            return f"{where}: state {_quoted(f.state)} is not in header.states"
        if f.tensor not in elements:
            return f"{where}: tensor {_quoted(f.tensor)} is not in header.tensors"
        if f.begin < 0 or f.begin >= f.end or f.end > elements[f.tensor]:
            return (f"{where}: elements [{f.begin}, {f.end}) are not a non-empty part of "
                    f"[0, {elements[f.tensor]})")
        if f.dtype not in _FRAGMENT_DTYPES:
            return f"{where}: dtype {_dtype_name(f.dtype)} is not a tensor dtype"
        ranges.setdefault((f.state, f.tensor), []).append((f.begin, f.end, i))
    for (state, tensor), spans in ranges.items():
        spans.sort()
        for (begin0, end0, i0), (begin, end, i) in zip(spans, spans[1:]):
            if begin < end0:
                return (f"fragments[{i}] {_quoted(_fragment_key(state, tensor, begin, end))} "
                        f"overlaps fragments[{i0}] "
                        f"{_quoted(_fragment_key(state, tensor, begin0, end0))}")
    return None


class ShardFile:
    """One rank's shard file, open and checked as checkpoint/shard_file.cc ShardReader::Open
    does: its header, fragment table, and each fragment's place in the file."""

    def __init__(self, fd, size, path):
        """Checks the file `fd` (of `size` bytes, named `path` in errors); does not take `fd`
        over (the caller closes it)."""
        self.path = path
        self.fd = fd
        self.size = size
        tensors, metadata, data_start = _read_safetensors(fd, size, path)

        def corrupt(what):
            return ValueError(f"checkpoint file {path}: {what}")

        for key in (_HEADER_KEY, _FRAGMENTS_KEY):
            if key not in metadata:
                raise corrupt(f"__metadata__ has no {_quoted(key)}")
        self.header = checkpoint_pb2.ShardHeader()
        table = checkpoint_pb2.ShardFragmentTable()
        for key, message in ((_HEADER_KEY, self.header), (_FRAGMENTS_KEY, table)):
            try:
                json_format.Parse(metadata[key], message, ignore_unknown_fields=True)
            except (json_format.ParseError, RecursionError) as e:
                raise corrupt(f"{key}: {e}") from None
        if self.header.format_version != _SHARD_FORMAT_VERSION:
            raise corrupt(f"format_version {self.header.format_version} is not the version "
                          f"this reader knows ({_SHARD_FORMAT_VERSION})")
        invalid = _validate_header(self.header)
        if invalid is None:
            invalid = _validate_fragments(self.header, table.fragments)
        if invalid is not None:
            raise corrupt(invalid)
        self.fragments = list(table.fragments)
        # Per fragment: (file offset of its bytes, their count), checked against the file.
        self._places = []
        for fragment in self.fragments:
            key = _key_of(fragment)
            tensor = tensors.get(key)
            if tensor is None:
                raise corrupt(f"fragment {_quoted(key)} has no safetensors tensor")
            _, stored_as = _FRAGMENT_DTYPES[fragment.dtype]
            count = fragment.end - fragment.begin
            if tensor.dtype != stored_as or tensor.shape != [count]:
                shape = ",".join(map(str, tensor.shape))
                raise corrupt(f"fragment {_quoted(key)} ({_dtype_name(fragment.dtype)}, {count} "
                              f"elements) is stored as {tensor.dtype} [{shape}]")
            self._places.append((data_start + tensor.data_begin,
                                 tensor.data_end - tensor.data_begin))
        # Names are unique on both sides, so equal counts mean every tensor is a fragment.
        if len(tensors) != len(self.fragments):
            keys = {_key_of(f) for f in self.fragments}
            for name in tensors:
                if name not in keys:
                    raise corrupt(f"safetensors tensor {_quoted(name)} is in no fragment")

    def read_into(self, index, out):
        """Reads fragment `index`'s bytes into `out` (a writable buffer of exactly their
        size)."""
        offset, size = self._places[index]
        view = memoryview(out).cast("B")
        if len(view) != size:
            raise ValueError(f"checkpoint file {self.path}: fragment "
                             f"{_quoted(_key_of(self.fragments[index]))} is {size} bytes, not "
                             f"{len(view)}")
        _read_into(self.fd, view, offset, self.path)


# ---- A checkpoint: the manifest and its files, cross-checked ----

def _header_differences(a, b):
    """The names of the fields in which two ShardHeaders differ."""
    return [field.name for field in checkpoint_pb2.ShardHeader.DESCRIPTOR.fields
            if getattr(a, field.name) != getattr(b, field.name)]


class _Checkpoint:
    """An open checkpoint: the step directory's fd, the validated manifest, and the shard files
    (rank order, each cross-checked against the manifest and rank 0's header, as
    checkpoint/checkpoint_reader.cc CheckpointReader::Open does). Closes its fds on exit."""

    def __init__(self, manifest_path, expected_job_id, ranks=None):
        self.manifest_path = manifest_path
        self._fds = []
        self.files = []
        self._dir_fd, self.step_dir = _open_step_dir(manifest_path)
        try:
            self.manifest = _read_manifest_at(self._dir_fd, self.step_dir, manifest_path,
                                              expected_job_id)
            if self.manifest.HasField("superseded"):
                # checkpoint/manifest.cc ReadCommittedCheckpoint: a retired checkpoint is never
                # read, wherever its manifest is.
                why = self.manifest.superseded
                raise ValueError(f"manifest: {manifest_path} was superseded: job "
                                 f"{self.manifest.job_id} went back to step {why.loaded_step} "
                                 f"in generation {why.generation} ({why.reason})")
            for index, listed in sorted(enumerate(self.manifest.files),
                                        key=lambda item: item[1].rank):
                if ranks is not None and listed.rank not in ranks:
                    continue
                self.files.append(self._open_shard(index, listed))
        except BaseException:
            self.close()
            raise

    def _open_shard(self, index, listed):
        manifest = self.manifest
        path = os.path.join(self.step_dir, listed.path)
        fd, size = _open_file_at(
            self._dir_fd, listed.path, path,
            f"manifest: {self.manifest_path}: files[{index}].path: ",
            f"manifest: {path}, listed in {self.manifest_path}, does not exist")
        self._fds.append(fd)

        def mismatch(field, in_file, in_manifest):
            return ValueError(f"checkpoint file {path}: {field} {in_file}, but the manifest "
                              f"says {in_manifest}")

        if size != listed.bytes:
            raise mismatch("size", size, listed.bytes)
        shard = ShardFile(fd, size, path)
        header = shard.header
        for field in ("job_id", "step", "generation", "world_size", "layout_hash"):
            if getattr(header, field) != getattr(manifest, field):
                raise mismatch(field, getattr(header, field), getattr(manifest, field))
        if header.rank != listed.rank:
            raise mismatch("rank", header.rank, listed.rank)
        if self.files:
            as_rank0 = checkpoint_pb2.ShardHeader()
            as_rank0.CopyFrom(header)
            as_rank0.rank = 0
            if as_rank0 != self.files[0].header:
                differences = _header_differences(self.files[0].header, as_rank0)
                raise ValueError(f"checkpoint file {path}: header differs from rank 0's in "
                                 f"{', '.join(differences) or 'its unknown fields'}")
        return shard

    def check_coverage(self):
        """checkpoint/checkpoint_reader.cc FragmentIndex::Create and CheckComplete: the fragments
        of all files cover each (state, tensor) of rank 0's header exactly once: ValueError
        naming the tensor and the first overlap or gap otherwise."""
        entries = {}
        for shard in self.files:
            for index, fragment in enumerate(shard.fragments):
                entries.setdefault((fragment.state, fragment.tensor), []).append(
                    (fragment.begin, fragment.end, shard, index))

        def where(shard, fragment):
            return f"fragment {_quoted(_key_of(fragment))} of {shard.path}"

        for spans in entries.values():
            spans.sort(key=lambda span: span[0])
            for previous, entry in zip(spans, spans[1:]):
                a = previous[2].fragments[previous[3]]
                b = entry[2].fragments[entry[3]]
                if entry[0] < previous[1]:
                    raise ValueError(f"{where(entry[2], b)} overlaps {where(previous[2], a)}")
                if a.dtype != b.dtype:
                    raise ValueError(f"{where(entry[2], b)} is {_dtype_name(b.dtype)} but "
                                     f"{where(previous[2], a)} is {_dtype_name(a.dtype)}")
        header = self.files[0].header
        elements, _ = _elements(header)  # valid: ShardFile checked it
        for tensor in header.tensors:
            count = elements[tensor.name]
            if count == 0:
                continue
            for state in header.states:
                def missing(begin, end):
                    return ValueError(f"checkpoint {self.step_dir}: no fragment holds elements "
                                      f"[{begin}, {end}) of state {_quoted(state)} of tensor "
                                      f"{_quoted(tensor.name)}")

                covered = 0
                for begin, end, _, _ in entries.get((state, tensor.name), []):
                    if begin > covered:
                        raise missing(covered, begin)
                    covered = end
                if covered < count:
                    raise missing(covered, count)

    def close(self):
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_header(manifest_path, expected_job_id=None):
    """(the manifest, rank 0's shard header): what a checkpoint holds, without its data. The
    manifest and rank 0's file are checked as read_full_state checks them (the other files are
    the loading workers' to check). `expected_job_id`: as read_manifest."""
    with _Checkpoint(manifest_path, expected_job_id, ranks={0}) as checkpoint:
        return checkpoint.manifest, checkpoint.files[0].header


def read_full_state(manifest_path, expected_job_id=None):
    """Every array of a checkpoint, whole: (rank 0's shard header, {state: {tensor name: 1-D
    float32 tensor}}). ValueError naming the file and field when the manifest or a file is
    missing, a link, invalid, of another size than the manifest says or of another job than
    `expected_job_id` (None: any job), or when the fragments do not cover each tensor's
    elements exactly once. Memory is allocated only once all of that holds (so at most what the
    files hold)."""
    with _Checkpoint(manifest_path, expected_job_id) as checkpoint:
        checkpoint.check_coverage()
        header = checkpoint.files[0].header
        for shard in checkpoint.files:
            for fragment in shard.fragments:
                if fragment.dtype != types_pb2.FLOAT32:
                    raise ValueError(f"checkpoint file {shard.path}: fragment "
                                     f"{_quoted(_key_of(fragment))} is "
                                     f"{_dtype_name(fragment.dtype)}, not FLOAT32 (attached jobs "
                                     "are fp32)")
        elements, _ = _elements(header)
        full = {state: {name: torch.empty(count, dtype=torch.float32)
                        for name, count in elements.items()}
                for state in header.states}
        for shard in checkpoint.files:
            for index, fragment in enumerate(shard.fragments):
                target = full[fragment.state][fragment.tensor][fragment.begin:fragment.end]
                shard.read_into(index, target.numpy())
        return header, full


def write_full_state(path, arrays):
    """Writes `arrays` ({name: float32 tensor}) as a safetensors file of 1-D F32 tensors, the
    layout a worker's load_state reads (LoadState.full_state_file)."""
    tensors = {name: t.detach().to(torch.float32).reshape(-1).contiguous()
               for name, t in arrays.items()}
    header = {}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * 4
        header[name] = {"dtype": "F32", "shape": [tensor.numel()],
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            out.write(tensor.numpy().tobytes())
