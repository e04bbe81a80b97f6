"""A small GPT-style character model (2 layers, d_model 128, 4 heads, context 64) trained on the
King James Genesis and Exodus (examples/data/) with zt.ShardedOptimizer: AdamW in zero2, a
warm-up then cosine LR schedule, weight decay on matrices only, global-norm clipping. Each rank
samples its own batches. Rank 0 prints the loss, saves the model as safetensors (plus its sizes
and vocabulary beside it, for examples/torch_char_sample.py) and ends with one JSON line.

    zeroshard-launch --workers 2 --bin_dir "$(bazel info -c opt bazel-bin)" \\
        examples/torch_char_transformer.py --steps 300 --out /tmp/char.safetensors
    python3 examples/torch_char_sample.py /tmp/char.safetensors --length 300

(the zeroshard package installed with pip: docs/pytorch.md, "Install").

--small trains a reduced model for fewer steps (CI: //python:char_transformer_test).
--checkpoint_every N --max_attempts K survive a dead trainer: the launcher restarts the script,
which resumes at optimizer.start_step (the latest checkpoint's), with its batches and LR schedule
advanced to it; the loss statistics then cover the steps since the resume.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings

import torch

import zeroshard.torch as zt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import char_model  # noqa: E402  (beside this script)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps (default 300, or 200 with --small)")
    parser.add_argument("--out", default="char_transformer.safetensors",
                        help="where rank 0 saves the model (its .json beside it)")
    parser.add_argument("--small", action="store_true",
                        help=f"the reduced model for CI: {char_model.SMALL_CONFIG}")
    parser.add_argument("--data", default=char_model.DEFAULT_DATA, help="the training text")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per rank per step (default 32, or 16 with --small)")
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="peak learning rate, reached after the warm-up")
    parser.add_argument("--min_lr", type=float, default=3e-4,
                        help="the learning rate the cosine decays to at the last step")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up steps (default: a tenth of --steps)")
    parser.add_argument("--log_every", type=int, default=10, help="print the loss every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: the cores divided by the ranks)")
    parser.add_argument("--checkpoint_every", type=int, default=0,
                        help="the workers checkpoint every N steps (0: never)")
    parser.add_argument("--max_attempts", type=int, default=1,
                        help="generations the job may start (>1: restarted trainers resume)")
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 200 if args.small else 300
    if args.batch is None:
        args.batch = 16 if args.small else 32
    if args.warmup is None:
        args.warmup = max(1, args.steps // 10)
    if args.steps < 1 or args.batch < 1 or args.log_every < 1:
        parser.error("--steps, --batch and --log_every must be >= 1")
    if not 0 < args.min_lr <= args.lr:
        parser.error("need 0 < --min_lr <= --lr")
    return args


def lr_factor(step, args):
    """Linear warm-up to 1, then a cosine from 1 down to min_lr / lr at the last step."""
    if step < args.warmup:
        return (step + 1) / args.warmup
    floor = args.min_lr / args.lr
    progress = (step - args.warmup) / max(1, args.steps - 1 - args.warmup)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_validation_split(ids):
    """The first 90% of the text for training, the rest held out."""
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:]


def sample_batch(data, batch, context, generator):
    """`batch` random windows of data: inputs and their next characters."""
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=generator)
    x = torch.stack([data[s:s + context] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + context] for s in starts.tolist()])
    return x, y


def decay_groups(model):
    """Weight decay on the blocks' and the output layer's matrices; none on biases, LayerNorm
    and the embeddings."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        embedding = name.startswith(("token_embedding.", "position_embedding."))
        (decay if p.dim() >= 2 and not embedding else no_decay).append(p)
    return decay, no_decay


@torch.no_grad()
def validation_loss(model, data, batch, context, batches=16):
    generator = torch.Generator().manual_seed(12345)
    losses = [model.loss(*sample_batch(data, batch, context, generator)).item()
              for _ in range(batches)]
    return sum(losses) / len(losses)


def main(argv):
    args = parse_args(argv)
    zt.init()
    rank, world = zt.rank(), zt.world_size()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))

    text = char_model.read_text(args.data)
    vocabulary = char_model.Vocabulary.of_text(text)
    ids = vocabulary.encode(text)
    train_data, validation_data = train_validation_split(ids)
    config = char_model.SMALL_CONFIG if args.small else char_model.FULL_CONFIG
    context = config["context"]

    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = char_model.CharTransformer(len(vocabulary), **config)
    _, no_decay = decay_groups(model)
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=args.lr, weight_decay=0.1, mode="zero2",
                                    param_groups=[{"params": no_decay, "weight_decay": 0.0}],
                                    clip_grad_norm=1.0, checkpoint_every=args.checkpoint_every,
                                    max_attempts=args.max_attempts)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args))
    generator = torch.Generator().manual_seed(1_000_003 * args.seed + rank)
    # A restarted script resumes where the job's latest checkpoint is: the batches and the LR
    # schedule of the steps before it are skipped, so that the rest is the same as without the
    # restart.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scheduler.step() without optimizer.step() is intended
        for _ in range(optimizer.start_step):
            sample_batch(train_data, args.batch, context, generator)
            scheduler.step()
    if rank == 0:
        parameters = sum(p.numel() for p in model.parameters())
        print(f"char transformer: {config}, {parameters:,} parameters, vocabulary "
              f"{len(vocabulary)}, {len(train_data):,} training characters; {world} ranks x "
              f"batch {args.batch} x context {context}, {args.steps} steps", flush=True)

    losses, step_seconds = [], []
    started = time.monotonic()
    for step in range(optimizer.start_step, args.steps):
        step_started = time.monotonic()
        lr = optimizer.param_groups[0]["lr"]
        x, y = sample_batch(train_data, args.batch, context, generator)
        loss = model.loss(x, y)
        loss.backward()
        optimizer.step(loss=loss.item())
        optimizer.zero_grad()
        scheduler.step()
        step_seconds.append(time.monotonic() - step_started)
        # The mean over the ranks' losses, as the worker computed it.
        losses.append(optimizer.last_step.global_loss)
        if rank == 0 and ((step + 1) % args.log_every == 0 or step == 0):
            print(f"step {step + 1:4d}  loss {losses[-1]:.4f}  lr {lr:.2e}  grad norm "
                  f"{optimizer.last_step.grad_norm:.3f}", flush=True)
    train_seconds = time.monotonic() - started

    if rank == 0:
        zt.save(model, args.out)
        char_model.write_config(args.out, config, vocabulary)
    if rank == 0 and losses:  # none when a restart resumed at the last step
        window = min(10, len(losses))
        first, last = statistics.mean(losses[:window]), statistics.mean(losses[-window:])
        validation = validation_loss(model, validation_data, args.batch, context)
        print(f"mean loss of the first {window} steps {first:.4f}, of the last {window} "
              f"{last:.4f} (x{last / first:.3f}); held-out loss {validation:.4f}; "
              f"{train_seconds:.1f} s, median step {1000 * statistics.median(step_seconds):.1f} "
              f"ms; saved {args.out}", flush=True)
        print(json.dumps({"example": "torch_char_transformer", "world_size": world,
                          "config": config, "steps": args.steps, "batch": args.batch,
                          "losses": losses, "validation_loss": validation,
                          "train_s": train_seconds,
                          "median_step_ms": 1000 * statistics.median(step_seconds),
                          "out": args.out}), flush=True)
    zt.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
