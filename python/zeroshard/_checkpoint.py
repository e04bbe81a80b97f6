"""Reading ZeroShard's sharded checkpoints (checkpoint/manifest.h, checkpoint/shard_file.h) and
writing the full state files that a worker restores from, in pure Python with torch.

Internal to zeroshard.torch (state_dict(consolidated=True), load_state_dict). A checkpoint is a
step directory holding manifest.json and one safetensors file per rank; each file's tensors are
1-D fragments named "<state>/<tensor>/<begin>-<end>" and its "__metadata__" holds the shard
header and the fragment table as protobuf JSON. Checksums are not verified here (the workers
verify every fragment they load); sizes and coverage are.
"""

import json
import os
import struct

import torch
from google.protobuf import json_format

from zeroshard._proto.zeroshard.v1 import checkpoint_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2

MANIFEST_FILE_NAME = "manifest.json"
_HEADER_KEY = "zeroshard.checkpoint"
_FRAGMENTS_KEY = "zeroshard.fragments"
# The official safetensors reader refuses longer headers.
_MAX_HEADER_BYTES = 100_000_000


def _read_safetensors_header(path):
    """(the JSON header as a dict, the data section's file offset)."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (header of {length} bytes)")
        text = f.read(length)
    try:
        header = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: its safetensors header is not JSON: {e}") from None
    return header, 8 + length


def read_manifest(path):
    """The CheckpointManifest of `path` (a manifest.json). ValueError naming the path when it is
    missing or unreadable."""
    if not os.path.isfile(path):
        raise ValueError(f"manifest: {path} does not exist (the checkpoint was pruned, moved, or "
                         "never committed)")
    manifest = checkpoint_pb2.CheckpointManifest()
    try:
        with open(path, encoding="utf-8") as f:
            json_format.Parse(f.read(), manifest, ignore_unknown_fields=True)
    except (OSError, json_format.ParseError) as e:
        raise ValueError(f"manifest: {path} is not a checkpoint manifest: {e}") from None
    return manifest


class ShardFile:
    """One rank's shard file: its header, fragment table and data offsets."""

    def __init__(self, path):
        self.path = path
        header, self._data_start = _read_safetensors_header(path)
        metadata = header.get("__metadata__", {})
        if _HEADER_KEY not in metadata or _FRAGMENTS_KEY not in metadata:
            raise ValueError(f"{path}: not a ZeroShard shard file (no {_HEADER_KEY} metadata)")
        self.header = checkpoint_pb2.ShardHeader()
        table = checkpoint_pb2.ShardFragmentTable()
        try:
            json_format.Parse(metadata[_HEADER_KEY], self.header, ignore_unknown_fields=True)
            json_format.Parse(metadata[_FRAGMENTS_KEY], table, ignore_unknown_fields=True)
        except json_format.ParseError as e:
            raise ValueError(f"{path}: unreadable shard metadata: {e}") from None
        self.fragments = list(table.fragments)
        self._offsets = {}
        for fragment in self.fragments:
            key = f"{fragment.state}/{fragment.tensor}/{fragment.begin}-{fragment.end}"
            entry = header.get(key)
            if entry is None:
                raise ValueError(f"{path}: fragment {key} has no tensor")
            begin, end = entry["data_offsets"]
            if fragment.dtype != types_pb2.FLOAT32 or entry["dtype"] != "F32":
                raise ValueError(f"{path}: fragment {key} is not FLOAT32 (attached jobs are fp32)")
            if end - begin != 4 * (fragment.end - fragment.begin):
                raise ValueError(f"{path}: fragment {key} holds {end - begin} bytes, "
                                 f"{4 * (fragment.end - fragment.begin)} expected")
            self._offsets[id(fragment)] = (self._data_start + begin, end - begin)

    def read(self, fragment, f):
        """The fragment's values as a 1-D float32 tensor, read from the open file `f`."""
        offset, size = self._offsets[id(fragment)]
        f.seek(offset)
        data = bytearray(f.read(size))
        if len(data) != size:
            raise ValueError(f"{self.path}: truncated at fragment {fragment.state}/"
                             f"{fragment.tensor}")
        return torch.frombuffer(data, dtype=torch.float32) if size else torch.zeros(0)


def read_header(manifest_path):
    """(the manifest, rank 0's shard header): what a checkpoint holds, without its data."""
    manifest = read_manifest(manifest_path)
    step_dir = os.path.dirname(manifest_path)
    if not manifest.files:
        raise ValueError(f"manifest: {manifest_path} lists no files")
    first = min(manifest.files, key=lambda f: f.rank)
    path = os.path.join(step_dir, first.path)
    if not os.path.isfile(path):
        raise ValueError(f"manifest: {path}, listed in {manifest_path}, does not exist")
    return manifest, ShardFile(path).header


def read_full_state(manifest_path):
    """Every array of a checkpoint, whole: (rank 0's shard header, {state: {tensor name: 1-D
    float32 tensor}}). ValueError naming the file when a file is missing or has another size
    than the manifest says, or when the fragments leave a tensor's elements uncovered."""
    manifest = read_manifest(manifest_path)
    step_dir = os.path.dirname(manifest_path)
    header = None
    full = {}
    covered = {}
    for listed in sorted(manifest.files, key=lambda f: f.rank):
        path = os.path.join(step_dir, listed.path)
        if not os.path.isfile(path):
            raise ValueError(f"manifest: {path}, listed in {manifest_path}, does not exist")
        if os.path.getsize(path) != listed.bytes:
            raise ValueError(f"{path}: {os.path.getsize(path)} bytes, the manifest says "
                             f"{listed.bytes}")
        shard = ShardFile(path)
        if header is None:
            header = shard.header
            elements = {}
            for tensor in header.tensors:
                count = 1
                for dim in tensor.shape:
                    count *= dim
                elements[tensor.name] = count
            for state in header.states:
                full[state] = {name: torch.zeros(n) for name, n in elements.items()}
                covered[state] = {name: 0 for name in elements}
        with open(path, "rb") as f:
            for fragment in shard.fragments:
                arrays = full.get(fragment.state)
                if arrays is None or fragment.tensor not in arrays:
                    raise ValueError(f"{path}: fragment {fragment.state}/{fragment.tensor} is "
                                     "not in rank 0's header")
                arrays[fragment.tensor][fragment.begin:fragment.end] = shard.read(fragment, f)
                covered[fragment.state][fragment.tensor] += fragment.end - fragment.begin
    for state, counts in covered.items():
        for name, count in counts.items():
            # Ranks may save overlapping ranges (ddp); fewer elements than the tensor's is a gap.
            if count < full[state][name].numel():
                raise ValueError(f"checkpoint {manifest_path}: {state}/{name} is not covered by "
                                 "its files")
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
