"""The job a zeroshard.torch.ShardedOptimizer submits: its settings (optimizer kind, mode, the
hyperparameters the job fixes), its param groups as checked and held, the plan of tensors
(names, gradient-ready order, device) and the JobSpec built from them, and the names of a model's
parameters (tied weights' aliases). Pure functions of the model and the groups: nothing here
talks to a coordinator or a worker.
"""

import inspect
import math

import torch

from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2

OPTIMIZERS = {
    "sgd": job_pb2.SGD,
    "adam": job_pb2.ADAM,
    "adamw": job_pb2.ADAMW,
    "adagrad": job_pb2.ADAGRAD,
    "lion": job_pb2.LION,
}
MODES = {"ddp": job_pb2.DDP, "zero1": job_pb2.ZERO1, "zero2": job_pb2.ZERO2,
         "zero3": job_pb2.ZERO3}
# The numeric hyperparameters each optimizer reads from its param groups at every step, as
# torch.optim does (besides lr and weight_decay): scripts and schedulers may change them.
GROUP_KEYS = {"sgd": ("momentum", "dampening"), "adam": ("betas", "eps"),
              "adamw": ("betas", "eps"), "adagrad": ("eps",), "lion": ("betas",)}
# Hyperparameters a group holds that the job fixes when it is submitted (they decide the state's
# shape or are not read per group by the workers): changing one raises, naming it.
FIXED_KEYS = {"sgd": ("nesterov", "maximize"), "adam": ("amsgrad", "maximize"),
              "adamw": ("amsgrad", "maximize"),
              "adagrad": ("lr_decay", "initial_accumulator_value", "maximize"),
              "lion": ("maximize",)}
# torch.optim's default weight decay per optimizer (AdamW decays by default).
_DEFAULT_WEIGHT_DECAY = {"sgd": 0.0, "adam": 0.0, "adamw": 1e-2, "adagrad": 0.0, "lion": 0.0}
_TORCH_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad"}


def default_eps(kind):
    """The installed torch.optim class's default eps for `kind` (Adagrad's is 1e-10, Adam's
    1e-8); 1e-8 where it has none (sgd and lion do not read it)."""
    class_name = _TORCH_CLASSES.get(kind)
    if class_name is not None:
        parameter = inspect.signature(getattr(torch.optim, class_name)).parameters.get("eps")
        if parameter is not None and isinstance(parameter.default, float):
            return parameter.default
    return 1e-8


class JobSettings:
    """What the job fixes for every group: the optimizer kind, the mode, the hyperparameters
    (state_dict's param_groups, load_state_dict's checks) and the rest of the job spec's options.
    Thread contract: immutable once built."""

    def __init__(self, optimizer, mode, weight_decay, eps, betas, momentum, dampening, nesterov,
                 amsgrad, maximize, lr_decay, initial_accumulator_value, clip_grad_norm,
                 bucket_elems, checkpoint_every, checkpoint_keep, max_attempts):
        """ValueError naming the argument the job cannot take."""
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: '{optimizer}' is not one of {sorted(OPTIMIZERS)}")
        if mode not in MODES:
            raise ValueError(f"mode: '{mode}' is not one of {sorted(MODES)}")
        if weight_decay is None:
            weight_decay = _DEFAULT_WEIGHT_DECAY[optimizer]
        if eps is None:
            eps = default_eps(optimizer)
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: {checkpoint_every}, must be >= 0 (0: none)")
        if max_attempts < 1:
            raise ValueError(f"max_attempts: {max_attempts}, must be >= 1")
        self.kind = optimizer
        self.mode = mode
        self.weight_decay = weight_decay
        self.hyper = {"betas": (float(betas[0]), float(betas[1])), "eps": float(eps),
                      "momentum": float(momentum), "dampening": float(dampening),
                      "nesterov": bool(nesterov), "amsgrad": bool(amsgrad),
                      "maximize": bool(maximize), "lr_decay": float(lr_decay),
                      "initial_accumulator_value": float(initial_accumulator_value)}
        # The rest of the job spec, written when the job is submitted.
        self.options = {"clip_grad_norm": clip_grad_norm, "bucket_elems": bucket_elems,
                        "checkpoint_every": int(checkpoint_every),
                        "checkpoint_keep": checkpoint_keep, "max_attempts": int(max_attempts)}

    def per_group_keys(self):
        """The keys a param group may set for this optimizer."""
        return {"params", "lr", "weight_decay", *GROUP_KEYS[self.kind]}

    def defaults(self, lr, weight_decay):
        """torch.optim.Optimizer's defaults, as torch.optim's optimizer of this kind holds them:
        every group gets every key (the constructor's value unless the group set its own), so
        schedulers find them (OneCycleLR cycles betas or momentum)."""
        defaults = {"lr": float(lr), "weight_decay": float(weight_decay)}
        for key in GROUP_KEYS[self.kind] + FIXED_KEYS[self.kind]:
            defaults[key] = self.hyper[key]
        return defaults

    def group_values(self, index, group):
        """attach_pb2.GroupValues of param group `index` as it is now; ValueError naming the
        group and key for a value the workers cannot take."""
        hyper = self.hyper

        def number(key, value, low=0.0, high=math.inf, high_open=False):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"param_groups[{index}]: {key} {value!r} is not a number") \
                    from None
            if not (math.isfinite(value) and low <= value and
                    (value < high if high_open else value <= high)):
                bound = f"[{low}, {high})" if high_open else f">= {low}"
                raise ValueError(f"param_groups[{index}]: {key} {value} must be {bound}")
            return value

        for key in FIXED_KEYS[self.kind]:
            if key in group and group[key] != hyper[key]:
                raise ValueError(f"param_groups[{index}]: {key} {group[key]!r} differs from the "
                                 f"job's {hyper[key]!r}; it cannot change during training "
                                 "(it decides the optimizer state's shape or is job-wide)")
        values = attach_pb2.GroupValues()
        values.lr = number("lr", group["lr"])
        values.weight_decay = number("weight_decay", group["weight_decay"])
        keys = GROUP_KEYS[self.kind]
        if "betas" in keys:
            betas = group.get("betas", hyper["betas"])
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"param_groups[{index}]: betas {betas!r} is not a pair")
            values.beta1 = number("betas[0]", betas[0], 0.0, 1.0, high_open=True)
            values.beta2 = number("betas[1]", betas[1], 0.0, 1.0, high_open=True)
        else:
            values.beta1, values.beta2 = hyper["betas"]
        values.eps = number("eps", group.get("eps", hyper["eps"]))
        if "momentum" in keys:
            momentum = number("momentum", group.get("momentum", hyper["momentum"]))
            if (momentum == 0.0) != (hyper["momentum"] == 0.0):
                raise ValueError(
                    f"param_groups[{index}]: momentum {momentum}: the job's optimizer state was "
                    f"made {'without' if hyper['momentum'] == 0.0 else 'with'} a momentum "
                    f"buffer (momentum {hyper['momentum']}); momentum may change, but not "
                    "to or from 0")
            values.momentum = momentum
            values.dampening = number("dampening",
                                      group.get("dampening", hyper["dampening"]), high=1.0)
            if hyper["nesterov"] and values.dampening != 0.0:
                raise ValueError(f"param_groups[{index}]: dampening {values.dampening}: nesterov "
                                 "needs dampening 0")
        return values


# ---- Parameters ----

def check_parameter(name, p):
    """ValueError naming the parameter when the workers cannot hold it."""
    if p.is_sparse or p.layout != torch.strided:
        raise ValueError(f"parameter {name}: sparse parameters are not supported")
    if not p.is_contiguous():
        raise ValueError(f"parameter {name}: it is not contiguous")
    if p.dtype != torch.float32:
        raise ValueError(f"parameter {name}: dtype {p.dtype}, only torch.float32 is supported")


def common_device(named):
    """The device of every (name, parameter): the CPU (CPU workers) or one GPU (CUDA workers of
    the same GPU); ValueError naming a parameter that does not fit."""
    for name, p in named:
        check_parameter(name, p)
    first_name, first = named[0]
    device = first.device
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"parameter {first_name}: on {device}, only CPU and CUDA parameters can "
                         "attach to workers")
    for name, p in named:
        if p.device != device:
            raise ValueError(f"parameter {name}: on {p.device}, but {first_name} is on {device}: "
                             "every parameter must be on one device")
    return device


def trainable_parameters(model):
    """(name, parameter) of the model's parameters that require grad; ValueError for a model
    whose gradients could not be handed over (sparse ones: the workers reduce dense buckets,
    refused here rather than failing inside backward's hooks) or that has none."""
    for module_name, module in model.named_modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
            raise ValueError(f"module {module_name or type(module).__name__}: "
                             f"{type(module).__name__}(sparse=True) makes sparse gradients, "
                             "which ZeroShard does not support; use sparse=False")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("model: it has no parameter that requires grad")
    return named


def parameter_names(model):
    """(name, parameter) for every name model.state_dict() gives a parameter, tied weights
    included (pytorch/examples' LSTM has decoder.weight and encoder.weight, one Parameter), then
    any parameter state_dict() leaves out, under named_parameters()'s name."""
    named = [(name, value) for name, value in model.state_dict(keep_vars=True).items()
             if isinstance(value, torch.nn.Parameter)]
    seen = {name for name, _ in named}
    named += [(name, p) for name, p in model.named_parameters() if name not in seen]
    return named


def tied_aliases(model, name_of):
    """{plan name: [its other names in model.state_dict()]} for the parameters `name_of` ({id:
    name}) holds: tied weights' aliases, in state_dict() order."""
    aliases = {}
    for name, p in parameter_names(model):
        own = name_of.get(id(p))
        if own is not None and name != own:
            aliases.setdefault(own, []).append(name)
    return aliases


# ---- Param groups ----

def constructor_groups(settings, named, param_groups, lr):
    """The constructor's groups: the user's `param_groups`, then the default group with every
    trainable parameter (`named`) they do not name. (groups, index of the default group or
    None); ValueError naming the group or parameter that does not fit."""
    name_of = {id(p): name for name, p in named}
    groups = []
    grouped = set()
    per_group = settings.per_group_keys()
    for index, group in enumerate(param_groups or []):
        unknown = set(group) - per_group
        if unknown:
            raise ValueError(f"param_groups[{index}]: keys {sorted(unknown)} are not "
                             f"supported (only {sorted(per_group)} may differ per group "
                             f"for {settings.kind})")
        members = list(group.get("params", []))
        for p in members:
            if id(p) not in name_of:
                raise ValueError(f"param_groups[{index}]: holds a tensor that is not a "
                                 "trainable parameter of the model")
            if id(p) in grouped:
                raise ValueError(f"parameter {name_of[id(p)]}: in two param_groups")
            grouped.add(id(p))
        entry = {key: value for key, value in group.items() if key != "params"}
        entry.update({"params": members, "lr": float(group.get("lr", lr)),
                      "weight_decay": float(group.get("weight_decay", settings.weight_decay))})
        groups.append(entry)
    rest = [p for _, p in named if id(p) not in grouped]
    if not rest:
        return groups, None
    groups.insert(0, {"params": rest, "lr": float(lr),
                      "weight_decay": float(settings.weight_decay)})
    return groups, 0


def _group_params(param_group):
    """add_param_group's `params` as a list (a tensor, or an ordered collection)."""
    params = param_group["params"]
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, set):
        raise TypeError("add_param_group: params must be an ordered collection (a set's "
                        "order changes between runs); use a list")
    return list(params)


def added_group(settings, model, param_groups, default_group, device, defaults, param_group):
    """add_param_group's `param_group` checked against the optimizer's groups (as torch's
    ZeroRedundancyOptimizer takes it before its first step): (the group's entry as it is added,
    the ids of its parameters). TypeError or ValueError naming what does not fit."""
    if not isinstance(param_group, dict):
        raise TypeError(f"add_param_group: a dict expected, got {type(param_group).__name__}")
    per_group = settings.per_group_keys()
    unknown = set(param_group) - per_group
    if unknown:
        raise ValueError(f"add_param_group: keys {sorted(unknown)} are not supported (only "
                         f"{sorted(per_group)} may differ per group for {settings.kind})")
    if "params" not in param_group:
        raise ValueError("add_param_group: the group has no 'params'")
    params = _group_params(param_group)
    if not params:
        raise ValueError("add_param_group: the group has no parameters")
    name_of = {id(p): name for name, p in model.named_parameters()}
    group_of = {id(p): index for index, group in enumerate(param_groups)
                for p in group["params"]}
    added = set()
    for p in params:
        if not isinstance(p, torch.Tensor) or id(p) not in name_of:
            raise ValueError("add_param_group: holds a tensor that is not a parameter of the "
                             "model (a ShardedOptimizer trains its model's parameters only)")
        name = name_of[id(p)]
        if not p.requires_grad:
            raise ValueError(f"add_param_group: parameter {name} does not require grad")
        check_parameter(name, p)
        if p.device != device:
            raise ValueError(f"add_param_group: parameter {name} is on {p.device}, the "
                             f"others on {device}: every parameter must be on one device")
        if id(p) in added:
            raise ValueError(f"add_param_group: parameter {name} is in the group twice")
        added.add(id(p))
        index = group_of.get(id(p))
        if index is not None and index != default_group:
            raise ValueError("some parameters appear in more than one parameter group "
                             f"(parameter {name} is in param_groups[{index}])")
    entry = {key: value for key, value in param_group.items() if key != "params"}
    merged = dict(defaults)
    merged.update(entry)
    settings.group_values(len(param_groups), merged)  # ValueError naming the key
    entry.update({"params": params, "lr": float(merged["lr"]),
                  "weight_decay": float(merged["weight_decay"])})
    return entry, added


# ---- The plan and the spec ----

class JobPlan:
    """The job's tensors as the workers hold them: `params` and `names` in gradient-ready order
    (the reverse of model.parameters(), as DDP orders them), their `device`, `index` ({id(p):
    plan index}), and `spec_groups`: the indices of the param groups that the spec names
    (StepRequest.param_groups' order after the default group). Thread contract: immutable."""

    def __init__(self, planned, device, spec_groups):
        self.params = [p for _, p in planned]
        self.names = [name for name, _ in planned]
        self.device = device
        self.index = {id(p): t for t, p in enumerate(self.params)}
        self.spec_groups = spec_groups
        # The shapes as planned: zero3 replaces a parameter's data by an empty tensor between
        # uses, so whatever reads a shape after the attach reads it here.
        self.shapes = [p.shape for p in self.params]

    def shape_of(self, p):
        return self.shapes[self.index[id(p)]]


def plan_job(settings, model, param_groups, default_group):
    """The JobPlan of the groups as they are now; ValueError naming the group and key (or the
    parameter) that the job cannot take."""
    named = list(model.named_parameters())
    name_of = {id(p): name for name, p in named}
    for index, group in enumerate(param_groups):
        settings.group_values(index, group)  # ValueError naming the group and key
        for p in group["params"]:
            if id(p) not in name_of:
                raise ValueError(f"param_groups[{index}]: holds a tensor that is no longer "
                                 "a parameter of the model")
    grouped = {id(p) for group in param_groups for p in group["params"]}
    planned = [(name, p) for name, p in reversed(named) if id(p) in grouped]
    device = common_device(planned)
    spec_groups = [i for i in range(len(param_groups)) if i != default_group]
    return JobPlan(planned, device, spec_groups)


def job_spec(settings, env, sequence, model, plan, param_groups, spec_values, default_group,
             default_weight_decay):
    """The JobSpec of `plan`: each tensor with its tied aliases, the optimizer, the options, and
    each spec group's tensors by index. `spec_values`: each group's (lr, weight_decay) as it was
    added (the spec's values; the groups' current ones come with every step)."""
    base_lr = spec_values[0][0]
    # The spec's lr_scale (within its range): the groups' own values come with every step.
    lr_scales = [min(lr / base_lr, 1000.0) if base_lr > 0 else 1.0 for lr, _ in spec_values]
    spec = job_pb2.JobSpec()
    spec.name = f"{env.run_id}-{sequence}"
    spec.run_key = f"{env.run_key}-{sequence}"
    aliases = tied_aliases(model, dict(zip(map(id, plan.params), plan.names)))
    for name, p in zip(plan.names, plan.params):
        tensor = spec.workload.attached.tensors.add()
        tensor.name = name
        tensor.shape.extend(list(p.shape))
        # Tied weights' other names: `zeroshard export` writes the data under each.
        tensor.aliases.extend(aliases.get(name, []))
    spec.workload.attached.workers.extend(env.workers)
    spec.device_kind = types_pb2.CUDA if plan.device.type == "cuda" else types_pb2.CPU
    spec.mode = MODES[settings.mode]
    spec.optimizer.kind = OPTIMIZERS[settings.kind]
    spec.optimizer.lr = base_lr
    spec.optimizer.weight_decay = (spec_values[default_group][1] if default_group is not None
                                   else default_weight_decay)
    _set_hyperparameters(spec.optimizer, settings.hyper)
    _set_options(spec, settings.options)
    for index in plan.spec_groups:
        proto_group = spec.param_groups.add()
        # By identity: the tensors' indices in workload.attached.tensors (any group size).
        proto_group.tensors.extend(plan.index[id(p)] for p in param_groups[index]["params"])
        proto_group.weight_decay = spec_values[index][1]
        proto_group.lr_scale = lr_scales[index]
    return spec


def _set_hyperparameters(optimizer, hyper):
    optimizer.beta1, optimizer.beta2 = hyper["betas"]
    optimizer.eps = hyper["eps"]
    optimizer.momentum = hyper["momentum"]
    optimizer.dampening = hyper["dampening"]
    optimizer.nesterov = hyper["nesterov"]
    optimizer.amsgrad = hyper["amsgrad"]
    optimizer.maximize = hyper["maximize"]
    optimizer.lr_decay = hyper["lr_decay"]
    optimizer.initial_accumulator_value = hyper["initial_accumulator_value"]


def _set_options(spec, options):
    if options["clip_grad_norm"]:
        spec.clip_grad_norm = float(options["clip_grad_norm"])
    if options["bucket_elems"] is not None:
        spec.bucket_elems = int(options["bucket_elems"])
    # Unset: the coordinator's default (job.proto: zero3's depends on the model's size).
    spec.max_attempts = options["max_attempts"]
    if options["checkpoint_every"]:
        spec.checkpoint.every_steps = options["checkpoint_every"]
        # Under the job's name, which the launcher's run id makes unique.
        spec.checkpoint.dir = spec.name
        if options["checkpoint_keep"] is not None:
            spec.checkpoint.keep = int(options["checkpoint_keep"])
