"""zero3 for attached trainers (issue 39): run by `python3 -m zeroshard.launch --workers 2`. A
small GPT-style model (tied embedding and head, blocks whose MLP is one module holding two Linear
layers, a Linear applied twice, a parameter registered on the model itself) trains STEPS steps of
AdamW with clipping in zero2 and then in zero3 from the same initial values. zero3 must equal
zero2 bit for bit: every step's loss and the parameters afterwards (read inside
opt.full_parameters() and again after zt.finish), and after loading the sharded state_dict()
saved at step 3 (zero3 also loads zero2's: the same values). Between steps no zero3 parameter holds storage
(its bytes are 0), the Parameter objects are the model's own, and a write inside
full_parameters() (the same on every rank) reaches the owners and training goes on from it,
bitwise as in zero2, and model.state_dict() and a read of a parameter's values outside it are
refused naming it (inside, it holds the values), while its shape answers as planned. Each rank prints one JSON line; the
script exits 1 when a check fails.
"""

import json
import sys

import torch

import zeroshard.torch as zt

STEPS = 6
VOCAB = 32
WIDTH = 16
BATCH = 8
BLOCKS = 2
# The job's bucket_elems (argv[1]; None: the default, which holds this model in one bucket): with
# 1024 every module shares buckets with its neighbours and the gather pool's arena slides.
BUCKET_ELEMS = None


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.mlp = Mlp()
        self.mix = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        x = x + self.mlp(self.norm(x))
        return x + self.mix(torch.tanh(self.mix(x)))  # the same Linear twice


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1234)
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Parameter(torch.randn(BATCH, WIDTH) * 0.02)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        x = self.embedding(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(step, rank):
    generator = torch.Generator().manual_seed(7919 * step + rank)
    return (torch.randint(0, VOCAB, (BATCH,), generator=generator),
            torch.randint(0, VOCAB, (BATCH,), generator=generator))


def storage_bytes(p):
    if hasattr(p, "untyped_storage"):
        return p.untyped_storage().size()
    return p.storage().size() * p.element_size()


def train(mode, rank, foreign=None):
    model = Model()
    parameters = list(model.parameters())
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, weight_decay=0.1, mode=mode,
                                    clip_grad_norm=1.0, bucket_elems=BUCKET_ELEMS)
    losses = []
    held_between_steps = []
    saved = None

    def train_steps(steps):
        nonlocal saved
        for step in steps:
            tokens, targets = batch(step, rank)
            loss = torch.nn.functional.cross_entropy(model(tokens), targets)
            loss.backward()
            optimizer.step(loss=loss.item())
            optimizer.zero_grad()
            losses.append(loss.item())
            held_between_steps.append(sum(storage_bytes(p) for p in model.parameters()))
            if step == 2:
                saved = optimizer.state_dict()  # the sharded checkpoint of step 3

    train_steps(range(STEPS))
    with optimizer.full_parameters():
        inside = {name: p.detach().clone() for name, p in model.named_parameters()}
    state_dict_refused = ""
    read_refused = ""
    shapes_kept = True
    if mode == "zero3":
        # Between uses a read of a parameter's values raises naming full_parameters(); its shape
        # and the like answer as planned.
        try:
            model.blocks[0].mlp.up.weight.detach().clone()
        except RuntimeError as e:
            read_refused = str(e)
        shapes_kept = all(p.shape == (with_values := inside[name]).shape and
                          p.numel() == with_values.numel() and p.dim() == with_values.dim()
                          for name, p in model.named_parameters())
        try:
            model.state_dict()
        except RuntimeError as e:
            state_dict_refused = str(e)
        with optimizer.full_parameters():
            whole = model.state_dict()
            if not bitwise_equal({name: whole[name] for name in inside}, inside):
                state_dict_refused = "inside full_parameters(), model.state_dict() differs"
    # A write inside full_parameters() (the same on every rank) reaches the owners.
    with optimizer.full_parameters():
        with torch.no_grad():
            model.blocks[1].mix.bias.add_(1.0)
    with optimizer.full_parameters():
        written = model.blocks[1].mix.bias.detach().clone()
    write_kept = torch.equal(written, inside["blocks.1.mix.bias"] + 1.0)
    train_steps(range(STEPS, STEPS + 2))
    # Back to step 3's checkpoint: the workers restore their owned pieces.
    optimizer.load_state_dict(saved)
    with optimizer.full_parameters():
        reloaded = {name: p.detach().clone() for name, p in model.named_parameters()}
    # Another mode's checkpoint (zero2's of step 3, in zero3): the same values.
    reloaded_foreign = None
    if foreign is not None:
        optimizer.load_state_dict(foreign)
        with optimizer.full_parameters():
            reloaded_foreign = {name: p.detach().clone() for name, p in model.named_parameters()}
    zt.finish(optimizer)
    after = {name: p.detach().clone() for name, p in model.named_parameters()}
    same_objects = all(a is b for a, b in zip(parameters, model.parameters()))
    return {"losses": losses, "held_between_steps": held_between_steps, "inside": inside,
            "saved": saved, "reloaded_foreign": reloaded_foreign,
            "after": after, "reloaded": reloaded, "same_objects": same_objects, "write_kept": write_kept,
            "state_dict_refused": state_dict_refused, "read_refused": read_refused,
            "shapes_kept": shapes_kept,
            "still_tied": model.head.weight is model.embedding.weight}


def bitwise_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def main():
    global BUCKET_ELEMS
    if len(sys.argv) > 1:
        BUCKET_ELEMS = int(sys.argv[1])
    zt.init()
    rank = zt.rank()
    zero2 = train("zero2", rank)
    zero3 = train("zero3", rank, foreign=zero2["saved"])
    line = {
        "rank": rank,
        "losses_equal": zero2["losses"] == zero3["losses"],
        "losses_zero2": zero2["losses"],
        "losses_zero3": zero3["losses"],
        "inside_equal": bitwise_equal(zero2["inside"], zero3["inside"]),
        "after_equal": bitwise_equal(zero2["after"], zero3["after"]),
        "reloaded_equal": bitwise_equal(zero2["reloaded"], zero3["reloaded"]),
        "reloaded_is_earlier": not bitwise_equal(zero3["reloaded"], zero3["inside"]),
        "zero2_checkpoint_in_zero3": bitwise_equal(zero2["reloaded"], zero3["reloaded_foreign"]),
        "zero3_held_between_steps": zero3["held_between_steps"],
        "zero2_held_between_steps": zero2["held_between_steps"],
        "same_objects": zero3["same_objects"],
        "still_tied": zero3["still_tied"],
        "write_kept": [zero2["write_kept"], zero3["write_kept"]],
        "state_dict_refused": zero3["state_dict_refused"],
        "read_refused": zero3["read_refused"],
        "shapes_kept": zero3["shapes_kept"],
        "trained": not torch.equal(zero3["after"]["embedding.weight"],
                                   Model().embedding.weight.detach()),
    }
    line["ok"] = (line["losses_equal"] and line["inside_equal"] and line["after_equal"] and
                  line["reloaded_equal"] and line["reloaded_is_earlier"] and
                  line["zero2_checkpoint_in_zero3"] and
                  all(b == 0 for b in line["zero3_held_between_steps"]) and
                  line["same_objects"] and line["still_tied"] and line["trained"] and
                  all(line["write_kept"]) and
                  "full_parameters()" in line["state_dict_refused"] and
                  "full_parameters()" in line["read_refused"] and line["shapes_kept"])
    print(json.dumps(line), flush=True)
    return 0 if line["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
