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
import os
import stat

import torch
from google.protobuf import json_format

from zeroshard import _safetensors
from zeroshard._proto.zeroshard.v1 import checkpoint_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2
from zeroshard._safetensors import INT64_MAX as _INT64_MAX
from zeroshard._safetensors import LENGTH_PREFIX_BYTES as _LENGTH_PREFIX_BYTES
from zeroshard._safetensors import quoted as _quoted

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
_HEADER_KEY = "zeroshard.checkpoint"
_FRAGMENTS_KEY = "zeroshard.fragments"
_STEP_DIR_PREFIX = "step-"
_STEP_DIGITS = 12
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


# Why a job's checkpoint may be gone or replaced under its name (docs/pytorch.md, "Saving and
# loading the optimizer state").
RETIREMENT_RULE = (
    "a load_state_dict takes the job back to the loaded state's step and retires (moves aside as "
    "superseded-step-<step>-<n>, never loadable again) the job's checkpoints after that step, "
    "and the one at it unless it is the checkpoint loaded (a torch-format or consolidated dict "
    "never is), so that running those steps again overwrites no committed checkpoint; to keep "
    "a checkpoint loadable, copy its step directory (any name) before such a load, or keep "
    "the consolidated dict")


def superseded_copies(manifest_path):
    """The superseded-step-<step>-<n> directories beside the step directory of `manifest_path`
    (its checkpoint retired under the rule above), oldest copy first; [] when none or the step
    directory is not named step-<step>."""
    step_dir = os.path.dirname(manifest_path)
    step = _step_of_dir_name(os.path.basename(step_dir))
    if step is None:
        return []
    prefix = f"superseded-{_STEP_DIR_PREFIX}{step:0{_STEP_DIGITS}d}-"
    try:
        names = os.listdir(os.path.dirname(step_dir) or ".")
    except OSError:
        return []
    copies = [name for name in names
              if name.startswith(prefix) and name[len(prefix):].isdigit()]
    return [os.path.join(os.path.dirname(step_dir), name)
            for name in sorted(copies, key=lambda name: int(name[len(prefix):]))]


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
        tensors, metadata, data_start = _safetensors.read_header(fd, size, path)

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
        _safetensors.read_into(self.fd, view, offset, self.path)


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

def write_full_state(path, arrays, deferred=(), produce=None):
    """Writes `arrays` ({name: float32 tensor}) as a safetensors file of 1-D F32 tensors, the
    layout a worker's load_state reads (LoadState.full_state_file), then `deferred` ([(name,
    elements)]) as `produce()` yields them (_safetensors.write_f32)."""
    _safetensors.write_f32(path, {name: t.detach().to(torch.float32).reshape(-1).contiguous()
                                  for name, t in arrays.items()},
                           deferred=[(name, [elements]) for name, elements in deferred],
                           produce=produce)
