"""state_dict() and load_state_dict() of an attached zeroshard.torch.ShardedOptimizer: the
sharded state dict (the workers' checkpoint, named by its manifest), the consolidated one read
back in torch.optim's format, and loading either (a sharded one through the checkpoint's
directory, a torch.optim-format one through a full state file the workers restore from).
"""

import os
import shutil
import tempfile
import warnings

import torch

from zeroshard import _checkpoint
from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._torch_job_spec import OPTIMIZERS


def _retired_copy(manifest, commit_time):
    """The superseded-step-* directory beside `manifest`'s step directory that holds the
    checkpoint committed at `commit_time` (else the latest retired copy, or None)."""
    copies = _checkpoint.superseded_copies(manifest)
    for copy in copies:
        try:
            moved = _checkpoint.read_manifest(os.path.join(copy, _checkpoint.MANIFEST_FILE_NAME))
        except ValueError:
            continue
        if moved.commit_time.ToJsonString() == commit_time:
            return copy
    return copies[-1] if copies else None


class OptimizerState:
    """The state dicts of one attachment: `settings` (JobSettings), the optimizer's live
    `param_groups`, its constructor `lr`, the JobPlan, the attach connection and the job's id.
    Both calls are collective and run between steps (the caller checks). Thread contract: the
    training thread only."""

    def __init__(self, settings, param_groups, lr, plan, connection, job_id):
        self._settings = settings
        self._param_groups = param_groups
        self._lr = lr
        self._plan = plan
        self._connection = connection
        self._job_id = job_id
        # The checkpoints this process's state_dict() calls named: manifest path -> commit time.
        # A load that retires one of them says so (a sharded dict naming it no longer loads).
        self._saved_checkpoints = {}
        # zero3: ShardedParameters.parameter_stream, the parameters' values for a torch-format
        # load (they are not in the trainer between uses); None: read them from the model.
        self.parameter_stream = None

    # ---- torch.optim's format ----

    def _torch_optimizer(self, groups):
        """torch.optim's optimizer of this kind and hyperparameters over `groups`; None for lion
        (torch.optim has none)."""
        h = self._settings.hyper
        kind = self._settings.kind
        if kind == "sgd":
            kwargs = {"momentum": h["momentum"], "dampening": h["dampening"],
                      "nesterov": h["nesterov"], "maximize": h["maximize"]}
            if h["nesterov"] and not h["momentum"]:
                kwargs["nesterov"] = False  # torch refuses it; without momentum it is moot
            optimizer_class = torch.optim.SGD
        elif kind in ("adam", "adamw"):
            kwargs = {"betas": h["betas"], "eps": h["eps"], "amsgrad": h["amsgrad"],
                      "maximize": h["maximize"]}
            optimizer_class = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        elif kind == "adagrad":
            kwargs = {"lr_decay": h["lr_decay"], "eps": h["eps"], "maximize": h["maximize"],
                      "initial_accumulator_value": h["initial_accumulator_value"]}
            optimizer_class = torch.optim.Adagrad
        else:
            return None
        return optimizer_class(groups, lr=self._lr, **kwargs)

    def _torch_layout(self):
        """What torch.optim's optimizer of this kind would put in its state_dict(), found by
        running one (features, not versions): the param_groups (every hyperparameter this torch
        has, this optimizer's lr and weight_decay and scheduler keys, params as indices in this
        optimizer's group order), one parameter's state after a step (its keys in torch's
        order, "step" as torch stores it, None where torch keeps None), and the state torch
        makes for a parameter before its first step (Adagrad's: step 0 and the initial sum; {}
        for the optimizers that make it at the first step)."""
        dummies = [{"params": [torch.zeros(1, requires_grad=True) for _ in group["params"]],
                    "lr": group["lr"], "weight_decay": group["weight_decay"]}
                   for group in self._param_groups]
        reference = self._torch_optimizer(dummies)
        if reference is None:  # lion: torch's conventions, our names (kernels/optimizer.h)
            groups = []
            first = 0
            for group in self._param_groups:
                groups.append({"lr": group["lr"], "betas": group["betas"],
                               "weight_decay": group["weight_decay"],
                               "maximize": self._settings.hyper["maximize"],
                               "params": list(range(first, first + len(group["params"])))})
                first += len(group["params"])
            template = {"step": torch.tensor(0.0), "exp_avg": torch.zeros(1)}
            initial = {}
        else:
            groups = reference.state_dict()["param_groups"]
            probe = torch.zeros(1, requires_grad=True)
            probe_optimizer = self._torch_optimizer([{"params": [probe]}])
            initial = {key: value.clone() if torch.is_tensor(value) else value for key, value
                       in probe_optimizer.state_dict()["state"].get(0, {}).items()}
            probe.grad = torch.ones(1)
            probe_optimizer.step()
            template = probe_optimizer.state_dict()["state"].get(0, {})
        for ours, theirs in zip(self._param_groups, groups):
            theirs.update({key: value for key, value in ours.items() if key != "params"})
        return groups, template, initial

    def _name_of(self, p):
        return self._plan.names[self._plan.index[id(p)]]

    # ---- state_dict ----

    def state_dict(self, consolidated):
        """ShardedOptimizer.state_dict(consolidated): the workers save the current step's
        checkpoint; the dict names it, or holds it read back in torch.optim's format."""
        request = attach_pb2.AttachRequest()
        request.save_state.SetInParent()
        response, _ = self._connection.call(request)
        saved = response.state_saved
        if saved.refused:
            raise RuntimeError(f"state_dict: the worker could not save the state: {saved.refused}")
        groups, template, initial = self._torch_layout()
        if not consolidated:
            manifest = _checkpoint.read_manifest(saved.manifest, expected_job_id=self._job_id)
            self._saved_checkpoints[saved.manifest] = manifest.commit_time.ToJsonString()
            return {"zeroshard_checkpoint": 1, "job_id": self._job_id, "step": saved.step,
                    "optimizer_step": saved.optimizer_step, "optimizer": self._settings.kind,
                    "mode": self._settings.mode, "manifest": saved.manifest,
                    "commit_time": manifest.commit_time.ToJsonString(),
                    "world_size": saved.world_size, "param_groups": groups}
        header, full = _checkpoint.read_full_state(saved.manifest, expected_job_id=self._job_id)
        # Each tensor's own step (a tensor skipped in steps without a gradient counts fewer);
        # torch.optim holds no state for a parameter it never updated.
        steps = {tensor.name: header.optimizer_step for tensor in header.tensors}
        if header.tensor_steps:
            steps = {tensor.name: step
                     for tensor, step in zip(header.tensors, header.tensor_steps)}
        state = {}
        index = 0
        for group in self._param_groups:
            for p in group["params"]:
                entry = self._torch_state(p, steps[self._name_of(p)], template, initial, full,
                                          saved.manifest)
                if entry is not None:
                    state[index] = entry
                index += 1
        return {"state": state, "param_groups": groups}

    def _torch_state(self, p, step, template, initial, full, manifest):
        """Parameter p's entry in torch.optim's state at its `step`; None where torch holds
        none (never updated)."""
        if step == 0 and initial:
            # Never updated, with an optimizer that makes its state before the first step
            # (Adagrad): torch's initial state.
            return {key: value if not torch.is_tensor(value) or key == "step"
                    else torch.full(self._plan.shape_of(p), float(value.reshape(-1)[0]))
                    for key, value in initial.items()}
        if not (step > 0 and template):
            return None
        name = self._name_of(p)
        entry = {}
        for key, value in template.items():
            if key == "step":
                entry[key] = (torch.tensor(float(step), dtype=value.dtype)
                              if torch.is_tensor(value) else type(value)(step))
            elif value is None:
                entry[key] = None
            else:
                if key not in full:
                    raise RuntimeError(f"state_dict: the checkpoint {manifest} holds no {key} "
                                       "state")
                entry[key] = full[key][name].view(self._plan.shape_of(p)).clone()
        return entry

    # ---- load_state_dict ----

    def load(self, state_dict):
        """ShardedOptimizer.load_state_dict(state_dict); ValueError naming what does not fit,
        nothing changed then."""
        if not isinstance(state_dict, dict):
            raise ValueError(f"state_dict: a dict expected, got {type(state_dict).__name__}")
        if "zeroshard_checkpoint" in state_dict:
            self._load_sharded(state_dict)
        elif "state" in state_dict and "param_groups" in state_dict:
            self._load_torch_format(state_dict)
        else:
            raise ValueError(
                "state_dict: neither ZeroShard's sharded state dict (zeroshard_checkpoint, "
                "manifest, ...) nor torch.optim's (state, param_groups); its keys: "
                f"{sorted(map(str, state_dict))}")
        self._warn_retired()

    def _warn_retired(self):
        """After a load: a warning naming each checkpoint that this process's state_dict()
        returned a sharded dict for and that the load retired (never silently)."""
        for manifest, commit_time in list(self._saved_checkpoints.items()):
            try:
                now = _checkpoint.read_manifest(manifest).commit_time.ToJsonString()
            except ValueError:
                now = None
            if now == commit_time:
                continue
            del self._saved_checkpoints[manifest]
            copies = _checkpoint.superseded_copies(manifest)
            warnings.warn(
                f"load_state_dict retired the job's checkpoint {manifest} (committed "
                f"{commit_time}; now {copies[-1] if copies else 'moved aside'}): a sharded state "
                f"dict naming it no longer loads. The rule: {_checkpoint.RETIREMENT_RULE}",
                RuntimeWarning, stacklevel=4)

    def _check_groups(self, saved_groups):
        """ValueError naming the group when `saved_groups` cannot be this optimizer's."""
        self._check_group_layout(saved_groups)
        self._check_group_hyperparameters(saved_groups)

    def _check_group_layout(self, saved_groups):
        param_groups = self._param_groups
        if not isinstance(saved_groups, list) or len(saved_groups) != len(param_groups):
            count = len(saved_groups) if isinstance(saved_groups, list) else "no list of"
            raise ValueError(f"param_groups: the state dict has {count} groups, this optimizer "
                             f"{len(param_groups)}")
        for index, (saved, group) in enumerate(zip(saved_groups, param_groups)):
            if not isinstance(saved, dict) or not isinstance(saved.get("params"), list):
                raise ValueError(f"param_groups[{index}]: not a dict with a params list")
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"param_groups[{index}]: {len(saved['params'])} parameters in "
                                 f"the state dict, {len(group['params'])} in this optimizer")

    def _check_group_hyperparameters(self, saved_groups):
        """The saved groups' values replace this optimizer's at the load, as torch.optim's
        load_state_dict does: ValueError naming the group and key for one the job cannot take
        (a fixed key that differs, momentum to or from 0, a value out of range)."""
        for index, saved in enumerate(saved_groups):
            merged = dict(self._param_groups[index])
            merged.update({key: value for key, value in saved.items() if key != "params"})
            self._settings.group_values(index, merged)

    def _apply_groups(self, saved_groups):
        for saved, group in zip(saved_groups, self._param_groups):
            group.update({key: value for key, value in saved.items() if key != "params"})

    def _check_checkpoint(self, state_dict):
        """The checkpoint a sharded state dict names, checked against this optimizer: its
        manifest path; ValueError naming what does not fit."""
        if state_dict["zeroshard_checkpoint"] != 1:
            raise ValueError(f"zeroshard_checkpoint: version {state_dict['zeroshard_checkpoint']}"
                             ", this version reads 1")
        for key in ("manifest", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"state_dict: no '{key}' (a sharded state dict has it)")
        manifest = state_dict["manifest"]
        if not isinstance(manifest, str) or not os.path.isabs(manifest):
            raise ValueError(f"manifest: {manifest!r} is not an absolute path")
        # The manifest must be the one of the job the state dict names (it may be another job
        # than this one: loading another job's checkpoint is allowed when named so).
        saved_time = state_dict.get("commit_time")
        try:
            committed, header = _checkpoint.read_header(
                manifest, expected_job_id=state_dict.get("job_id"))
        except ValueError as e:
            retired = _retired_copy(manifest, saved_time)
            if retired is None:
                raise
            raise ValueError(f"manifest: {manifest} does not exist: the job retired this "
                             f"checkpoint (now {retired}). The rule: "
                             f"{_checkpoint.RETIREMENT_RULE}") from e
        # A job that went back past this step and ran it again retired the state dict's checkpoint
        # (superseded, moved aside) and committed another one under the same name.
        if saved_time is not None and committed.commit_time.ToJsonString() != saved_time:
            retired = _retired_copy(manifest, saved_time)
            raise ValueError(f"manifest: {manifest} now holds another checkpoint of step "
                             f"{committed.step} (committed {committed.commit_time.ToJsonString()})"
                             f" than this state dict's (committed {saved_time}): the job retired "
                             f"the state dict's checkpoint{f' (now {retired})' if retired else ''}"
                             f" and ran that step again. The rule: {_checkpoint.RETIREMENT_RULE}")
        plan = self._plan
        if len(header.tensors) != len(plan.params):
            raise ValueError(f"manifest: the checkpoint {manifest} holds {len(header.tensors)} "
                             f"tensors, this model {len(plan.params)} (another model)")
        for name, p, saved in zip(plan.names, plan.params, header.tensors):
            if saved.name != name or list(saved.shape) != list(self._plan.shape_of(p)):
                raise ValueError(f"parameter {name}: shape {list(self._plan.shape_of(p))}, but the checkpoint "
                                 f"{manifest} has {saved.name} of shape {list(saved.shape)} "
                                 "(another model)")
        if header.optimizer != OPTIMIZERS[self._settings.kind]:
            raise ValueError(f"optimizer: the checkpoint {manifest} holds "
                             f"{job_pb2.OptimizerKind.Name(header.optimizer)} state, this "
                             f"optimizer is {self._settings.kind}")
        return manifest

    def _load_sharded(self, state_dict):
        manifest = self._check_checkpoint(state_dict)
        self._check_groups(state_dict["param_groups"])
        request = attach_pb2.AttachRequest()
        request.load_state.manifest = manifest
        # The worker reads the checkpoint through the step directory this process opens (with
        # its own permissions): it opens no path outside its checkpoint root on our word.
        step_dir = os.path.dirname(manifest)
        try:
            step_dir_fd = os.open(step_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise ValueError(f"manifest: cannot open the checkpoint's directory {step_dir}: "
                             f"{e}") from e
        try:
            response, _ = self._connection.call(request, pass_fd=step_dir_fd)
        finally:
            os.close(step_dir_fd)
        if response.state_loaded.refused:
            raise ValueError(f"manifest: the workers refused {manifest}: "
                             f"{response.state_loaded.refused}")
        self._apply_groups(state_dict["param_groups"])

    def _torch_format_arrays(self, saved_groups, saved_state):
        """The arrays and steps of a torch.optim-format state: ({"<key>/<name>": tensor},
        {name: its step, None where the optimizer keeps none}, whether any state is there);
        ValueError naming the entry that does not fit."""
        _, template, _ = self._torch_layout()
        kind = self._settings.kind
        arrays_needed = [key for key, value in template.items()
                         if key != "step" and value is not None]
        # The saved indices name this optimizer's parameters group by group, as torch maps them.
        ours = [p for group in self._param_groups for p in group["params"]]
        param_of = dict(zip([i for group in saved_groups for i in group["params"]], ours))
        for index in saved_state:
            if index not in param_of:
                raise ValueError(f"state: parameter index {index} is in no param group")
        arrays = {}
        steps = {}
        for index, p in param_of.items():
            name = self._name_of(p)
            entry = saved_state.get(index) or {}
            if not isinstance(entry, dict):
                raise ValueError(f"state[{index}] (parameter {name}): not a dict")
            unknown = set(entry) - set(template) - {"step"}
            if unknown:
                raise ValueError(f"state[{index}] (parameter {name}): {sorted(unknown)} are not "
                                 f"{kind}'s state (another optimizer's dict?)")
            if not entry:
                # Never updated (torch.optim skipped it every step): its own step is 0, and its
                # first update initialises its state.
                for key in arrays_needed:
                    arrays[f"{key}/{name}"] = torch.zeros(self._plan.shape_of(p).numel())
                steps[name] = 0
                continue
            for key in arrays_needed:
                value = entry.get(key)
                if not torch.is_tensor(value):
                    raise ValueError(f"state[{index}] (parameter {name}): no {key} tensor "
                                     f"({kind} needs {arrays_needed})")
                if value.numel() != self._plan.shape_of(p).numel():
                    raise ValueError(f"state[{index}] (parameter {name}): {key} has shape "
                                     f"{list(value.shape)}, the parameter {list(self._plan.shape_of(p))}")
                arrays[f"{key}/{name}"] = value.detach().to("cpu", torch.float32)
            if "step" in template:
                if "step" not in entry:
                    raise ValueError(f"state[{index}] (parameter {name}): no step")
                step = int(float(entry["step"]))
                if step < 0:
                    raise ValueError(f"state[{index}] (parameter {name}): step {step} < 0")
                steps[name] = step
            else:
                steps[name] = None  # SGD keeps no step: the optimizer's
        return arrays, steps, any(saved_state.values())

    def _load_torch_format(self, state_dict):
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_state, dict):
            raise ValueError(f"state: a dict expected, got {type(saved_state).__name__}")
        self._check_group_layout(saved_groups)
        arrays, steps, has_state = self._torch_format_arrays(saved_groups, saved_state)
        self._check_group_hyperparameters(saved_groups)
        counted = [step for step in steps.values() if step is not None]
        optimizer_step = max(counted) if counted else (1 if has_state else 0)
        # Each tensor's own step, sent only when one differs from the optimizer's.
        tensor_steps = [optimizer_step if steps.get(name) is None else steps[name]
                        for name in self._plan.names]
        deferred, produce = (), None
        if self.parameter_stream is not None:
            # zero3: the parameters, a gathered module at a time, straight into the file.
            order, produce = self.parameter_stream()
            deferred = [(f"param/{self._plan.names[t]}", self._plan.shape_of(
                self._plan.params[t]).numel()) for t in order]
        else:
            for name, p in zip(self._plan.names, self._plan.params):
                arrays[f"param/{name}"] = p.detach()
        request = attach_pb2.AttachRequest()
        request.load_state.optimizer_step = optimizer_step
        if counted:
            # The job's step follows the state's (none: SGD, or no step taken yet).
            request.load_state.step = max(counted)
        if any(step != optimizer_step for step in tensor_steps):
            request.load_state.tensor_steps.extend(tensor_steps)
        response = self._send_full_state(request, arrays, deferred, produce)
        if response.state_loaded.refused:
            raise ValueError(f"state: the workers refused it: {response.state_loaded.refused}")
        self._apply_groups(saved_groups)

    def _send_full_state(self, request, arrays, deferred=(), produce=None):
        """`request` (a load_state) with `arrays` in a full state file, passed to the worker
        open (it never opens a path a trainer names); the worker's response."""
        directory = tempfile.mkdtemp(prefix="zeroshard-state-")
        path = os.path.join(directory, "full_state.safetensors")
        try:
            _checkpoint.write_full_state(path, arrays, deferred, produce)
            request.load_state.full_state_file = path
            state_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                response, _ = self._connection.call(request, pass_fd=state_fd)
            finally:
                os.close(state_fd)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return response
