#!/usr/bin/env python3
"""ZeroShard's AdamW against torch.optim.AdamW: 20-step jobs on a real local cluster, with and
without a no-decay group for the biases, compared with Debian's torch on the same model and data.

Runs as the command of deploy/local/cluster.py (torch_adamw_test.sh starts it), which sets
ZEROSHARD_CLI, ZEROSHARD_COORDINATOR, ZEROSHARD_LOG_DIR and ZEROSHARD_WORKERS. Jobs go in as JSON
spec files through the `zeroshard` CLI, and their final parameters come out through `zeroshard
export` (safetensors with torch's names, read with tools/safetensors_file.py).
"""

import fnmatch
import json
import os
import subprocess
import sys

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools", "reference"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
import safetensors_file  # noqa: E402  (no PyPI package in CI)
import workload_reference  # noqa: E402  (the generator of docs/workloads.md, bit for bit)

LAYERS = [10, 64, 10]  # the `seed` preset
SEED = 0
DATASET_SIZE = 1024
GLOBAL_BATCH = 128
STEPS = 20
# ZeroShard's specs set only the optimizer's kind and lr: its AdamW defaults must be torch's.
LR = 0.01
TORCH_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
NO_DECAY_GROUP = {"patterns": ["*.bias"], "weight_decay": 0}
# The smallest bucket size allowed: the seed model's 1,408 padded slots make 2 buckets and
# 0.weight spans both, so each tensor's weight decay reaches the kernels per piece.
BUCKET_ELEMS = 1024
JOB_TIMEOUT_S = 120
# Both are checked against torch and against each other (bitwise).
MODES = ("ddp", "zero2")

# Both sides compute forward and backward in float32 with different summation orders (OpenBLAS
# against torch's kernels), and AdamW's update rounds in a different order of operations, so
# each step may leave the two an ulp or so apart; 20 steps stay well inside 1e-6 of the largest
# |parameter| (measured: about 2.5e-7). Losses agree to 1e-6 relative (measured: 1.6e-7).
PARAM_TOLERANCE = 1e-6
LOSS_TOLERANCE = 1e-6
# The runs with and without the no-decay group must differ by at least this many tolerances.
GROUPS_MATTER_FACTOR = 100


class CheckFailed(Exception):
    pass


def catalog_order():
    """sharding/model_catalog.cc's tensor order (gradient-ready): last layer first, bias before
    weight, named as torch's nn.Sequential names them (Linear layer l is module 2l)."""
    names = []
    for layer in reversed(range(len(LAYERS) - 1)):
        names += [f"{2 * layer}.bias", f"{2 * layer}.weight"]
    return names


def group_of(name, groups):
    """The first group with a pattern matching `name` (fnmatch, as jobspec::GroupOf), or None."""
    for index, group in enumerate(groups):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in group["patterns"]):
            return index
    return None


def mlp(role):
    """nn.Sequential(Linear, ReLU, Linear) holding the generator's initial tensors of `role`."""
    modules = []
    for layer in range(len(LAYERS) - 1):
        linear = torch.nn.Linear(LAYERS[layer], LAYERS[layer + 1])
        with torch.no_grad():
            for kind, is_bias in (("weight", False), ("bias", True)):
                values = workload_reference.layer_tensor(role, LAYERS, SEED, layer, is_bias)
                getattr(linear, kind).copy_(torch.from_numpy(np.ascontiguousarray(values)))
        modules.append(linear)
        if layer + 2 < len(LAYERS):
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def torch_run(groups):
    """Trains with torch.optim.AdamW on ZeroShard's global batches; (final params, losses)."""
    student = mlp(workload_reference.ROLE_STUDENT)
    teacher = mlp(workload_reference.ROLE_TEACHER)
    samples = torch.from_numpy(workload_reference.inputs(LAYERS, SEED, 0, DATASET_SIZE))
    members = [[] for _ in groups]
    default = []
    for name, param in student.named_parameters():
        index = group_of(name, groups)
        (default if index is None else members[index]).append(param)
    param_groups = [{"params": default}] if default else []
    for group, params in zip(groups, members):
        if params:
            param_groups.append({"params": params, "weight_decay": float(group["weight_decay"])})
    optimizer = torch.optim.AdamW(param_groups, lr=LR, **TORCH_DEFAULTS)
    loss_fn = torch.nn.MSELoss()
    losses = []
    for step in range(STEPS):
        indices = (step * GLOBAL_BATCH + torch.arange(GLOBAL_BATCH)) % DATASET_SIZE
        x = samples[indices]
        with torch.no_grad():
            y = teacher(x)
        optimizer.zero_grad()
        loss = loss_fn(student(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    state = student.state_dict()
    flat = np.concatenate([state[name].detach().numpy().ravel() for name in catalog_order()])
    return flat.astype(np.float32), losses


def cli(*args, timeout=60):
    command = [os.environ["ZEROSHARD_CLI"], f"--coordinator={os.environ['ZEROSHARD_COORDINATOR']}",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def zeroshard_run(name, mode, groups):
    """Submits the job as a JSON spec file, follows it to the end; (final params, losses)."""
    spec = {
        "name": name,
        "workload": {"preset": "seed", "dataset_size": DATASET_SIZE},
        "optimizer": {"kind": "ADAMW", "lr": LR},
        "mode": mode.upper(),
        "min_workers": int(os.environ["ZEROSHARD_WORKERS"]),
        "max_workers": int(os.environ["ZEROSHARD_WORKERS"]),
        "steps": STEPS,
        "global_batch": GLOBAL_BATCH,
        "seed": SEED,
        "bucket_elems": BUCKET_ELEMS,
        "param_groups": groups,
    }
    spec_path = os.path.join(os.environ["ZEROSHARD_LOG_DIR"], f"{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    submitted = cli("submit", spec_path)
    if submitted.returncode != 0:
        raise CheckFailed(f"{name}: submit failed: {submitted.stderr.strip()}")
    job_id = submitted.stdout.strip().splitlines()[-1]
    watched = cli("watch", job_id, "--output=json", timeout=JOB_TIMEOUT_S)
    losses = {}
    final_state = None
    for line in watched.stdout.splitlines():
        event = json.loads(line)
        if event.get("type") == "PROGRESS":
            progress = event["progress"]
            losses[int(progress["step"])] = float(progress.get("loss", 0.0))
        elif event.get("type") == "STATE_CHANGED":
            final_state = (event.get("state"), event.get("message", ""))
    if watched.returncode != 0 or final_state is None or final_state[0] != "SUCCEEDED":
        raise CheckFailed(f"{name} ({job_id}) did not succeed: {final_state} "
                          f"{watched.stderr.strip()}")
    if sorted(losses) != list(range(1, STEPS + 1)):
        raise CheckFailed(f"{name} ({job_id}): progress for steps {sorted(losses)}")
    # Every rank commits the final checkpoint before it reports its last step, so the job's final
    # state exists once it succeeded.
    path = os.path.join(os.environ["ZEROSHARD_LOG_DIR"], f"{job_id}.safetensors")
    exported = cli("export", job_id, f"--output={path}")
    if exported.returncode != 0:
        raise CheckFailed(f"{name} ({job_id}): export failed: {exported.stderr.strip()}")
    tensors, _ = safetensors_file.read_safetensors(path)
    state = safetensors_file.to_torch(tensors)
    # torch's names and shapes: the file loads into the model strictly.
    mlp(workload_reference.ROLE_STUDENT).load_state_dict(state, strict=True)
    params = np.concatenate([state[tensor].numpy().ravel() for tensor in catalog_order()])
    return params, [losses[step] for step in range(1, STEPS + 1)]


def max_abs_diff(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def main():
    torch.set_num_threads(1)
    expected_params = sum(LAYERS[i] * LAYERS[i + 1] + LAYERS[i + 1] for i in range(len(LAYERS) - 1))
    configs = {"torch-default": [], "no-decay-biases": [NO_DECAY_GROUP]}
    reference = {label: torch_run(groups) for label, groups in configs.items()}
    tolerance = PARAM_TOLERANCE * float(np.max(np.abs(reference["torch-default"][0])))
    failures = []
    finals = {}
    for label, groups in configs.items():
        torch_params, torch_losses = reference[label]
        for mode in MODES:
            params, losses = zeroshard_run(f"adamw-{label}-{mode}", mode, groups)
            if params.size != expected_params:
                failures.append(f"{label} {mode}: {params.size} parameters, "
                                f"expected {expected_params}")
                continue
            finals[(label, mode)] = params
            diff = max_abs_diff(params, torch_params)
            # zip below would silently compare only a prefix of the losses.
            assert len(losses) == len(torch_losses) == STEPS, (len(losses), len(torch_losses))
            loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, torch_losses))
            verdict = "ok" if diff <= tolerance and loss_diff <= LOSS_TOLERANCE else "FAIL"
            print(f"{verdict} {label} {mode}: max|param - torch| = {diff:.3g} "
                  f"(tolerance {tolerance:.3g}), losses within {loss_diff:.3g} relative "
                  f"(tolerance {LOSS_TOLERANCE:g}); loss {losses[0]:.6g} -> {losses[-1]:.6g}, "
                  f"torch {torch_losses[0]:.6g} -> {torch_losses[-1]:.6g}", flush=True)
            if verdict != "ok":
                failures.append(f"{label} {mode} differs from torch")
        if (label, MODES[0]) in finals and (label, MODES[1]) in finals:
            if not np.array_equal(finals[(label, MODES[0])], finals[(label, MODES[1])]):
                failures.append(f"{label}: {MODES[0]} and {MODES[1]} are not bitwise equal")

    # The group must matter: the two configurations end far more than the tolerance apart, on
    # both sides.
    effects = {"torch": (reference["torch-default"][0], reference["no-decay-biases"][0])}
    for mode in MODES:
        if ("torch-default", mode) in finals and ("no-decay-biases", mode) in finals:
            effects[f"zeroshard {mode}"] = (finals[("torch-default", mode)],
                                            finals[("no-decay-biases", mode)])
    for side, (without_group, with_group) in effects.items():
        effect = max_abs_diff(without_group, with_group)
        print(f"{side}: the no-decay group moves the final parameters by up to {effect:.3g} "
              f"({effect / tolerance:.0f} tolerances)", flush=True)
        if effect < GROUPS_MATTER_FACTOR * tolerance:
            failures.append(f"{side}: with and without the no-decay group differ by only "
                            f"{effect:.3g} (< {GROUPS_MATTER_FACTOR} tolerances)")
    if failures:
        raise CheckFailed("; ".join(failures))
    print("PASS: ZeroShard's AdamW matches torch.optim.AdamW with and without the no-decay group")


def print_cluster_log_tails():
    log_dir = os.environ.get("ZEROSHARD_LOG_DIR", "")
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        if name.endswith(".log"):
            with open(os.path.join(log_dir, name), errors="replace") as f:
                lines = f.read().splitlines()[-15:]
            print(f"--- last lines of {name} ---", file=sys.stderr)
            for line in lines:
                print(f"    {line}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except (CheckFailed, AssertionError, subprocess.TimeoutExpired) as e:
        print(f"FAIL: {e}", file=sys.stderr)
        print_cluster_log_tails()
        sys.exit(1)
