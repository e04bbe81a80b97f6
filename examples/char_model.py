"""The character-level GPT of examples/torch_char_transformer.py (training on ZeroShard) and
examples/torch_char_sample.py (sampling with plain torch): the model, its sizes, the text's
vocabulary and a safetensors reader. Plain torch only, torch 1.13 or newer.
"""

import json
import math
import os
import struct

import torch
import torch.nn.functional as F

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                            "kjv_genesis_exodus.txt")

# the example's model, and a reduced one for CI (the same code, fewer and narrower layers).
FULL_CONFIG = {"layers": 2, "d_model": 128, "heads": 4, "context": 64}
SMALL_CONFIG = {"layers": 2, "d_model": 48, "heads": 2, "context": 32}


class Vocabulary:
    """Every distinct character of a text, sorted: a character's id is its rank."""

    def __init__(self, characters):
        self.characters = "".join(characters)
        self._ids = {c: i for i, c in enumerate(self.characters)}
        if len(self._ids) != len(self.characters):
            raise ValueError("vocabulary: a character appears twice")

    @classmethod
    def of_text(cls, text):
        return cls(sorted(set(text)))

    def __len__(self):
        return len(self.characters)

    def encode(self, text):
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"characters {unknown!r} are not in the vocabulary")
        return torch.tensor([self._ids[c] for c in text], dtype=torch.long)

    def decode(self, ids):
        return "".join(self.characters[i] for i in ids)


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, d_model, heads, context):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        # Not persistent: the saved file holds parameters only.
        self.register_buffer("mask", torch.ones(context, context).tril().bool(), persistent=False)

    def forward(self, x):
        batch, length, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=2)
        shape = (batch, length, self.heads, d_model // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~self.mask[:length, :length], float("-inf"))
            y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, length, d_model))


class Block(torch.nn.Module):
    """Pre-LN: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model, heads, context):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, context)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(torch.nn.Module):
    """A GPT-style character model: learned token and position embeddings, pre-LN blocks, a
    final LayerNorm and an output layer of its own (no weight tying: ZeroShard's attached
    trainers do not support a parameter used twice in one backward). Parameters are registered
    in the order forward uses them, so that their gradients arrive in the reverse order, the
    order the workers' buckets expect."""

    def __init__(self, vocab_size, layers, d_model, heads, context):
        super().__init__()
        self.context = context
        self.token_embedding = torch.nn.Embedding(vocab_size, d_model)
        self.position_embedding = torch.nn.Embedding(context, d_model)
        self.blocks = torch.nn.ModuleList(
            Block(d_model, heads, context) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.head = torch.nn.Linear(d_model, vocab_size)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, ids):
        length = ids.shape[1]
        if length > self.context:
            raise ValueError(f"sequence length {length} exceeds the context {self.context}")
        positions = torch.arange(length, device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def loss(self, ids, targets):
        logits = self(ids)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def config_path(model_path):
    """The sizes and vocabulary saved beside a model file (model.safetensors: model.json)."""
    return os.path.splitext(model_path)[0] + ".json"


def write_config(model_path, config, vocabulary):
    path = config_path(model_path)
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(dict(config, vocabulary=vocabulary.characters), f, indent=1)
    os.replace(temporary, path)


def read_config(model_path):
    """(sizes, Vocabulary) from the file write_config wrote."""
    with open(config_path(model_path), encoding="utf-8") as f:
        config = json.load(f)
    vocabulary = Vocabulary(config.pop("vocabulary"))
    return config, vocabulary


_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}


def load_safetensors(path):
    """{name: tensor} from a safetensors file (an 8-byte little-endian header length, a JSON
    header of dtype, shape and data_offsets per tensor, then the data), without the safetensors
    package."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_length,) = struct.unpack("<Q", data[:8])
    if 8 + header_length > len(data):
        raise ValueError(f"{path}: header length {header_length} exceeds the file")
    header = json.loads(data[8:8 + header_length].decode("utf-8"))
    body = memoryview(data)[8 + header_length:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name}: dtype {entry['dtype']} is not supported")
        begin, end = entry["data_offsets"]
        shape = entry["shape"]
        count = math.prod(shape)
        element_size = torch.empty(0, dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(body) or end - begin != count * element_size:
            raise ValueError(f"{path}: tensor {name}: data_offsets {[begin, end]} do not fit "
                             f"shape {shape} of {entry['dtype']}")
        # bytearray: a writable copy, so the tensor owns its memory.
        flat = (torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if count
                else torch.empty(0, dtype=dtype))
        tensors[name] = flat.reshape(shape)
    return tensors
