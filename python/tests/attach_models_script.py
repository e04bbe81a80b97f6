"""Models written the way public examples write them, trained on real workers against torch: run
by `python3 -m zeroshard.launch --workers W` (attach_models_test.py says what is checked and why
the tolerances are what they are). Three small models (vocabulary 64, width 32, sequences of 16
tokens, a global batch of 6 sequences that W = 1, 2 and 3 divide), 12 steps each:

- `gpt`: a GPT as nanoGPT/minGPT write it: 12 pre-LayerNorm blocks, 2 heads, the output
  projection tied to the token embedding, Linear layers without bias (nanoGPT's bias=False),
  AdamW with minGPT's groups (Linear weights decayed; LayerNorm weights and biases and the
  embeddings at weight decay 0), nanoGPT's warm-up and cosine LR written into param_groups before
  every step, global-norm clipping at 1.0 (the constructor's clip_grad_norm); zero2.
- `lstm`: pytorch/examples' word_language_model RNNModel (2-layer LSTM, decoder tied to the
  encoder), its batchify/bptt data and a fresh hidden state every epoch of 4 chunks, SGD with the
  user's clipping: torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1) in ddp mode,
  opt.clip_grad_norm_(0.1) in zero2.
- `transformer`: word_language_model's TransformerModel (an nn.Transformer subclass with a causal
  mask, calling only self.encoder). The example names its output Linear `decoder`, which replaces
  nn.Transformer's decoder stack; here it is `lm_head`, so nn.Transformer's TransformerDecoder (2
  layers) stays in the model and is never called: its parameters never get a gradient, and AdamW
  (weight decay 0.01) must leave them untouched, as torch.optim does; zero2 and zero1.

Dropout is 0 so that torch's single-process run over the whole global batch (W = 1) computes the
same function as the ranks' runs: the two differ by summation order only (the spread the AdamW
checks allow).

--save DIR (W = 2), for each model: torch on one process over the global batch (rank 0), torch's
DDP + ZeroRedundancyOptimizer over gloo among the ranks (find_unused_parameters for the
transformer), and zt.ShardedOptimizer in each of the model's modes. Each ZeroShard run saves a
sharded state_dict() after SAVE_AT steps (rank 0 copies its checkpoint into DIR), trains to the
end, then loads that state dict and replays the last steps, which must give the same parameters
and losses to the bit. --resume DIR (another W): torch on one process, torch DDP + ZeRO at this W,
an uninterrupted ZeroShard run at this W, and a new job that loads the W = 2 state dict (other
initial values before the load) and trains from SAVE_AT to the end. --model NAME keeps only that
model's runs.

Every run records the parameters after every step and every step's loss (the mean over ranks);
Comparison says what each may differ by. Rank 0 prints one JSON line per (model, mode) with the
measured differences, the spreads, the allowed differences and "ok"; the script exits 1 when one
fails.
"""

import argparse
import json
import math
import os
import pickle
import shutil
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import zeroshard.torch as zt

VOCAB = 64
WIDTH = 32
SEQ = 16
GLOBAL_BATCH = 6  # sequences per step, whatever W (1, 2 and 3 divide it)
STEPS = 12
SAVE_AT = 8  # the sharded state dict is saved after this many steps (an LSTM epoch boundary)
EARLY_STEPS = 5  # AdamW's first steps, held to STRICT like SGD (Comparison says when)
STRICT = 1e-6
# AdamW otherwise: max(FLOOR, FACTOR x the tensor's spread between torch's own W = 1 and W runs).
FLOOR = 1e-6
FACTOR = 4.0
# A key bias is rounding noise in every run (see parameters()): two runs' noises differ by about
# their own size, so its spread counts as at least 1 (the check then says the sizes are alike).
KEY_BIAS_SPREAD_FLOOR = 1.0


# ---- Data: a token stream with structure (a fixed successor for each token, 25% noise) ----

def token_stream(length=4096):
    generator = torch.Generator().manual_seed(20240601)
    successor = torch.randint(VOCAB, (VOCAB,), generator=generator).tolist()
    noisy = (torch.rand(length, generator=generator) < 0.25).tolist()
    random_tokens = torch.randint(VOCAB, (length,), generator=generator).tolist()
    tokens = [0]
    for i in range(1, length):
        tokens.append(random_tokens[i] if noisy[i] else successor[tokens[-1]])
    return torch.tensor(tokens, dtype=torch.long)


STREAM = token_stream()


def torch_sqrt_is_correctly_rounded():
    """Whether this torch's CPU float sqrt rounds as IEEE 754 does (Debian's 1.13 does; the PyPI
    2.x wheels are off by an ulp for about 20% of inputs), as ZeroShard's kernels do."""
    x = torch.rand(4096, generator=torch.Generator().manual_seed(5)) * 1e-6
    return torch.equal(x.sqrt(), x.double().sqrt().float())


SQRT_CORRECTLY_ROUNDED = torch_sqrt_is_correctly_rounded()


def rank_slice(rank, world):
    per_rank = GLOBAL_BATCH // world
    return slice(rank * per_rank, (rank + 1) * per_rank)


def random_windows(step, rank, world):
    """(inputs, targets), each (sequences, SEQ): this rank's part of the step's global batch of
    GLOBAL_BATCH windows at random offsets of the stream (the same global batch for every W)."""
    generator = torch.Generator().manual_seed(7000 + step)
    offsets = torch.randint(len(STREAM) - SEQ - 1, (GLOBAL_BATCH,), generator=generator)
    offsets = offsets[rank_slice(rank, world)]
    x = torch.stack([STREAM[o:o + SEQ] for o in offsets.tolist()])
    y = torch.stack([STREAM[o + 1:o + 1 + SEQ] for o in offsets.tolist()])
    return x, y


# ---- GPT (nanoGPT / minGPT style) ----

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head = n_head
        self.n_embd = n_embd
        # torch >= 2.0 has the fused kernel; 1.13 takes the explicit mask.
        self.flash = hasattr(F, "scaled_dot_product_attention")
        if not self.flash:
            mask = torch.tril(torch.ones(block_size, block_size))
            self.register_buffer("bias", mask.view(1, 1, block_size, block_size))

    def forward(self, x):
        batch, time, channels = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        heads = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (t.view(*heads).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :time, :time] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(batch, time, channels)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, bias)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, bias=True):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size, bias) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        # Weight tying: one parameter, named transformer.wte.weight by named_parameters().
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        positions = torch.arange(idx.size(1), dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def optimizer_groups(self, weight_decay):
        """minGPT's configure_optimizers: Linear weights decay; biases, LayerNorm and Embedding
        weights do not (the tied lm_head.weight is the embedding's)."""
        decay, no_decay = set(), set()
        for module_name, module in self.named_modules():
            for name, _ in module.named_parameters(recurse=False):
                full_name = f"{module_name}.{name}" if module_name else name
                if name.endswith("bias"):
                    no_decay.add(full_name)
                elif name.endswith("weight") and isinstance(module, nn.Linear):
                    decay.add(full_name)
                elif name.endswith("weight") and isinstance(module, (nn.LayerNorm, nn.Embedding)):
                    no_decay.add(full_name)
        decay.discard("lm_head.weight")  # tied: transformer.wte.weight, no decay
        by_name = dict(self.named_parameters())
        assert not decay & no_decay and decay | no_decay == set(by_name), (decay, no_decay)
        return [{"params": [by_name[n] for n in sorted(decay)], "weight_decay": weight_decay},
                {"params": [by_name[n] for n in sorted(no_decay)], "weight_decay": 0.0}]


# ---- word_language_model's RNNModel and TransformerModel ----

class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        # The example's pe.unsqueeze(0).transpose(0, 1) holds the same values with a stride of
        # 5000 x d_model on its size-1 dimension, which torch 1.13's DDP buffer broadcast refuses
        # ("some elements ... refer to a single memory location").
        self.register_buffer("pe", pe.unsqueeze(1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Transformer):
    """word_language_model's TransformerModel, its output Linear named lm_head: nn.Transformer's
    decoder stack stays and is never called."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid,
                         num_encoder_layers=nlayers, num_decoder_layers=nlayers, dropout=dropout)
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.lm_head = nn.Linear(ninp, ntoken)
        self.init_weights()

    @staticmethod
    def _square_subsequent_mask(size):
        mask = (torch.triu(torch.ones(size, size)) == 1).transpose(0, 1)
        return mask.float().masked_fill(mask == 0, float("-inf")).masked_fill(mask == 1, 0.0)

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.lm_head.bias)
        nn.init.uniform_(self.lm_head.weight, -initrange, initrange)

    def forward(self, src):
        if self.src_mask is None or self.src_mask.size(0) != len(src):
            self.src_mask = self._square_subsequent_mask(len(src))
        src = self.pos_encoder(self.input_emb(src) * math.sqrt(self.ninp))
        output = self.encoder(src, mask=self.src_mask)
        return F.log_softmax(self.lm_head(output), dim=-1)


# ---- The three tasks: model, data, loss, optimizer, modes ----

class GPTTask:
    """The GPT, its data (random windows of the stream) and its training as nanoGPT/minGPT do
    it."""

    name = "gpt"
    kind = "adamw"
    torch_class = torch.optim.AdamW
    modes = ("zero2", "zero3")
    strict = False  # AdamW: STRICT for EARLY_STEPS, then the measured spread
    LR, MIN_LR, WARMUP = 1e-3, 1e-4, 3
    hyper = {"lr": LR, "betas": (0.9, 0.95)}
    CLIP = 1.0

    def build(self, seed=1):
        torch.manual_seed(seed)
        return GPT(VOCAB, SEQ, n_layer=12, n_head=2, n_embd=WIDTH, bias=False)

    def groups(self, model):
        return model.optimizer_groups(weight_decay=0.1)

    def lr(self, step):
        """nanoGPT's get_lr: linear warm-up, then cosine decay to MIN_LR."""
        if step < self.WARMUP:
            return self.LR * (step + 1) / self.WARMUP
        progress = (step - self.WARMUP) / (STEPS - self.WARMUP)
        return self.MIN_LR + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.LR - self.MIN_LR)

    def loss(self, forward, step, rank, world, state):
        x, y = random_windows(step, rank, world)
        _, loss = forward(x, y)
        return loss

    def zeroshard_options(self, mode):
        return {"clip_grad_norm": self.CLIP}  # as opt.clip_grad_norm_(1.0) every step

    def torch_clip(self, model):
        return torch.nn.utils.clip_grad_norm_(model.parameters(), self.CLIP)

    def zeroshard_clip(self, model, optimizer, mode):
        pass  # the constructor's clip_grad_norm: step() reports the norm


class LSTMTask:
    """The LSTM, its data (batchify's columns, bptt chunks) and its training as
    word_language_model's main.py does it (with torch.optim.SGD for its manual update)."""

    name = "lstm"
    kind = "sgd"
    torch_class = torch.optim.SGD
    modes = ("zero2", "ddp", "zero3")
    strict = True
    hyper = {"lr": 5.0}
    # The example clips at 0.25, which this small model's gradients (norm 0.13 to 0.2) never reach:
    # at 0.1 the clipping acts in every step.
    CLIP = 0.1
    EPOCH = 4  # bptt chunks per epoch (SAVE_AT is a multiple: the hidden state restarts there)

    def __init__(self):
        # batchify: the stream as GLOBAL_BATCH columns; rank r trains its own columns.
        rows = self.EPOCH * SEQ + 1
        self.data = STREAM[:rows * GLOBAL_BATCH].view(GLOBAL_BATCH, rows).t().contiguous()

    def build(self, seed=2):
        torch.manual_seed(seed)
        return RNNModel("LSTM", VOCAB, WIDTH, WIDTH, 2, dropout=0.0, tie_weights=True)

    def groups(self, model):
        return [{"params": list(model.parameters()), "weight_decay": 0.0}]

    def lr(self, step):
        return self.hyper["lr"]

    def loss(self, forward, step, rank, world, state):
        columns = rank_slice(rank, world)
        if step % self.EPOCH == 0 or "hidden" not in state:
            bsz = GLOBAL_BATCH // world
            state["hidden"] = (torch.zeros(2, bsz, WIDTH), torch.zeros(2, bsz, WIDTH))
        i = (step % self.EPOCH) * SEQ
        source = self.data[i:i + SEQ, columns]
        target = self.data[i + 1:i + 1 + SEQ, columns].reshape(-1)
        # repackage_hidden: the previous chunk's graph is not backpropagated into.
        hidden = tuple(h.detach() for h in state["hidden"])
        output, state["hidden"] = forward(source, hidden)
        return F.nll_loss(output, target)

    def zeroshard_options(self, mode):
        return {}

    def torch_clip(self, model):
        return torch.nn.utils.clip_grad_norm_(model.parameters(), self.CLIP)

    def zeroshard_clip(self, model, optimizer, mode):
        if mode == "ddp":
            # .grad holds the gradient averaged over the ranks, as after DDP's backward.
            return torch.nn.utils.clip_grad_norm_(model.parameters(), self.CLIP)
        return optimizer.clip_grad_norm_(self.CLIP)


class TransformerTask:
    """The nn.Transformer model, its data (random windows, sequence first) and AdamW."""

    name = "transformer"
    kind = "adamw"
    torch_class = torch.optim.AdamW
    modes = ("zero2", "zero1", "zero3")
    strict = False
    hyper = {"lr": 2e-3}
    CLIP = None

    def build(self, seed=3):
        torch.manual_seed(seed)
        return TransformerModel(VOCAB, WIDTH, nhead=2, nhid=64, nlayers=2, dropout=0.0)

    def groups(self, model):
        return [{"params": list(model.parameters()), "weight_decay": 0.01}]

    def lr(self, step):
        return self.hyper["lr"]

    def loss(self, forward, step, rank, world, state):
        x, y = random_windows(step, rank, world)
        output = forward(x.t().contiguous())  # (sequence, batch), as the example's batchify
        return F.nll_loss(output.view(-1, VOCAB), y.t().reshape(-1))

    def zeroshard_options(self, mode):
        return {}

    def torch_clip(self, model):
        pass

    def zeroshard_clip(self, model, optimizer, mode):
        pass


TASKS = [GPTTask(), LSTMTask(), TransformerTask()]


# ---- Training and comparing ----

def read_parameters(model, optimizer):
    """parameters(model), inside opt.full_parameters() for a ShardedOptimizer (zero3 keeps no
    values between uses; the other modes read them in place)."""
    if isinstance(optimizer, zt.ShardedOptimizer):
        with optimizer.full_parameters():
            return parameters(model)
    return parameters(model)


def parameters(model):
    """The parameters, copied, by name. nn.MultiheadAttention's in_proj_bias is split into its
    query and value part and its key part ("[key]"): adding one vector to every key adds the same
    number to every logit of a softmax row, so the key bias's gradient is mathematically zero
    and what backward computes for it is rounding noise, which Adam normalises into updates of
    its own (see attach_models_test.py)."""
    copies = {}
    for name, p in model.named_parameters():
        p = p.detach().clone()
        if name.endswith("in_proj_bias"):
            width = p.numel() // 3
            copies[name + "[query,value]"] = torch.cat([p[:width], p[2 * width:]])
            copies[name + "[key]"] = p[width:2 * width]
        else:
            copies[name] = p
    return copies


def relative_differences(got, expected):
    """Each tensor's largest difference, relative to the tensor's largest value."""
    return {name: (got[name] - reference).abs().max().item() /
            max(reference.abs().max().item(), 1e-12) for name, reference in expected.items()}


def global_losses(losses, world):
    """The mean over ranks of each step's loss (every rank's batch is the same size)."""
    if world == 1:
        return list(losses)
    total = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(total)
    return (total / world).tolist()


def train(task, model, forward, optimizer, clip, rank, world, first=0, last=STEPS,
          after_step=lambda step: None):
    """Steps first..last-1; returns the per-step local losses, the parameters after each step
    and the gradient norms that clipping saw."""
    losses, snapshots, norms = [], [], []
    state = {}
    for step in range(first, last):
        for group in optimizer.param_groups:
            group["lr"] = task.lr(step)
        loss = task.loss(forward, step, rank, world, state)
        loss.backward()
        norm = clip()
        optimizer.step()
        if norm is None and isinstance(optimizer, zt.ShardedOptimizer):
            norm = optimizer.last_step.grad_norm  # the constructor's clip_grad_norm
        optimizer.zero_grad()
        losses.append(loss.item())
        snapshots.append(read_parameters(model, optimizer))
        norms.append(None if norm is None else float(norm))
        after_step(step + 1)
    return losses, snapshots, norms


def torch_single_process(task):
    """torch on one process over the whole global batch: the W = 1 run."""
    model = task.build()
    optimizer = task.torch_class(task.groups(model), **task.hyper)
    losses, snapshots, _ = train(task, model, model, optimizer, lambda: task.torch_clip(model),
                                 0, 1)
    return {"losses": losses, "snapshots": snapshots,
            "state_indices": sorted(optimizer.state_dict()["state"])}


def torch_ddp_zero(task, rank, world):
    """torch's DDP + ZeroRedundancyOptimizer among the ranks (gloo)."""
    model = task.build()
    # The transformer's decoder has no gradient.
    ddp = DistributedDataParallel(model, find_unused_parameters=isinstance(task, TransformerTask))
    optimizer = ZeroRedundancyOptimizer(task.groups(model), optimizer_class=task.torch_class,
                                        **task.hyper)
    losses, snapshots, norms = train(task, model, ddp, optimizer, lambda: task.torch_clip(model),
                                     rank, world)
    return {"losses": global_losses(losses, world), "snapshots": snapshots, "norms": norms}


def sharded_optimizer(task, model, mode):
    return zt.ShardedOptimizer(model, task.kind, mode=mode, param_groups=task.groups(model),
                               **task.hyper, **task.zeroshard_options(mode))


def zeroshard_run(task, mode, rank, world, save_dir=None):
    """STEPS steps; with save_dir, a sharded state_dict() after SAVE_AT steps (rank 0 copies its
    checkpoint into save_dir), and at the end a load of it and a replay of the steps after it."""
    model = task.build()
    optimizer = sharded_optimizer(task, model, mode)
    saved = {}

    def after_step(step):
        if save_dir is not None and step == SAVE_AT:
            saved["state_dict"] = optimizer.state_dict()

    def clip():
        return task.zeroshard_clip(model, optimizer, mode)

    losses, snapshots, norms = train(task, model, model, optimizer, clip, rank, world,
                                     after_step=after_step)
    result = {"losses": global_losses(losses, world), "snapshots": snapshots, "norms": norms}
    if save_dir is not None:
        sharded = saved["state_dict"]
        if rank == 0:
            step_dir = os.path.dirname(sharded["manifest"])
            copy = os.path.join(save_dir, f"{task.name}-{mode}", os.path.basename(step_dir))
            shutil.copytree(step_dir, copy)
            with open(os.path.join(save_dir, f"{task.name}-{mode}.pickle"), "wb") as f:
                pickle.dump(dict(sharded, manifest=os.path.join(copy, "manifest.json")), f)
        optimizer.load_state_dict(sharded)
        result["restored"] = read_parameters(model, optimizer)
        replayed_losses, replayed, _ = train(task, model, model, optimizer, clip, rank, world,
                                             first=SAVE_AT)
        result["replayed_losses"] = global_losses(replayed_losses, world)
        result["replayed"] = replayed
    if isinstance(task, TransformerTask):
        result["state_indices"] = sorted(optimizer.state_dict(consolidated=True)["state"])
    zt.finish(optimizer)
    return result


def zeroshard_resumed(task, mode, rank, world, save_dir):
    """A new job at this W, built with other initial values, loads the W = 2 state dict and
    trains from SAVE_AT to the end."""
    with open(os.path.join(save_dir, f"{task.name}-{mode}.pickle"), "rb") as f:
        sharded = pickle.load(f)
    model = task.build(seed=99)
    optimizer = sharded_optimizer(task, model, mode)
    optimizer.load_state_dict(sharded)
    losses, snapshots, _ = train(task, model, model, optimizer,
                                 lambda: task.zeroshard_clip(model, optimizer, mode), rank, world,
                                 first=SAVE_AT)
    zt.finish(optimizer)
    return {"losses": global_losses(losses, world), "snapshots": snapshots,
            "saved_world_size": sharded["world_size"], "saved_step": sharded["step"]}


def untouched(task, *snapshot_lists):
    """The transformer's never-called decoder: bitwise its initial values after every step."""
    initial = parameters(task.build())
    names = [name for name in initial if name.startswith("decoder.")]
    return all(torch.equal(snapshot[name], initial[name])
               for snapshots in snapshot_lists for snapshot in snapshots for name in names)


def is_key_bias(name):
    return name is not None and name.endswith("[key]")


class Comparison:
    """Runs compared step by step against a reference, each tensor (and loss) within its
    allowed difference: STRICT for SGD, and with early_strict for AdamW's first EARLY_STEPS
    steps (key biases aside); otherwise max(FLOOR, FACTOR x the spread), the spread being the
    largest difference over all steps and tensors between torch's W = 1 run and torch's run at
    this W: over every tensor but the key biases for those, over the steps' losses for a loss,
    and over the key biases (at least KEY_BIAS_SPREAD_FLOOR) for a key bias. The figures
    reported as worst_relative and per_step_relative leave the key biases out (they are
    key_bias_worst_relative)."""

    def __init__(self, task, single, reference, early_strict=True):
        self.task = task
        self.early_strict = early_strict
        self.spread = {}  # is_key_bias -> (spread, tensor, step)
        self.step_spread = []
        for step, (a, b) in enumerate(zip(reference["snapshots"], single["snapshots"]), 1):
            differences = relative_differences(a, b)
            self.step_spread.append(max(differences.values()))
            for name, difference in differences.items():
                if difference >= self.spread.get(is_key_bias(name), (0.0,))[0]:
                    self.spread[is_key_bias(name)] = (difference, name, step)
        self.loss_spread = max(abs(a - b) / abs(b)
                               for a, b in zip(reference["losses"], single["losses"]))

    def allowed(self, name, step):
        """For `name` after `step` steps (a loss: name None, computed after `step` steps)."""
        if self.task.strict or (self.early_strict and step <= EARLY_STEPS and
                                not is_key_bias(name)):
            return STRICT
        if name is None:
            spread = self.loss_spread
        elif is_key_bias(name):
            spread = max(KEY_BIAS_SPREAD_FLOOR, self.spread[True][0])
        else:
            spread = self.spread[False][0]
        return max(FLOOR, FACTOR * spread)

    def compare(self, got, expected, first_step=0):
        """got/expected: {"snapshots", "losses"} from step first_step on. The worst difference
        relative to its allowed one, with what it was, and per-step figures."""
        worst = {"ratio": 0.0}
        per_step, early, keys = [], 0.0, 0.0
        for index, (mine, theirs) in enumerate(zip(got["snapshots"], expected["snapshots"])):
            step = first_step + index + 1
            differences = relative_differences(mine, theirs)
            per_step.append(max(d for name, d in differences.items() if not is_key_bias(name)))
            for name, difference in differences.items():
                if is_key_bias(name):
                    keys = max(keys, difference)
                elif step <= EARLY_STEPS:
                    early = max(early, difference)
                ratio = difference / self.allowed(name, step)
                if ratio > worst["ratio"]:
                    worst = {"ratio": ratio, "tensor": name, "step": step,
                             "relative": difference, "allowed": self.allowed(name, step)}
        losses = [abs(a - b) / abs(b) for a, b in zip(got["losses"], expected["losses"])]
        worst_loss = {"ratio": 0.0}
        for index, difference in enumerate(losses):
            step = first_step + index
            ratio = difference / self.allowed(None, step)
            if ratio > worst_loss["ratio"]:
                worst_loss = {"ratio": ratio, "step": step, "relative": difference,
                              "allowed": self.allowed(None, step)}
        result = {"worst_relative": max(per_step), "final_relative": per_step[-1],
                  "worst_loss_relative": max(losses), "worst_vs_allowed": worst,
                  "worst_loss_vs_allowed": worst_loss, "per_step_relative": rounded(per_step)}
        if first_step < EARLY_STEPS:
            result["early_worst_relative"] = early  # steps 1..EARLY_STEPS, key biases aside
        if True in self.spread:
            result["key_bias_worst_relative"] = keys
        ok = worst["ratio"] <= 1.0 and worst_loss["ratio"] <= 1.0
        return result, ok

    def spreads(self, world):
        spread, tensor, step = self.spread[False]
        figures = {f"torch_w1_vs_w{world}_spread": spread,
                   f"torch_w1_vs_w{world}_spread_at": f"{tensor} after step {step}",
                   f"torch_w1_vs_w{world}_loss_spread": self.loss_spread,
                   f"torch_w1_vs_w{world}_per_step_spread": rounded(self.step_spread)}
        if True in self.spread:
            figures[f"torch_w1_vs_w{world}_key_bias_spread"] = self.spread[True][0]
        return figures


def rounded(values):
    return [float(f"{v:.2g}") for v in values]


def check_world_size_two(task, rank, world, save_dir, report):
    single = torch_single_process(task) if rank == 0 else None
    reference = torch_ddp_zero(task, rank, world)
    for mode in task.modes:
        got = zeroshard_run(task, mode, rank, world, save_dir)
        if rank != 0:
            continue
        comparison = Comparison(task, single, reference, early_strict=SQRT_CORRECTLY_ROUNDED)
        result, ok = comparison.compare(got, reference)
        final = got["snapshots"][-1]
        bitwise_replay = (
            all(torch.equal(got["restored"][n], got["snapshots"][SAVE_AT - 1][n]) for n in final)
            and all(torch.equal(a[n], b[n]) for a, b in zip(got["replayed"],
                                                            got["snapshots"][SAVE_AT:])
                    for n in final)
            and got["replayed_losses"] == got["losses"][SAVE_AT:])
        line = {"check": "against_torch", "model": task.name, "mode": mode, "world_size": world,
                "optimizer": task.kind, "steps": STEPS, "torch": torch.__version__,
                "torch_sqrt_correctly_rounded": SQRT_CORRECTLY_ROUNDED,
                "parameters": sum(p.numel() for p in final.values()),
                **result, **comparison.spreads(world),
                "bitwise_replay_from_step": SAVE_AT, "bitwise_replay": bitwise_replay,
                "losses": rounded(reference["losses"])}
        ok = ok and bitwise_replay
        if task.CLIP is not None:
            # The clipping path matters only where it acts: the norms exceed CLIP in every step.
            line["clip"] = task.CLIP
            line["grad_norms"] = rounded(got["norms"])
            line["torch_grad_norms"] = rounded(reference["norms"])
            line["clipped_in_every_step"] = min(got["norms"] + reference["norms"]) > task.CLIP
            ok = ok and line["clipped_in_every_step"]
        if isinstance(task, TransformerTask):
            line["unused_tensors"] = len([n for n, _ in task.build().named_parameters()
                                          if n.startswith("decoder.")])
            line["unused_untouched"] = untouched(task, got["snapshots"], reference["snapshots"],
                                                 single["snapshots"], got["replayed"])
            # torch.optim holds no state for a parameter it never updated; neither do we.
            line["state_indices_like_torch"] = got["state_indices"] == single["state_indices"]
            ok = ok and line["unused_untouched"] and line["state_indices_like_torch"]
        report(line, ok)


def check_resumed(task, rank, world, save_dir, report):
    single = torch_single_process(task) if rank == 0 else None
    reference = torch_ddp_zero(task, rank, world)
    for mode in task.modes:
        uninterrupted = zeroshard_run(task, mode, rank, world)
        resumed = zeroshard_resumed(task, mode, rank, world, save_dir)
        if rank != 0:
            continue
        # Three ranks' gradients are summed in another order by ZeroShard's ring than by gloo
        # (two are not: a + b == b + a), so at this W AdamW's first steps differ from torch's
        # as torch's own W = 1 and W = 3 runs do: held to the spread, not to STRICT.
        comparison = Comparison(task, single, reference,
                                early_strict=world == 2 and SQRT_CORRECTLY_ROUNDED)
        tail = {"snapshots": uninterrupted["snapshots"][SAVE_AT:],
                "losses": uninterrupted["losses"][SAVE_AT:]}
        result, ok = comparison.compare(resumed, tail, first_step=SAVE_AT)
        against_torch, torch_ok = comparison.compare(uninterrupted, reference)
        line = {"check": "resumed_at_other_world_size", "model": task.name, "mode": mode,
                "world_size": world, "torch": torch.__version__,
                "saved_world_size": resumed["saved_world_size"],
                "saved_step": resumed["saved_step"], "steps": STEPS, **result,
                "uninterrupted_vs_torch": against_torch, **comparison.spreads(world)}
        ok = (ok and torch_ok and resumed["saved_step"] == SAVE_AT and
              resumed["saved_world_size"] != world)
        if isinstance(task, TransformerTask):
            line["unused_untouched"] = untouched(task, resumed["snapshots"],
                                                 uninterrupted["snapshots"])
            ok = ok and line["unused_untouched"]
        report(line, ok)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", default=None,
                        help="W = 2: copy each run's state dict checkpoint into this directory")
    parser.add_argument("--resume", default=None, help="another W: load them from here")
    parser.add_argument("--model", action="append", default=None,
                        help="only this model (repeatable)")
    args = parser.parse_args()
    if (args.save is None) == (args.resume is None):
        parser.error("one of --save DIR and --resume DIR")
    zt.init()
    rank, world = zt.rank(), zt.world_size()
    dist.init_process_group("gloo")
    failures = []

    def report(line, ok):
        line["ok"] = bool(ok)
        failures.extend([] if ok else [line])
        print(json.dumps(line), flush=True)

    for task in TASKS:
        if args.model and task.name not in args.model:
            continue
        if args.resume:
            check_resumed(task, rank, world, args.resume, report)
        else:
            check_world_size_two(task, rank, world, args.save, report)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
