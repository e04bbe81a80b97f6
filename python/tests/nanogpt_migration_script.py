"""A training loop written the way karpathy's nanoGPT `train.py` writes it, run twice among the same
ranks: as nanoGPT runs it (torch's DDP + torch.optim.AdamW over gloo) and as docs/pytorch.md
("Migrating a script") migrates it to zt.ShardedOptimizer, in zero2 and in ddp mode. Run by
`python3 -m zeroshard.launch --workers 2` (nanogpt_migration_test.py says what is checked).

What nanoGPT does, and this loop does too:
- per-rank seed: `torch.manual_seed(1337 + rank)` before the model is built, so every rank builds
  other initial weights; DDP broadcasts rank 0's at construction, and so must ZeroShard (issue 37
  row 1). Each rank draws its batches (`get_batch`) from that seed.
- gradient accumulation: GRAD_ACCUM micro-steps per step, each loss divided by GRAD_ACCUM; DDP
  syncs only on the last (`model.require_backward_grad_sync`), which migrates to `with
  optimizer.no_sync():` around the others (ddp mode reduces at the end of every backward outside
  it; zero2 reduces every micro-batch either way).
- nanoGPT's optimizer groups (tensors of 2 or more dimensions decay, the others do not), AdamW
  betas (0.9, 0.95), warm-up and cosine LR written into param_groups every iteration, a disabled
  GradScaler (float32: `enabled=False`, as nanoGPT on CPU) with `scaler.unscale_` before clipping
  at 1.0, `zero_grad(set_to_none=True)`.
- rank-0 checkpointing at CHECKPOINT_AT: nanoGPT's `if master_process: torch.save({"model":
  raw_model.state_dict(), "optimizer": optimizer.state_dict(), ...})`. Migrated as the docs say:
  `optimizer.state_dict()` is a collective, so every rank calls it and only rank 0 writes.
- compile: where torch has torch.compile (2.0 and later), the model is compiled as nanoGPT does,
  after the optimizer is built (and before DDP wraps it). Under torch 1.13 the loop runs eagerly.
  The migrated script reads `optimizer.start_step` before its first forward (docs/pytorch.md,
  "Faults"), which attaches: a model compiled after the optimizer does not attach at its first
  forward, and the first backward would refuse gradients computed on this rank's own seed's
  values.

The model is attach_models_script.py's GPT (nanoGPT's blocks, the head tied to the token
embedding, Linear layers without bias), small: 2 blocks, width 32, 2 heads, context 16, vocabulary
64.

Rank 0 prints one JSON line per ZeroShard mode with the losses of both runs and what they may
differ by, and one for the first attach (every rank's parameters after it, against rank 0's
initial ones); the script exits 1 when one fails.
"""

import argparse
import contextlib
import json
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import zeroshard.torch as zt

from attach_models_script import GPT, STREAM

VOCAB = 64
BLOCK_SIZE = 16
BATCH_SIZE = 2  # sequences per rank and micro-step
GRAD_ACCUM = 2
STEPS = 12
CHECKPOINT_AT = 6  # nanoGPT checkpoints at the top of an iteration (iter_num % eval_interval)
LEARNING_RATE, MIN_LR, WARMUP = 1e-3, 1e-4, 3
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
# As attach_models_test's AdamW checks: ZeroShard's losses are within max(FLOOR, FACTOR x the
# spread), the spread being how far torch's own runs of this loop are apart (one process over
# the global batch, W = 1, against DDP at this W), measured here.
FLOOR = 1e-6
FACTOR = 4.0
COMPILE = hasattr(torch, "compile")  # nanoGPT's compile=True, where torch has it


def build_model(seed):
    torch.manual_seed(seed)  # nanoGPT: torch.manual_seed(1337 + seed_offset)
    return GPT(VOCAB, BLOCK_SIZE, n_layer=2, n_head=2, n_embd=32, bias=False)


def configure_optimizer_groups(model):
    """nanoGPT's GPT.configure_optimizers: every tensor of 2 or more dimensions decays."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def get_lr(it):
    if it < WARMUP:
        return LEARNING_RATE * (it + 1) / (WARMUP + 1)
    ratio = (it - WARMUP) / (STEPS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LEARNING_RATE - MIN_LR)


class Batches:
    """nanoGPT's get_batch('train') for one rank: random windows drawn from the rank's seed."""

    def __init__(self, rank):
        self.generator = torch.Generator().manual_seed(1337 + rank)

    def __call__(self):
        ix = torch.randint(len(STREAM) - BLOCK_SIZE, (BATCH_SIZE,), generator=self.generator)
        x = torch.stack([STREAM[i:i + BLOCK_SIZE] for i in ix.tolist()])
        y = torch.stack([STREAM[i + 1:i + 1 + BLOCK_SIZE] for i in ix.tolist()])
        return x, y


def make_scaler():
    """nanoGPT's GradScaler, disabled for float32 (torch 2.x spells it torch.amp's)."""
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=False)
    return torch.cuda.amp.GradScaler(enabled=False)


def mean_over_ranks(values, world):
    if world == 1:
        return list(values)
    total = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(total)
    return (total / world).tolist()


def train(model, optimizer, batches_of_ranks, world, clip, checkpoint,
          micro_step_context=lambda last: contextlib.nullcontext()):
    """nanoGPT's loop; `batches_of_ranks`: the Batches whose micro-batches are concatenated (one
    rank's own, or every rank's for the W = 1 run); `micro_step_context(last)`: what a micro-step
    runs in (the gradient sync of the last one only). Returns each step's loss (the sum over
    micro-steps of loss / GRAD_ACCUM: this process's, the mean of its micro-batches)."""
    scaler = make_scaler()
    losses = []

    def get_batch():
        pairs = [batches() for batches in batches_of_ranks]
        return torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])

    X, Y = get_batch()
    for iter_num in range(STEPS):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num == CHECKPOINT_AT:
            checkpoint(iter_num)
        step_loss = 0.0
        for micro_step in range(GRAD_ACCUM):
            with micro_step_context(micro_step == GRAD_ACCUM - 1):
                _, loss = model(X, Y)
                loss = loss / GRAD_ACCUM
                X, Y = get_batch()  # nanoGPT prefetches the next batch before backward
                scaler.scale(loss).backward()
            step_loss += loss.item()
        scaler.unscale_(optimizer)
        clip()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
    return losses


def torch_ddp(rank, world, directory):
    """nanoGPT as it is: DDP (rank 0's weights broadcast) and torch.optim.AdamW; rank 0 saves."""
    model = build_model(1337 + rank)
    optimizer = torch.optim.AdamW(configure_optimizer_groups(model), lr=LEARNING_RATE,
                                  betas=(0.9, 0.95))
    ddp = DistributedDataParallel(torch.compile(model) if COMPILE else model)

    def sync(last):
        # nanoGPT: model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        ddp.require_backward_grad_sync = last
        return contextlib.nullcontext()

    def checkpoint(iter_num):
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num}, os.path.join(directory, "torch_ddp.pt"))

    losses = train(ddp, optimizer, [Batches(rank)], world,
                   lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP),
                   checkpoint, sync)
    return mean_over_ranks(losses, world)


def torch_single_process(world, directory):
    """The W = 1 run: rank 0's model over every rank's micro-batches, for the spread."""
    model = build_model(1337)
    optimizer = torch.optim.AdamW(configure_optimizer_groups(model), lr=LEARNING_RATE,
                                  betas=(0.9, 0.95))

    def checkpoint(iter_num):
        torch.save({"model": model.state_dict()}, os.path.join(directory, "torch_single.pt"))

    return train(model, optimizer, [Batches(r) for r in range(world)], 1,
                 lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP),
                 checkpoint)


def zeroshard(rank, world, mode, directory, seed, label):
    """The migrated script (docs/pytorch.md, "Migrating a script"): the same loop, no DDP
    wrapper, the ShardedOptimizer in place of AdamW; every rank calls state_dict(), rank 0
    writes the checkpoint."""
    model = build_model(seed)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=LEARNING_RATE, betas=(0.9, 0.95),
                                    mode=mode, param_groups=configure_optimizer_groups(model))
    # Reading start_step attaches: the parameters are then the job's initial ones.
    assert optimizer.start_step == 0
    attached = {name: p.detach().clone() for name, p in model.named_parameters()}
    raw_model = model
    if COMPILE:
        model = torch.compile(model)

    def checkpoint(iter_num):
        state = optimizer.state_dict(consolidated=True)  # collective: every rank calls it
        if rank == 0:
            torch.save({"model": raw_model.state_dict(), "optimizer": state,
                        "iter_num": iter_num},
                       os.path.join(directory, f"zeroshard_{label}.pt"))

    def no_sync_but_last(last):
        # The migrated require_backward_grad_sync: ddp mode (and zero1) reduce at the end of a
        # backward outside no_sync(); zero2 reduces every micro-batch either way.
        return contextlib.nullcontext() if last else optimizer.no_sync()

    losses = train(model, optimizer, [Batches(rank)], world,
                   lambda: optimizer.clip_grad_norm_(GRAD_CLIP), checkpoint, no_sync_but_last)
    zt.finish(optimizer)
    return mean_over_ranks(losses, world), initial, attached


def rank0_initial(initial, world):
    """Rank 0's initial parameters, on every rank."""
    if world == 1:
        return initial
    names = sorted(initial)
    flat = torch.cat([initial[name].reshape(-1) for name in names])
    dist.broadcast(flat, 0)
    out, offset = {}, 0
    for name in names:
        out[name] = flat[offset:offset + initial[name].numel()].view_as(initial[name])
        offset += initial[name].numel()
    return out


def relative_differences(losses, reference):
    return [abs(a - b) / abs(b) for a, b in zip(losses, reference)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, help="where rank 0 writes the checkpoints")
    args = parser.parse_args()
    zt.init()
    rank, world = zt.rank(), zt.world_size()
    dist.init_process_group("gloo")
    failures = []

    def report(line, ok):
        line["ok"] = bool(ok)
        if not ok:
            failures.append(line)
        if rank == 0:
            print(json.dumps(line), flush=True)

    ddp_losses = torch_ddp(rank, world, args.dir)
    single = torch_single_process(world, args.dir) if rank == 0 else None
    spread = max(relative_differences(single, ddp_losses)) if rank == 0 else None
    for mode in ("zero2", "ddp"):
        losses, initial, attached = zeroshard(rank, world, mode, args.dir, 1337 + rank, mode)
        expected = rank0_initial(initial, world)
        differing = sorted(name for name in attached
                           if not torch.equal(attached[name], expected[name]))
        by_rank = [None] * world
        dist.all_gather_object(by_rank, differing[:3])
        report({"check": "rank 0's initial parameters", "mode": mode,
                "differing_by_rank": by_rank}, not any(by_rank))
        if rank == 0:
            differences = relative_differences(losses, ddp_losses)
            allowed = max(FLOOR, FACTOR * spread)
            report({"check": "losses against DDP", "mode": mode, "zeroshard": losses,
                    "ddp": ddp_losses, "compiled": COMPILE, "worst": max(differences), "spread": spread,
                    "allowed": allowed}, max(differences) <= allowed)
        if mode == "zero2":
            # Bitwise: the per-rank seeds give the run in which every rank seeded rank 0's.
            same_seed, _, _ = zeroshard(rank, world, mode, args.dir, 1337, "same-seed")
            report({"check": "per-rank seeds equal rank 0's seed everywhere", "mode": mode,
                    "per_rank_seed": losses, "same_seed": same_seed}, same_seed == losses)
    if rank == 0:
        report_checkpoints(args.dir, report)
    dist.destroy_process_group()
    return 1 if failures else 0


def parameter_difference(model, reference):
    """The largest difference of a parameter, relative to the reference tensor's largest value."""
    return max(float((model[k] - v).abs().max()) / max(float(v.abs().max()), 1e-30)
               for k, v in reference.items() if v.is_floating_point())


def report_checkpoints(directory, report):
    """Rank 0's checkpoints load with plain torch; the migrated ones hold DDP's model (within
    max(FLOOR, FACTOR x torch's own W = 1 vs DDP spread), as the losses) and torch.optim's
    state layout."""
    ddp = torch.load(os.path.join(directory, "torch_ddp.pt"))
    single = torch.load(os.path.join(directory, "torch_single.pt"))
    allowed = max(FLOOR, FACTOR * parameter_difference(single["model"], ddp["model"]))
    for mode in ("zero2", "ddp"):
        ours = torch.load(os.path.join(directory, f"zeroshard_{mode}.pt"))
        fresh = build_model(0)
        fresh.load_state_dict(ours["model"], strict=True)
        worst = parameter_difference(ours["model"], ddp["model"])
        state_keys = sorted({key for s in ours["optimizer"]["state"].values() for key in s})
        ddp_keys = sorted({key for s in ddp["optimizer"]["state"].values() for key in s})
        report({"check": "rank 0's checkpoint", "mode": mode, "iter_num": ours["iter_num"],
                "worst_parameter": worst, "allowed": allowed, "state_keys": state_keys, "ddp_state_keys": ddp_keys,
                "states": len(ours["optimizer"]["state"])},
               ours["iter_num"] == ddp["iter_num"] and state_keys == ddp_keys
               and len(ours["optimizer"]["state"]) == len(ddp["optimizer"]["state"])
               and worst <= allowed)


if __name__ == "__main__":
    sys.exit(main())
