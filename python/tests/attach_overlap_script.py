"""The all-gather overlapped with the next forward (issue 29 item 2): run by `python3 -m
zeroshard.launch --workers 2`. A model with a tied head (embedding and output projection share
one weight), a parameter registered on the model itself, two Linears in a Sequential and a module
that reads its child's weights without calling it trains with AdamW in zero2; the attach
connection is instrumented to record which tensors each module's forward pre-hook waited for
(wait_parameters) after step() returned with its all-gathers pending. Then: model.state_dict(),
opt.state_dict() and model.named_parameters() right after step() against torch.optim.AdamW run in
this process on every rank's data; a tied weight used first through its other module;
model.zero_grad() waits for nothing; zero2 without the overlap and ddp (no waits) bitwise equal to
zero2 with it. Rank 0 prints one JSON line per case; the script exits 1 when one fails.
"""

import json
import sys

import torch

import zeroshard.torch as zt

STEPS = 5
# After these steps the state dicts, or model.named_parameters(), are read at once (they wait for
# every all-gather); after the others the next forward's modules wait.
MODEL_STATE_DICT_STEPS = (0, 2)
OPTIMIZER_STATE_DICT_STEP = 2
NAMED_PARAMETERS_STEP = 3
VOCAB = 20
WIDTH = 12
BATCH = 6
TOLERANCE = 1e-6
# Every tensor in plan order (the reverse of model.parameters(), whose root's own scale comes
# first), as a wait for all names them.
ALL_TENSORS = ["project.bias", "mix.inner.bias", "mix.inner.weight", "block.2.bias",
               "block.2.weight", "block.0.bias", "block.0.weight", "embedding.weight", "scale"]


class Mixer(torch.nn.Module):
    """Reads its child's weights without calling it, as nn.MultiheadAttention reads out_proj's."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, h):
        return h + torch.nn.functional.linear(h, self.inner.weight, self.inner.bias)


class TiedHeadModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2024)
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.block = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                                         torch.nn.Linear(WIDTH, WIDTH))
        self.scale = torch.nn.Parameter(torch.ones(WIDTH) * 0.5)
        self.mix = Mixer()
        self.project = torch.nn.Linear(WIDTH, VOCAB)
        self.project.weight = self.embedding.weight

    def forward(self, tokens):
        return self.project(self.mix(self.block(self.embedding(tokens)) * self.scale))


def batch(step, rank):
    generator = torch.Generator().manual_seed(104729 * step + rank)
    return (torch.randint(0, VOCAB, (BATCH,), generator=generator),
            torch.randint(0, VOCAB, (BATCH,), generator=generator))


def loss_of(model, step, rank):
    tokens, targets = batch(step, rank)
    return torch.nn.functional.cross_entropy(model(tokens), targets)


class WaitRecorder:
    """Records each wait_parameters the optimizer sends, with the module whose forward pre-hook
    ran last (this recorder's hooks are registered before the optimizer's, so they run first)."""

    def __init__(self, model):
        self.current = "(outside a forward)"
        self.waits = []
        for name, module in model.named_modules():
            module.register_forward_pre_hook(
                lambda module, inputs, name=name or "(model)": self._entered(name))

    def _entered(self, name):
        self.current = name

    def instrument(self, optimizer):
        connection = optimizer._connection
        names = optimizer._attachment.plan.names
        call = connection.call

        def recording_call(request, *args, **kwargs):
            if request.WhichOneof("request") == "wait_parameters":
                self.waits.append([self.current,
                                   [names[t] for t in request.wait_parameters.tensors]])
            return call(request, *args, **kwargs)

        connection.call = recording_call

    def take(self):
        """The waits since the last take; the next ones are outside a forward until a module's
        pre-hook runs."""
        waits, self.waits = self.waits, []
        self.current = "(outside a forward)"
        return waits


def relative(ours, theirs):
    """The largest |difference| over the largest |element| of `theirs`."""
    ours, theirs = ours.detach().float(), theirs.detach().float()
    return (ours - theirs).abs().max().item() / max(theirs.abs().max().item(), 1e-12)


def worst_relative(model, reference):
    worst = 0.0
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        scale = max(theirs.detach().abs().max().item(), 1e-12)
        worst = max(worst, (ours.detach() - theirs.detach()).abs().max().item() / scale)
    return worst


def reference_step(reference, reference_optimizer, step, world_size):
    for r in range(world_size):
        (loss_of(reference, step, r) / world_size).backward()
    reference_optimizer.step()
    reference_optimizer.zero_grad()


def overlapped(rank, world_size):
    """zero2 with the overlap: the waits of each forward, state dicts right after step()."""
    reference = TiedHeadModel()
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    model = TiedHeadModel()
    recorder = WaitRecorder(model)
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode="zero2")
    line = {"case": "zero2 overlap", "forwards": [], "state_dict_waits": [],
            "state_dict_worst": [], "optimizer_state_worst": []}
    for step in range(STEPS):
        loss = loss_of(model, step, rank)
        if step == 0:
            recorder.instrument(optimizer)  # attached at the first forward
        line["forwards"].append(recorder.take())
        loss.backward()
        optimizer.step()
        line["pending_after_step"] = optimizer.last_step.parameters_pending
        reference_step(reference, reference_optimizer, step, world_size)
        if step == OPTIMIZER_STATE_DICT_STEP:
            # The optimizer's consolidated state dict right after step() (collective) waits for
            # every all-gather first.
            saved = optimizer.state_dict(consolidated=True)
            line["optimizer_state_dict_waits"] = recorder.take()
            theirs = reference_optimizer.state_dict()["state"]
            line["optimizer_state_worst"].append(max(
                relative(saved["state"][i][key], theirs[i][key])
                for i in theirs for key in ("exp_avg", "exp_avg_sq")))
        if step in MODEL_STATE_DICT_STEPS:
            # Right after step() (or the optimizer's state dict): the model's state dict waits
            # for every all-gather still pending.
            state = {name: value.clone() for name, value in model.state_dict().items()}
            line["state_dict_waits"].append(recorder.take())
            line["state_dict_worst"].append(max(
                relative(state[name], value) for name, value in reference.state_dict().items()))
        if step == NAMED_PARAMETERS_STEP:
            # model.named_parameters() right after step() waits for every all-gather too.
            snapshot = {name: p.detach().clone() for name, p in model.named_parameters()}
            line["named_parameters_waits"] = recorder.take()
            line["named_parameters_worst"] = max(
                relative(snapshot[name], p) for name, p in reference.named_parameters())
        model.zero_grad()  # not a read: the next forward still waits per module
    # A tied weight used through its other module first: that module's pre-hook waits for it.
    optimizer.zero_grad()
    loss = loss_of(model, STEPS, rank)
    line["forwards"].append(recorder.take())
    loss.backward()
    optimizer.step()
    reference_step(reference, reference_optimizer, STEPS, world_size)
    tokens, _ = batch(STEPS + 1, rank)
    with torch.no_grad():
        direct = model.project(torch.ones(2, WIDTH))
        line["direct_project_waits"] = recorder.take()
        model(tokens)
        line["then_forward_waits"] = recorder.take()
        expected_direct = reference.project(torch.ones(2, WIDTH))
    line["direct_worst"] = (direct - expected_direct).abs().max().item()
    line["worst_relative"] = worst_relative(model, reference)
    final = [p.detach().clone() for p in model.parameters()]
    zt.finish(optimizer)
    return line, final


def plain(mode, overlap, rank, world_size):
    """No waits expected: ddp has no all-gather, overlap_all_gather=False waits in step()."""
    model = TiedHeadModel()
    recorder = WaitRecorder(model)
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode=mode,
                                    overlap_all_gather=overlap)
    waits = []
    pending = []
    for step in range(STEPS + 1):
        loss = loss_of(model, step, rank)
        if step == 0:
            recorder.instrument(optimizer)
        loss.backward()
        optimizer.step()
        pending.append(optimizer.last_step.parameters_pending)
        optimizer.zero_grad()
        waits += recorder.take()
    final = [p.detach().clone() for p in model.parameters()]
    zt.finish(optimizer)
    return {"case": f"{mode} overlap={overlap}", "waits": waits, "pending": pending}, final


def expected_forward_waits():
    # The root waits for the tied weight (any module may read it) and its own scale; each Linear
    # for its own; the projection's tied weight was waited for already, its bias is its own.
    return [["(model)", ["embedding.weight", "scale"]],
            ["block.0", ["block.0.bias", "block.0.weight"]],
            ["block.2", ["block.2.bias", "block.2.weight"]],
            ["mix", ["mix.inner.bias", "mix.inner.weight"]],
            ["project", ["project.bias"]]]


def waited_for(waits):
    """The tensors `waits` named, sorted; None when one was sent from inside a forward."""
    if any(where != "(outside a forward)" for where, _ in waits):
        return None
    return sorted(name for _, names in waits for name in names)


def main():
    zt.init()
    rank, world_size = zt.rank(), zt.world_size()
    lines = []
    line, overlapped_final = overlapped(rank, world_size)
    expected = expected_forward_waits()
    # The first forward attaches (nothing pending); one after a state dict finds nothing
    # pending either.
    read_at_once = MODEL_STATE_DICT_STEPS + (NAMED_PARAMETERS_STEP,)
    expected_forwards = [[] if step == 0 or step - 1 in read_at_once else expected
                         for step in range(STEPS + 1)]
    line["ok"] = (line["forwards"] == expected_forwards and
                  line["pending_after_step"] and
                  # model.state_dict() waits module by module (each one's hook) for them all.
                  [waited_for(waits) for waits in line["state_dict_waits"]] == [
                      [] if step == OPTIMIZER_STATE_DICT_STEP else sorted(ALL_TENSORS)
                      for step in MODEL_STATE_DICT_STEPS] and
                  line["optimizer_state_dict_waits"] == [["(outside a forward)", ALL_TENSORS]] and
                  line["named_parameters_waits"] == [["(outside a forward)", ALL_TENSORS]] and
                  line["named_parameters_worst"] <= TOLERANCE and
                  max(line["state_dict_worst"]) <= TOLERANCE and
                  max(line["optimizer_state_worst"]) <= TOLERANCE and
                  line["direct_project_waits"] == [["project",
                                                    ["project.bias", "embedding.weight"]]] and
                  line["then_forward_waits"] == [["(model)", ["scale"]]] + expected[1:4] and
                  line["direct_worst"] <= TOLERANCE and line["worst_relative"] <= TOLERANCE)
    lines.append(line)
    for mode, overlap in (("zero2", False), ("ddp", True)):
        other, final = plain(mode, overlap, rank, world_size)
        other["bitwise_equal_to_overlap"] = all(torch.equal(a, b)
                                                for a, b in zip(final, overlapped_final))
        other["ok"] = (other["waits"] == [] and not any(other["pending"]) and
                       other["bitwise_equal_to_overlap"])
        lines.append(other)
    for line in lines:
        if rank == 0:
            print(json.dumps(line), flush=True)
    return 0 if all(line["ok"] for line in lines) else 1


if __name__ == "__main__":
    status = main()
    zt.finish()
    sys.exit(status)
