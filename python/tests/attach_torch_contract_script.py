"""torch.optim's contract around the optimizer (issue 26, items 3-5), run by `python3 -m
zeroshard.launch --workers W` (W = 1, 2): what scripts do besides step() - add_param_group before
the first step, torch.nn.utils.clip_grad_norm_ and opt.clip_grad_norm_, model.zero_grad(),
zero_grad(set_to_none=True), parameters without gradients, step() without any - in zero1, zero2,
ddp and zero3 (whose parameters are read inside opt.full_parameters()). Every case that trains compares with torch.optim's optimizer of the same
kind in the same process, on every rank's batch (the mean over ranks of the ranks' mean losses:
what the workers reduce); after the steps every parameter must agree with torch's within 1e-6 of
its tensor's largest value. Rank 0 prints one JSON line per case and mode; the script exits 1
when one fails (and stops at a case that raised). CASES lists (name, function, modes): a case is
one function of the mode; --case NAME runs only the named ones.
"""

import argparse
import contextlib
import copy
import json
import math
import sys
import traceback
import warnings

import torch

import zeroshard.torch as zt

STEPS = 6
BATCH = 8
MICRO_BATCHES = 2
TOLERANCE = 1e-6
MODES = ("zero1", "zero2", "ddp", "zero3")


def build_model():
    torch.manual_seed(2468)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))


def weights_and_biases(model):
    return ([p for name, p in model.named_parameters() if name.endswith("weight")],
            [p for name, p in model.named_parameters() if name.endswith("bias")])


def batch(step, micro, rank):
    generator = torch.Generator().manual_seed(7919 * step + 31 * micro + rank)
    return torch.randn(BATCH, 12, generator=generator), torch.randn(BATCH, 3, generator=generator)


def train(model, optimizer, rank, world, micro_batches=1, no_sync=None, zero_grad=None,
          after_backward=None, after_step=None, after_zero_grad=None):
    """STEPS steps of `micro_batches` micro-batches (all but the last inside no_sync() when
    given). rank None: torch, on every rank's batch, weighted as the workers average them."""
    zero_grad = zero_grad or optimizer.zero_grad
    for step in range(STEPS):
        for micro in range(micro_batches):
            last = micro == micro_batches - 1
            context = no_sync() if no_sync is not None and not last else contextlib.nullcontext()
            with context:
                ranks = range(world) if rank is None else [rank]
                loss = sum(torch.nn.functional.mse_loss(model(x), y)
                           for x, y in (batch(step, micro, r) for r in ranks)) / len(ranks)
                (loss / micro_batches).backward()
            if after_backward is not None:
                after_backward(step, micro)
        optimizer.step()
        if after_step is not None:
            after_step(step)
        zero_grad()
        if after_zero_grad is not None:
            after_zero_grad(step)
    return values_of(model, optimizer)


def reading(optimizer):
    """Where the model's parameters can be read: zero3's hold values only inside
    opt.full_parameters() (outside, a read raises naming it)."""
    if isinstance(optimizer, zt.ShardedOptimizer):
        return optimizer.full_parameters(writeback=False)
    return contextlib.nullcontext()


def values_of(model, optimizer):
    """The model's parameters, cloned."""
    with reading(optimizer):
        return {name: p.detach().clone() for name, p in model.named_parameters()}


def worst_relative(ours, theirs):
    worst = 0.0
    for name, expected in theirs.items():
        scale = max(expected.abs().max().item(), 1e-12)
        worst = max(worst, (ours[name] - expected).abs().max().item() / scale)
    return worst


def raises(expected_type, expected_text, action):
    """The message when `action` raises `expected_type` with `expected_text` in it, else None."""
    try:
        action()
    except expected_type as e:
        return str(e) if expected_text in str(e) else None
    return None


def add_param_group_before_first_step(mode):
    """AdamW built on the model, then the biases added as a group of their own (weight decay 0,
    another lr) before the first step: they move out of the default group, and the run matches
    torch.optim.AdamW built with the same two groups. A parameter already in a group, or a tensor
    that is not the model's, is refused; after the first step add_param_group raises
    NotImplementedError. Before issue 26 item 3, add_param_group always raised."""
    rank, world = zt.rank(), zt.world_size()
    reference_model = build_model()
    weights, biases = weights_and_biases(reference_model)
    reference = torch.optim.AdamW(
        [{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 1e-2}],
        lr=3e-3, weight_decay=0.05)
    expected = train(reference_model, reference, None, world)

    model = build_model()
    weights, biases = weights_and_biases(model)
    optimizer = zt.ShardedOptimizer(model, "adamw", mode=mode, lr=3e-3, weight_decay=0.05)
    try:
        optimizer.add_param_group({"params": biases, "weight_decay": 0.0, "lr": 1e-2})
        groups_like_torch = ([[id(p) for p in g["params"]] for g in optimizer.param_groups] ==
                             [[id(p) for p in weights], [id(p) for p in biases]])
        twice = raises(ValueError, "some parameters appear in more than one parameter group",
                       lambda: optimizer.add_param_group({"params": [biases[0]]}))
        foreign = raises(ValueError, "not a parameter of the model",
                         lambda: optimizer.add_param_group(
                             {"params": [torch.nn.Parameter(torch.zeros(3))]}))
        got = train(model, optimizer, rank, world)
        after_step = raises(NotImplementedError, "add_param_group: the job was submitted",
                            lambda: optimizer.add_param_group({"params": [weights[0]]}))
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    return {"worst_relative": worst, "groups_like_torch": groups_like_torch,
            "refused_twice": twice, "refused_foreign": foreign, "refused_after_step": after_step,
            "ok": worst <= TOLERANCE and groups_like_torch and None not in
            (twice, foreign, after_step)}


def add_param_group_unfrozen(mode):
    """Progressive unfreezing before the first step: the first layer is frozen when the SGD
    optimizer is built, then unfrozen and added with its own lr; the run matches torch.optim.SGD
    with both groups. Before issue 26 item 3, add_param_group always raised."""
    rank, world = zt.rank(), zt.world_size()
    hyper = {"lr": 0.05, "momentum": 0.9}
    reference_model = build_model()
    reference = torch.optim.SGD([{"params": reference_model[2].parameters()},
                                 {"params": reference_model[0].parameters(), "lr": 0.02}],
                                **hyper)
    expected = train(reference_model, reference, None, world)

    model = build_model()
    model[0].requires_grad_(False)
    optimizer = zt.ShardedOptimizer(model, "sgd", mode=mode, **hyper)
    try:
        frozen = raises(ValueError, "does not require grad",
                        lambda: optimizer.add_param_group({"params": model[0].parameters()}))
        model[0].requires_grad_(True)
        optimizer.add_param_group({"params": model[0].parameters(), "lr": 0.02})
        got = train(model, optimizer, rank, world)
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    return {"worst_relative": worst, "refused_frozen": frozen,
            "ok": worst <= TOLERANCE and frozen is not None}


def torch_clip_grad_norm_refused(mode):
    """zero1/zero2: after backward each .grad is a HandedOverGradient (the gradient is the
    worker's); torch.nn.utils.clip_grad_norm_ on it raises a RuntimeError naming the parameter
    and opt.clip_grad_norm_, nothing changes, and the run goes on to match torch.optim.AdamW
    (unclipped). .grad is None after step(). Before issue 26 item 5, clip_grad_norm_ found no
    .grad in zero2 (it clipped nothing, silently) and in zero1 scaled the shared gradient buffer
    while the worker was reducing it."""
    rank, world = zt.rank(), zt.world_size()
    reference_model = build_model()
    expected = train(reference_model, torch.optim.AdamW(reference_model.parameters(), lr=3e-3),
                     None, world)
    model = build_model()
    optimizer = zt.ShardedOptimizer(model, "adamw", mode=mode, lr=3e-3)
    seen = {"messages": [], "handed_over": True, "none_after_step": True}

    def after_backward(step, micro):
        seen["handed_over"] &= all(isinstance(p.grad, zt.HandedOverGradient)
                                   for p in model.parameters())
        seen["messages"].append(raises(
            RuntimeError, "opt.clip_grad_norm_",
            lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))

    def after_step(step):
        seen["none_after_step"] &= all(p.grad is None for p in model.parameters())

    try:
        got = train(model, optimizer, rank, world, after_backward=after_backward,
                    after_step=after_step)
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    messages = seen["messages"]
    named = all(m is not None and "parameter " in m for m in messages)
    return {"worst_relative": worst, "message": messages[0], "handed_over": seen["handed_over"],
            "none_after_step": seen["none_after_step"],
            "ok": worst <= TOLERANCE and len(messages) == STEPS and named and
            seen["handed_over"] and seen["none_after_step"]}


def model_zero_grad(mode):
    """model.zero_grad() instead of opt.zero_grad(), with accumulation (2 micro-batches, the
    first inside no_sync): the run matches torch.optim.Adam with model.zero_grad(). It is the
    optimizer's: right after a backward, where zero1/zero2 left HandedOverGradients that torch's
    Module.zero_grad(set_to_none=False) would raise on, it does not raise and leaves .grad None
    (zero1/zero2; the worker has the gradients) or the zeroed shared buffer (ddp); a deepcopy of
    the model is plain torch (its zero_grad torch's, no optimizer copied). The training part
    passes before issue 26 too; the HandedOverGradients came with it."""
    rank, world = zt.rank(), zt.world_size()
    reference_model = build_model()
    reference = torch.optim.Adam(reference_model.parameters(), lr=3e-3)
    expected = train(reference_model, reference, None, world, MICRO_BATCHES,
                     zero_grad=reference_model.zero_grad)
    model = build_model()
    optimizer = zt.ShardedOptimizer(model, "adam", mode=mode, lr=3e-3)
    try:
        got = train(model, optimizer, rank, world, MICRO_BATCHES, optimizer.no_sync,
                    zero_grad=model.zero_grad)
        x, y = batch(STEPS, 0, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        model.zero_grad(set_to_none=False)
        # ddp: zeroed in place (the worker may still be reducing into it: values not checked).
        after_backward = all((p.grad is not None) == (mode == "ddp") for p in model.parameters())
        optimizer.step()
        with reading(optimizer):
            clone = copy.deepcopy(model)
        clone(x).sum().backward()
        clone.zero_grad()
        clone_is_torchs = clone.zero_grad.__self__ is clone and all(
            p.grad is None or not p.grad.any() for p in clone.parameters())
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    return {"worst_relative": worst, "zero_grad_after_backward": after_backward,
            "deepcopy_zero_grad_is_torchs": clone_is_torchs,
            "ok": worst <= TOLERANCE and after_backward and clone_is_torchs}


def zero_grad_set_to_none(mode):
    """opt.zero_grad(set_to_none=True) after every step, with accumulation (2 micro-batches, the
    first inside no_sync): every .grad is None afterwards and no tensor has a gradient
    (_tensors_without_gradient() lists them all); after each backward all have one again; the
    fresh gradients backward makes are copied into the shared buffer (ddp/zero1) without the
    "replaced .grad" warning; the run matches torch.optim.AdamW. Before issue 26 item 4,
    zero_grad left .grad as the shared buffer's view in ddp and zero1 whatever set_to_none said."""
    rank, world = zt.rank(), zt.world_size()
    reference_model = build_model()
    reference = torch.optim.AdamW(reference_model.parameters(), lr=3e-3)
    expected = train(reference_model, reference, None, world, MICRO_BATCHES,
                     zero_grad=lambda: reference.zero_grad(set_to_none=True))
    model = build_model()
    optimizer = zt.ShardedOptimizer(model, "adamw", mode=mode, lr=3e-3)
    count = len(list(model.parameters()))
    seen = {"none": True, "without_after_zero_grad": True, "with_after_backward": True}

    def after_backward(step, micro):
        seen["with_after_backward"] &= optimizer._tensors_without_gradient() == []

    def after_zero_grad(step):
        seen["none"] &= all(p.grad is None for p in model.parameters())
        seen["without_after_zero_grad"] &= \
            optimizer._tensors_without_gradient() == list(range(count))

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(model, optimizer, rank, world, MICRO_BATCHES, optimizer.no_sync,
                        zero_grad=lambda: optimizer.zero_grad(set_to_none=True),
                        after_backward=after_backward, after_zero_grad=after_zero_grad)
    finally:
        zt.finish(optimizer)
    replaced = [str(w.message) for w in caught if "replaced" in str(w.message)]
    worst = worst_relative(got, expected)
    return {"worst_relative": worst, "replaced_grad_warnings": len(replaced), **seen,
            "ok": worst <= TOLERANCE and not replaced and all(seen.values())}


class Branchy(torch.nn.Module):
    """Parameters that get no gradient in some steps, as ordinary models have them: `unused` is
    never called (pytorch/examples' Transformer has unused decoder layers), `sometimes` only in
    even steps, `rank0` only in rank 0's loss (at W = 2 the other rank has no gradient for it:
    the ranks' sets are OR-ed and the gradient averaged with zero, as DDP does)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(97)
        self.body = torch.nn.Linear(12, 24)
        self.sometimes = torch.nn.Linear(24, 24)
        self.rank0 = torch.nn.Linear(24, 3)
        self.unused = torch.nn.Linear(24, 24)
        self.head = torch.nn.Linear(24, 3)

    def forward(self, x, step, rank):
        h = torch.tanh(self.body(x))
        if step % 2 == 0:
            h = h + torch.tanh(self.sometimes(h))
        out = self.head(h)
        if rank == 0:
            out = out + self.rank0(h)
        return out


def train_branchy(model, optimizer, rank, world, steps, set_to_none, first_step=0,
                  clip=None):
    """rank None: torch on every rank's loss, averaged over ranks as the workers average."""
    norms = []
    for step in range(first_step, first_step + steps):
        ranks = range(world) if rank is None else [rank]
        loss = sum(torch.nn.functional.mse_loss(model(x, step, r), y)
                   for r, (x, y) in ((r, batch(step, 0, r)) for r in ranks)) / len(ranks)
        loss.backward()
        if clip is not None:
            norms.append(float(clip()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)
    return values_of(model, optimizer), norms


def steps_of(torch_state_dict):
    """{parameter index: its step} of a torch-format state dict (None: no step kept)."""
    steps = {}
    for index, entry in torch_state_dict["state"].items():
        step = entry.get("step")
        steps[index] = None if step is None else int(float(step))
    return steps


NO_GRADIENT_OPTIMIZERS = [
    ("adamw", torch.optim.AdamW, {"lr": 3e-3, "weight_decay": 0.1}),
    ("sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}),
    ("adagrad", torch.optim.Adagrad, {"lr": 0.05, "weight_decay": 0.01}),
]


def parameters_without_gradients(mode):
    """torch.optim skips a parameter whose .grad is None: not updated, its state and step do
    not advance (issue 26 item 4). With zero_grad(set_to_none=True) `sometimes` has no gradient
    in odd steps, `unused` never: AdamW, SGD with momentum and Adagrad (all with weight decay,
    which would move them) match torch.optim in the same process, `unused` stays bitwise what it
    was, and the consolidated state dict holds torch's per-parameter steps (no state for
    `unused`). With set_to_none=False (torch 1.13's default) a gradient, once made, stays as
    zeros and torch updates it: matched too. Then torch's own state dict (steps differing per
    parameter) loads into a new optimizer and 3 more steps match torch's. Before issue 26, weight
    decay and momentum moved every parameter in every step."""
    rank, world = zt.rank(), zt.world_size()
    results = {}
    ok = True
    for kind, torch_class, hyper in NO_GRADIENT_OPTIMIZERS:
        for set_to_none in (True, False):
            if kind != "adamw" and not set_to_none:
                continue
            reference_model = Branchy()
            reference = torch_class(reference_model.parameters(), **hyper)
            expected, _ = train_branchy(reference_model, reference, None, world, STEPS,
                                        set_to_none)
            model = Branchy()
            unused_before = model.unused.weight.detach().clone()
            optimizer = zt.ShardedOptimizer(model, kind, mode=mode, **hyper)
            try:
                got, _ = train_branchy(model, optimizer, rank, world, STEPS, set_to_none)
                ours = steps_of(optimizer.state_dict(consolidated=True))
            finally:
                zt.finish(optimizer)
            theirs = steps_of(reference.state_dict())
            worst = worst_relative(got, expected)
            unused_kept = torch.equal(got["unused.weight"], unused_before)
            # `unused` never enters a graph: its .grad stays None whatever set_to_none says.
            case_ok = worst <= TOLERANCE and ours == theirs and unused_kept
            results[f"{kind}_set_to_none_{set_to_none}"] = {
                "worst_relative": worst, "steps_like_torch": ours == theirs,
                "unused_kept": unused_kept, "ok": case_ok}
            ok = ok and case_ok

    # torch's state dict, steps differing per parameter, into a new optimizer.
    kind, torch_class, hyper = NO_GRADIENT_OPTIMIZERS[0]
    reference_model = Branchy()
    reference = torch_class(reference_model.parameters(), **hyper)
    train_branchy(reference_model, reference, None, world, STEPS, True)
    model = Branchy()
    model.load_state_dict(reference_model.state_dict())
    optimizer = zt.ShardedOptimizer(model, kind, mode=mode, **hyper)
    try:
        optimizer.load_state_dict(reference.state_dict())
        got, _ = train_branchy(model, optimizer, rank, world, 3, True, first_step=STEPS)
        ours = steps_of(optimizer.state_dict(consolidated=True))
    finally:
        zt.finish(optimizer)
    expected, _ = train_branchy(reference_model, reference, None, world, 3, True,
                                first_step=STEPS)
    worst = worst_relative(got, expected)
    loaded_ok = worst <= TOLERANCE and ours == steps_of(reference.state_dict())
    results["torch_state_dict_loaded"] = {"worst_relative": worst, "ok": loaded_ok}
    return {"optimizers": results, "ok": ok and loaded_ok}


def step_without_gradients(mode):
    """step() with no gradient at all is a no-op, as torch.optim's: first thing after building
    the optimizer, and after zero_grad(set_to_none=True); every parameter stays bitwise, and the
    run goes on to match torch.optim.AdamW. Before issue 26, weight decay moved every parameter."""
    rank, world = zt.rank(), zt.world_size()
    hyper = {"lr": 3e-3, "weight_decay": 0.1}
    reference_model = Branchy()
    reference = torch.optim.AdamW(reference_model.parameters(), **hyper)
    reference.step()
    train_branchy(reference_model, reference, None, world, 2, True)
    reference.step()
    expected, _ = train_branchy(reference_model, reference, None, world, 2, True, first_step=2)
    model = Branchy()
    optimizer = zt.ShardedOptimizer(model, "adamw", mode=mode, **hyper)
    try:
        before = values_of(model, optimizer)
        optimizer.step()
        first_kept = all(torch.equal(p, before[name])
                         for name, p in values_of(model, optimizer).items())
        train_branchy(model, optimizer, rank, world, 2, True)
        before = values_of(model, optimizer)
        optimizer.step()
        later_kept = all(torch.equal(p, before[name])
                         for name, p in values_of(model, optimizer).items())
        got, _ = train_branchy(model, optimizer, rank, world, 2, True, first_step=2)
    finally:
        zt.finish(optimizer)
    worst = worst_relative(got, expected)
    return {"worst_relative": worst, "first_step_kept": first_kept,
            "later_step_kept": later_kept,
            "ok": worst <= TOLERANCE and first_kept and later_kept}


def clip_grad_norm(mode):
    """Clipping the user's way after backward, against torch.nn.utils.clip_grad_norm_ on
    torch.optim.AdamW in the same process (max_norm small enough to clip every step): ddp with
    torch's own clip_grad_norm_ (.grad holds the averaged gradient once backward returns, as
    with torch's DDP) and with opt.clip_grad_norm_; zero1/zero2 with opt.clip_grad_norm_ (global
    across the shards); norm_type 2 and inf. The norms returned and the parameters match torch.
    Before issue 26 item 5, zero2's .grad was None (torch's clip clipped nothing and returned 0)
    and ddp/zero1's raced the reduction; opt.clip_grad_norm_ did not exist."""
    rank, world = zt.rank(), zt.world_size()
    results = {}
    ok = True
    ways = [("opt", 2.0), ("opt", math.inf)]
    if mode == "ddp":
        ways += [("torch", 2.0), ("torch", math.inf)]
    for way, norm_type in ways:
        max_norm = 0.05
        reference_model = Branchy()
        reference = torch.optim.AdamW(reference_model.parameters(), lr=3e-3)
        expected, expected_norms = train_branchy(
            reference_model, reference, None, world, STEPS, False,
            clip=lambda: torch.nn.utils.clip_grad_norm_(reference_model.parameters(), max_norm,
                                                        norm_type))
        model = Branchy()
        optimizer = zt.ShardedOptimizer(model, "adamw", mode=mode, lr=3e-3)
        if way == "opt":
            clip = lambda: optimizer.clip_grad_norm_(max_norm, norm_type)  # noqa: E731
        else:
            clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm,  # noqa
                                                          norm_type)
        try:
            got, norms = train_branchy(model, optimizer, rank, world, STEPS, False, clip=clip)
            # Bad arguments raise, naming the field, before anything reaches the workers.
            refusals = [raises(ValueError, "norm_type: 1.0 is not supported",
                               lambda: optimizer.clip_grad_norm_(1.0, 1)),
                        raises(ValueError, "max_norm: -1.0 must be finite and >= 0",
                               lambda: optimizer.clip_grad_norm_(-1.0))]
        finally:
            zt.finish(optimizer)
        worst = worst_relative(got, expected)
        norm_error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(norms, expected_norms))
        clipped = all(norm > max_norm for norm in expected_norms)
        case_ok = (worst <= TOLERANCE and norm_error <= TOLERANCE and clipped and
                   None not in refusals)
        results[f"{way}_{norm_type}"] = {"worst_relative": worst, "norm_error": norm_error,
                                         "clipped_every_step": clipped,
                                         "bad_arguments_refused": None not in refusals,
                                         "ok": case_ok}
        ok = ok and case_ok
    return {"ways": results, "ok": ok}


CASES = [
    ("add_param_group_before_first_step", add_param_group_before_first_step, MODES),
    ("add_param_group_unfrozen", add_param_group_unfrozen, MODES),
    # ddp keeps values in .grad (the averaged gradient): torch's clip_grad_norm_ is not refused.
    ("torch_clip_grad_norm_refused", torch_clip_grad_norm_refused, ("zero1", "zero2", "zero3")),
    ("model_zero_grad", model_zero_grad, MODES),
    ("zero_grad_set_to_none", zero_grad_set_to_none, MODES),
    ("parameters_without_gradients", parameters_without_gradients, MODES),
    ("step_without_gradients", step_without_gradients, MODES),
    ("clip_grad_norm", clip_grad_norm, MODES),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    args = parser.parse_args()
    zt.init()
    failed = False
    for name, function, modes in CASES:
        if args.case and name not in args.case:
            continue
        for mode in modes:
            try:
                result = function(mode)
            except Exception:  # the case failed: reported, then the script stops (ranks agree)
                result = {"ok": False, "error": traceback.format_exc()}
            result = {"case": name, "mode": mode, "world_size": zt.world_size(), **result}
            if zt.rank() == 0 or not result["ok"]:
                print(json.dumps(result), flush=True)
            if not result["ok"]:
                failed = True
            if "error" in result:
                return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
