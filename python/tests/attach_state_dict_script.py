"""ShardedOptimizer.state_dict() / load_state_dict() on real workers, run by `python3 -m
zeroshard.launch --workers W` (attach_state_dict_test.py). Rank 0 prints one JSON line per check
({"check", "ok", ...}); the script exits 1 when a check fails on any rank.

Without arguments (W = 2): the consolidated state equals torch ZeroRedundancyOptimizer's
(consolidate_state_dict(to=0), then state_dict() on rank 0) within 1e-6; a save, more steps, a
load and the same steps again give bitwise the same parameters (zero2, zero1, ddp); a
consolidated dict loads into a plain torch.optim.AdamW whose next step matches ours, and that
AdamW's state dict loads back into ours; bad inputs raise ValueError naming what is wrong and
change nothing. `--save DIR` (W = 2) saves a sharded state dict, its checkpoint copied into DIR;
`--load DIR` (another W) loads it and checks the parameters and the consolidated state.
"""

import argparse
import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import attach_equivalence_script as eq
import zeroshard.torch as zt
from zeroshard._proto.zeroshard.v1 import attach_pb2

TOLERANCE = 1e-6
STEPS_BEFORE_SAVE = 5
STEPS_AFTER_SAVE = 4

results = []


def report(check, ok, **details):
    results.append(ok)
    if zt.rank() == 0:
        print(json.dumps({"check": check, "ok": bool(ok), **details}), flush=True)


def relative_difference(got, expected):
    scale = max(expected.abs().max().item(), 1e-12)
    return (got - expected).abs().max().item() / scale


def compare_states(got, expected):
    """The worst relative difference between two torch-format state dicts' states, or a string
    saying how their layouts differ."""
    if sorted(got["state"]) != sorted(expected["state"]):
        return f"indices {sorted(got['state'])} vs {sorted(expected['state'])}"
    worst = 0.0
    for index, entry in expected["state"].items():
        mine = got["state"][index]
        if list(mine) != list(entry):
            return f"state[{index}] keys {list(mine)} vs {list(entry)}"
        for key, value in entry.items():
            if key == "step":
                if float(mine[key]) != float(value) or torch.is_tensor(mine[key]) != \
                        torch.is_tensor(value):
                    return f"state[{index}].step {mine[key]!r} vs {value!r}"
                if torch.is_tensor(value) and mine[key].dtype != value.dtype:
                    return f"state[{index}].step dtype {mine[key].dtype} vs {value.dtype}"
            elif value is None or mine[key] is None:
                if (value is None) != (mine[key] is None):
                    return f"state[{index}].{key} {mine[key]!r} vs {value!r}"
            else:
                if mine[key].shape != value.shape:
                    return f"state[{index}].{key} shape {list(mine[key].shape)} vs " \
                           f"{list(value.shape)}"
                worst = max(worst, relative_difference(mine[key], value))
    return worst


def sharded_optimizer(model, kind="adamw", mode="zero2", **hyper):
    _, no_decay = eq.split_groups(model)
    return zt.ShardedOptimizer(model, kind, weight_decay=eq.WEIGHT_DECAY, mode=mode,
                               param_groups=[{"params": no_decay, "weight_decay": 0.0}], **hyper)


def run_steps(model, optimizer, first, count, scheduler=None):
    """Steps first..first+count-1 on this rank's data (one micro-batch each)."""
    for step in range(first, first + count):
        x, y = eq.batch(step, 0, zt.rank())
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()


def parameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same_parameters(a, b):
    return all(torch.equal(a[name], b[name]) for name in a)


def check_zero_equivalence():
    cases = [("sgd", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
             ("adam", torch.optim.Adam, {"lr": 1e-3}),
             ("adamw", torch.optim.AdamW, {"lr": 1e-3})]
    for kind, optimizer_class, hyper in cases:
        model = eq.build_model()
        ddp = DistributedDataParallel(model)
        decay, no_decay = eq.split_groups(model)
        reference = ZeroRedundancyOptimizer(
            [{"params": decay, "weight_decay": eq.WEIGHT_DECAY},
             {"params": no_decay, "weight_decay": 0.0}],
            optimizer_class=optimizer_class, **hyper)
        scheduler = torch.optim.lr_scheduler.LambdaLR(reference, eq.schedule)
        eq.train(model, ddp, reference, scheduler, ddp.no_sync,
                 lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), eq.CLIP))
        reference.consolidate_state_dict(to=0)
        expected = reference.state_dict() if zt.rank() == 0 else None

        model = eq.build_model()
        optimizer = sharded_optimizer(model, kind, clip_grad_norm=eq.CLIP, **hyper)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, eq.schedule)
        eq.train(model, model, optimizer, scheduler, optimizer.no_sync, lambda: None)
        got = optimizer.state_dict(consolidated=True)
        zt.finish(optimizer)
        if zt.rank() == 0:
            worst = compare_states(got, expected)
            lrs_match = [g["lr"] for g in got["param_groups"]] == \
                [g["lr"] for g in expected["param_groups"]]
            ok = not isinstance(worst, str) and worst <= TOLERANCE and lrs_match
            report("zero_equivalence", ok, optimizer=kind, worst_relative=worst,
                   lrs_match=lrs_match, entries=len(got["state"]))


def check_save_load_bitwise():
    for kind, mode, hyper in [("adamw", "zero2", {"lr": 1e-3}), ("adamw", "ddp", {"lr": 1e-3}),
                              ("sgd", "zero1", {"lr": 0.05, "momentum": 0.9})]:
        model = eq.build_model()
        optimizer = sharded_optimizer(model, kind, mode, **hyper)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, eq.schedule)
        run_steps(model, optimizer, 0, STEPS_BEFORE_SAVE, scheduler)
        saved = optimizer.state_dict()
        saved_scheduler = scheduler.state_dict()
        at_save = parameters(model)
        run_steps(model, optimizer, STEPS_BEFORE_SAVE, STEPS_AFTER_SAVE, scheduler)
        first_run = parameters(model)
        first_count = optimizer.last_step.optimizer_step
        optimizer.load_state_dict(saved)
        scheduler.load_state_dict(saved_scheduler)
        restored = same_parameters(parameters(model), at_save)
        run_steps(model, optimizer, STEPS_BEFORE_SAVE, STEPS_AFTER_SAVE, scheduler)
        replayed = same_parameters(parameters(model), first_run)
        count = optimizer.last_step.optimizer_step
        zt.finish(optimizer)
        report("save_load_bitwise", restored and replayed and count == first_count,
               optimizer=kind, mode=mode, saved_step=saved["step"], manifest=saved["manifest"],
               restored=restored, replayed=replayed, optimizer_step=count,
               expected_optimizer_step=first_count)


def global_gradient_step(model, optimizer, step):
    """A plain torch step on every rank's data at once (the mean of the ranks' gradients)."""
    loss = 0.0
    for rank in range(zt.world_size()):
        x, y = eq.batch(step, 0, rank)
        loss = loss + torch.nn.functional.mse_loss(model(x), y) / zt.world_size()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def plain_adamw(model):
    decay, no_decay = eq.split_groups(model)
    return torch.optim.AdamW([{"params": decay, "weight_decay": eq.WEIGHT_DECAY},
                              {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)


def check_torch_round_trip():
    model = eq.build_model()
    optimizer = sharded_optimizer(model, "adamw", lr=1e-3)
    run_steps(model, optimizer, 0, STEPS_BEFORE_SAVE)
    consolidated = optimizer.state_dict(consolidated=True)

    plain_model = eq.build_model()
    plain_model.load_state_dict(parameters(model))
    plain = plain_adamw(plain_model)
    plain.load_state_dict(consolidated)
    global_gradient_step(plain_model, plain, STEPS_BEFORE_SAVE)
    run_steps(model, optimizer, STEPS_BEFORE_SAVE, 1)
    mine, theirs = parameters(model), parameters(plain_model)
    worst = max(relative_difference(mine[n], theirs[n]) for n in theirs)
    report("consolidated_into_torch_adamw", worst <= TOLERANCE, worst_relative=worst)

    # torch's AdamW state (and its parameters) into ours: the same state, and the next steps agree.
    with torch.no_grad():
        for p, q in zip(model.parameters(), plain_model.parameters()):
            p.copy_(q)
    optimizer.load_state_dict(plain.state_dict())
    loaded = compare_states(optimizer.state_dict(consolidated=True), plain.state_dict())
    exact = loaded == 0.0
    for step in range(STEPS_BEFORE_SAVE + 1, STEPS_BEFORE_SAVE + 3):
        global_gradient_step(plain_model, plain, step)
        run_steps(model, optimizer, step, 1)
    mine, theirs = parameters(model), parameters(plain_model)
    worst = max(relative_difference(mine[n], theirs[n]) for n in theirs)
    zt.finish(optimizer)
    report("torch_adamw_into_zeroshard", exact and worst <= TOLERANCE, state_difference=loaded,
           worst_relative=worst)


def other_model():
    """The same parameter names as eq.build_model(), other shapes."""
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 4))


def sharded_of(model, kind, **hyper):
    optimizer = sharded_optimizer(model, kind, **hyper)
    run_steps(model, optimizer, 0, 2)
    saved = optimizer.state_dict()
    zt.finish(optimizer)
    return saved


def check_bad_inputs():
    sgd_saved = sharded_of(eq.build_model(), "sgd", lr=0.05, momentum=0.9)
    other_saved = sharded_of(other_model(), "adamw", lr=1e-3)

    model = eq.build_model()
    optimizer = sharded_optimizer(model, "adamw", lr=1e-3)
    run_steps(model, optimizer, 0, 3)
    sharded = optimizer.state_dict()
    before = optimizer.state_dict(consolidated=True)
    at_start = parameters(model)

    sgd_model = eq.build_model()
    decay, no_decay = eq.split_groups(sgd_model)
    sgd = torch.optim.SGD([{"params": decay}, {"params": no_decay}], lr=0.1, momentum=0.9)
    torch.nn.functional.mse_loss(sgd_model(eq.batch(0, 0, 0)[0]), eq.batch(0, 0, 0)[1]).backward()
    sgd.step()
    wrong_shape = {"state": dict(before["state"]), "param_groups": before["param_groups"]}
    wrong_shape["state"][0] = dict(before["state"][0], exp_avg=torch.zeros(3, 3))
    # torch.optim takes any group values at a load; one the workers cannot take is refused.
    other_decay = {"state": before["state"],
                   "param_groups": [dict(before["param_groups"][0], weight_decay=-0.5),
                                    before["param_groups"][1]]}
    missing = dict(sharded, manifest="/nonexistent-zeroshard/job/step-000000000003/manifest.json")
    cases = [
        ("not_a_dict", [1, 2], "state_dict: a dict expected"),
        ("unknown_layout", {"weights": 1}, "neither ZeroShard's sharded state dict"),
        ("missing_manifest", missing, "does not exist"),
        ("another_optimizer_checkpoint", sgd_saved, "holds SGD state"),
        ("another_model_checkpoint", other_saved, "parameter 4.weight: shape [4, 32]"),
        ("torch_sgd_state", sgd.state_dict(), "['momentum_buffer'] are not adamw's state"),
        ("one_group_instead_of_two", plain_adamw_single(), "param_groups: the state dict has 1"),
        ("wrong_state_shape", wrong_shape, "parameter 0.weight): exp_avg has shape [3, 3]"),
        ("negative_weight_decay", other_decay, "param_groups[0]: weight_decay -0.5 must be"),
    ]
    for case, state_dict, expected_text in cases:
        try:
            optimizer.load_state_dict(state_dict)
            message = None
        except ValueError as e:
            message = str(e)
        ok = message is not None and expected_text in message
        report("bad_input", ok, case=case, message=message)
    # A trainer speaking the protocol itself: a path outside the worker's checkpoint root, or a
    # full state file, without the descriptor it must come as, is refused (issue 24: the worker
    # opens no path on a trainer's word).
    outside = attach_pb2.AttachRequest()
    outside.load_state.manifest = "/tmp/zeroshard-elsewhere/step-000000000003/manifest.json"
    full = attach_pb2.AttachRequest()
    full.load_state.full_state_file = "/tmp/zeroshard-elsewhere/full_state.safetensors"
    raw_cases = [
        ("raw_manifest_outside_root_without_descriptor", outside,
         "outside the worker's checkpoint root"),
        ("raw_full_state_without_descriptor", full, "came without its descriptor"),
    ]
    for case, request, expected_text in raw_cases:
        response, _ = optimizer._connection.call(request)
        message = response.state_loaded.refused
        report("bad_input", expected_text in message, case=case, message=message)
    unchanged = same_parameters(parameters(model), at_start) and \
        compare_states(optimizer.state_dict(consolidated=True), before) == 0.0
    run_steps(model, optimizer, 3, 1)
    zt.finish(optimizer)
    report("bad_inputs_changed_nothing", unchanged, still_steps=optimizer.last_step is not None)


def plain_adamw_single():
    model = eq.build_model()
    return torch.optim.AdamW(model.parameters(), lr=1e-3).state_dict()


def step_of_last_layer_only(model, optimizer, step):
    """One step in which only the model's last Linear gets a gradient (set_to_none=True before):
    the other parameters are skipped and keep their step counts (issue 26), so the checkpoint's
    per-tensor steps differ and must survive the resharding."""
    optimizer.zero_grad(set_to_none=True)
    x, y = eq.batch(step, 0, zt.rank())
    torch.nn.functional.mse_loss(model[-1](torch.tanh(x.repeat(1, 2))), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def save_for_other_world_size(directory):
    model = eq.build_model()
    optimizer = sharded_optimizer(model, "adamw", lr=1e-3)
    run_steps(model, optimizer, 0, STEPS_BEFORE_SAVE)
    step_of_last_layer_only(model, optimizer, STEPS_BEFORE_SAVE)
    sharded = optimizer.state_dict()
    consolidated = optimizer.state_dict(consolidated=True)  # the same step: the same checkpoint
    same_checkpoint = sharded == {k: v for k, v in optimizer.state_dict().items()}
    if zt.rank() == 0:
        step_dir = os.path.dirname(sharded["manifest"])
        copy = os.path.join(directory, "checkpoints", os.path.basename(step_dir))
        shutil.copytree(step_dir, copy)
        torch.save({"sharded": dict(sharded, manifest=os.path.join(copy, "manifest.json")),
                    "consolidated": consolidated, "parameters": parameters(model)},
                   os.path.join(directory, "saved.pt"))
    zt.finish(optimizer)
    report("saved_for_other_world_size", same_checkpoint, world_size=zt.world_size(),
           step=sharded["step"])


def load_from_other_world_size(directory):
    saved = torch.load(os.path.join(directory, "saved.pt"))
    torch.manual_seed(99)  # other initial values: the load must replace them
    model = eq.build_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    optimizer = sharded_optimizer(model, "adamw", lr=1e-3)
    optimizer.load_state_dict(saved["sharded"])
    restored = same_parameters(parameters(model), saved["parameters"])
    # Each parameter's own step, as saved (the last layer's one more than the others').
    steps = [int(entry["step"]) for _, entry in sorted(saved["consolidated"]["state"].items())]
    state = compare_states(optimizer.state_dict(consolidated=True), saved["consolidated"])
    run_steps(model, optimizer, STEPS_BEFORE_SAVE + 1, 1)
    count = optimizer.last_step.optimizer_step
    steps_after = [int(entry["step"])
                   for _, entry in sorted(optimizer.state_dict(consolidated=True)["state"].items())]
    zt.finish(optimizer)
    # The state's indices count the optimizer's parameters group by group; the last Linear
    # ("4.") was stepped once more.
    name_of = {id(p): name for name, p in model.named_parameters()}
    expected_steps = [STEPS_BEFORE_SAVE + (1 if name_of[id(p)].startswith("4.") else 0)
                      for group in optimizer.param_groups for p in group["params"]]
    report("loaded_from_other_world_size", restored and state == 0.0 and
           count == STEPS_BEFORE_SAVE + 2 and steps == expected_steps and
           steps_after == [step + 1 for step in steps], world_size=zt.world_size(),
           saved_world_size=saved["sharded"]["world_size"], parameters_restored=restored,
           state_difference=state, optimizer_step=count, tensor_steps=steps,
           tensor_steps_after=steps_after)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", default=None)
    parser.add_argument("--load", default=None)
    args = parser.parse_args()
    zt.init()
    if args.save:
        save_for_other_world_size(args.save)
    elif args.load:
        load_from_other_world_size(args.load)
    else:
        dist.init_process_group("gloo")
        check_zero_equivalence()
        dist.destroy_process_group()
        check_save_load_bitwise()
        check_torch_round_trip()
        check_bad_inputs()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
