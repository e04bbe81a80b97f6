"""zeroshard.torch: keep your PyTorch training script, let ZeroShard's workers hold the sharded
optimizer state and run the data path (docs/pytorch.md).

    import zeroshard.torch as zt
    zt.init()
    model = build_model()                       # same seeded init on every rank
    opt = zt.ShardedOptimizer(model, "adamw", lr=3e-4, weight_decay=0.1, mode="zero2")
    for x, y in loader:                         # shard the data by zt.rank() / zt.world_size()
        loss = loss_fn(model(x), y); loss.backward()
        opt.step(); opt.zero_grad()
    zt.save(model, "model.safetensors")

Start the script with `python3 -m zeroshard.launch --workers N train.py`. Each rank's trainer
attaches to the worker daemon on its host: the model's parameters become views of the worker's
shared parameter buffer (no copy), gradients go to the worker as backward produces them, and
step() returns once the worker has reduced them, applied its fused optimizer to its shard and
all-gathered the parameters. The optimizer state never enters this process.
"""

import atexit
import contextlib
import inspect
import math
import os
import shutil
import tempfile
import time
import types
import warnings
import weakref

import grpc
import torch

from zeroshard import _checkpoint
from zeroshard import _safetensors
from zeroshard._attach import AttachConnection, AttachError, WorkerLost
from zeroshard._jobs import find_job
from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard import _channel
from zeroshard._proto.zeroshard.v1 import coordinator_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2

__all__ = ["init", "rank", "world_size", "ShardedOptimizer", "HandedOverGradient", "save",
           "finish", "WorkerLost", "AttachError"]

_OPTIMIZERS = {
    "sgd": job_pb2.SGD,
    "adam": job_pb2.ADAM,
    "adamw": job_pb2.ADAMW,
    "adagrad": job_pb2.ADAGRAD,
    "lion": job_pb2.LION,
}
_MODES = {"ddp": job_pb2.DDP, "zero1": job_pb2.ZERO1, "zero2": job_pb2.ZERO2}
# The numeric hyperparameters each optimizer reads from its param groups at every step, as
# torch.optim does (besides lr and weight_decay): scripts and schedulers may change them.
_GROUP_KEYS = {"sgd": ("momentum", "dampening"), "adam": ("betas", "eps"),
               "adamw": ("betas", "eps"), "adagrad": ("eps",), "lion": ("betas",)}
# Hyperparameters a group holds that the job fixes when it is submitted (they decide the state's
# shape or are not read per group by the workers): changing one raises, naming it.
_FIXED_KEYS = {"sgd": ("nesterov", "maximize"), "adam": ("amsgrad", "maximize"),
               "adamw": ("amsgrad", "maximize"),
               "adagrad": ("lr_decay", "initial_accumulator_value", "maximize"),
               "lion": ("maximize",)}
# torch.optim's default weight decay per optimizer (AdamW decays by default).
_DEFAULT_WEIGHT_DECAY = {"sgd": 0.0, "adam": 0.0, "adamw": 1e-2, "adagrad": 0.0, "lion": 0.0}
_TORCH_CLASSES = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad"}


def _default_eps(kind):
    """The installed torch.optim class's default eps for `kind` (Adagrad's is 1e-10, Adam's
    1e-8); 1e-8 where it has none (sgd and lion do not read it)."""
    class_name = _TORCH_CLASSES.get(kind)
    if class_name is not None:
        parameter = inspect.signature(getattr(torch.optim, class_name)).parameters.get("eps")
        if parameter is not None and isinstance(parameter.default, float):
            return parameter.default
    return 1e-8
# How long a rank waits for rank 0's job to appear, and for its worker to take it.
_JOB_TIMEOUT_S = 120.0
# While a trainer waits for its welcome, it asks the coordinator this often whether the job
# ended meanwhile (then no generation will ever welcome it).
_WELCOME_POLL_S = 1.0
_FINAL_STATES = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED)

# zero_grad's default for set_to_none, as the installed torch has it (1.13: False, 2.x: True):
# opt.zero_grad() follows torch.optim.Optimizer's, model.zero_grad() nn.Module's.
_OPTIMIZER_SET_TO_NONE = inspect.signature(torch.optim.Optimizer.zero_grad).parameters[
    "set_to_none"].default
_MODULE_SET_TO_NONE = inspect.signature(torch.nn.Module.zero_grad).parameters[
    "set_to_none"].default

_environment = None
_optimizers = []
_jobs_submitted = 0
# model -> the ShardedOptimizer that trains it, which its forward pre-hook and its zero_grad
# (installed on the instance) find here: they hold no reference to the optimizer, so that a copy
# of the model (copy.deepcopy, pickle) copies no optimizer and is plain torch.
_model_optimizers = weakref.WeakKeyDictionary()


class _Environment:
    """What the launcher set (ZEROSHARD_* variables)."""

    def __init__(self):
        def required(name):
            value = os.environ.get(name)
            if not value:
                raise RuntimeError(
                    f"{name} is not set: start the script with "
                    "`python3 -m zeroshard.launch --workers N script.py`")
            return value

        self.coordinator = required("ZEROSHARD_COORDINATOR")
        self.rank = int(required("ZEROSHARD_RANK"))
        self.world_size = int(required("ZEROSHARD_WORLD_SIZE"))
        self.workers = required("ZEROSHARD_WORKERS").split(",")
        self.run_id = required("ZEROSHARD_RUN_ID")
        # Random, so that the ranks find the job rank 0 submitted by an exact lookup, and never
        # a job someone else named alike.
        self.run_key = required("ZEROSHARD_RUN_KEY")
        self.attach_socket = required("ZEROSHARD_ATTACH_SOCKET")
        if len(self.workers) != self.world_size or not 0 <= self.rank < self.world_size:
            raise RuntimeError(
                f"ZEROSHARD_RANK {self.rank}, ZEROSHARD_WORLD_SIZE {self.world_size} and "
                f"ZEROSHARD_WORKERS ({len(self.workers)} names) disagree")


def init():
    """Reads the launcher's environment. Call once, before building the ShardedOptimizer."""
    global _environment
    if _environment is None:
        _environment = _Environment()
        atexit.register(finish)
    return _environment


def rank():
    return init().rank


def world_size():
    return init().world_size


class HandedOverGradient(torch.Tensor):
    """What a parameter's .grad holds in zero1 and zero2 once backward handed its gradient over to
    the worker, until the next forward, step() or zero_grad(): a tensor of the parameter's shape,
    dtype and device without storage. Its shape, dtype, device and the like can be read; any other
    use (torch.nn.utils.clip_grad_norm_, arithmetic, accumulating into it) raises a RuntimeError
    that names the parameter and opt.clip_grad_norm_. `isinstance(p.grad, zt.HandedOverGradient)`
    tells it from a gradient that holds values. Thread contract: immutable."""

    @staticmethod
    def __new__(cls, parameter, name, mode):
        handed_over = torch.Tensor._make_wrapper_subclass(
            cls, parameter.shape, dtype=parameter.dtype, device=parameter.device)
        handed_over.parameter_name = name
        handed_over.mode = mode
        return handed_over

    def __repr__(self):
        return (f"HandedOverGradient(parameter={self.parameter_name}, shape={list(self.shape)}, "
                f"mode={self.mode})")

    def refusal(self, what):
        where = ("zero2 reduces it into the owning rank's shard" if self.mode == "zero2" else
                 "zero1 reduces it in the worker, which keeps only its shard")
        return RuntimeError(
            f"parameter {self.parameter_name}: its gradient was handed over to the ZeroShard "
            f"worker ({where}), so .grad holds no values here ({what} was called on it); clip "
            "with opt.clip_grad_norm_(max_norm) (global across shards) instead of "
            "torch.nn.utils.clip_grad_norm_, or use mode='ddp' to keep full gradients in .grad")

    @classmethod
    def __torch_function__(cls, func, classes, args=(), kwargs=None):
        if func in _METADATA:
            with torch._C.DisableTorchFunction():
                return func(*args, **(kwargs or {}))
        raise _first_handed_over(args, kwargs).refusal(getattr(func, "__name__", str(func)))

    @classmethod
    def __torch_dispatch__(cls, func, classes, args=(), kwargs=None):
        # What reaches the dispatcher without passing __torch_function__ (autograd's C++).
        raise _first_handed_over(args, kwargs).refusal(str(func))


def _first_handed_over(args, kwargs):
    for value in list(args) + list((kwargs or {}).values()):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, HandedOverGradient):
                return item
    raise AssertionError("no HandedOverGradient among the arguments")


# What a HandedOverGradient answers: its metadata, which code that skips or groups gradients reads.
_METADATA = {getattr(torch.Tensor, name).__get__
             for name in ("shape", "dtype", "device", "layout", "ndim", "requires_grad",
                          "grad_fn", "is_leaf", "is_sparse", "is_cuda")}
_METADATA |= {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.__hash__}


def _handed_over(grad):
    return isinstance(grad, HandedOverGradient)


def _torch_zero_grad(p, set_to_none):
    """What torch.optim's zero_grad does to one parameter's .grad (a handed-over one goes)."""
    if p.grad is None:
        return
    if set_to_none or _handed_over(p.grad):
        p.grad = None
        return
    if p.grad.grad_fn is not None:
        p.grad.detach_()
    else:
        p.grad.requires_grad_(False)
    p.grad.zero_()


def _model_zero_grad(module, set_to_none=_MODULE_SET_TO_NONE):
    """model.zero_grad() of a model a ShardedOptimizer trains (installed on the instance, bound
    to it): the optimizer's zero_grad for its parameters, torch's for the model's others. A copy
    of the model (copy.deepcopy) gets torch's own."""
    optimizer = _model_optimizers.get(module)
    if optimizer is None:
        return type(module).zero_grad(module, set_to_none)
    return optimizer._zero_model_grad(set_to_none)


# A pickled model binds torch's zero_grad instead (a bound method pickles as getattr(model, name)).
_model_zero_grad.__name__ = _model_zero_grad.__qualname__ = "zero_grad"


def _before_forward(module, inputs):
    """The forward pre-hook of a model a ShardedOptimizer trains (a no-op on a copy of it)."""
    optimizer = _model_optimizers.get(module)
    if optimizer is not None:
        optimizer._before_forward()


def _check_parameter(name, p):
    if p.is_sparse or p.layout != torch.strided:
        raise ValueError(f"parameter {name}: sparse parameters are not supported")
    if not p.is_contiguous():
        raise ValueError(f"parameter {name}: it is not contiguous")
    if p.dtype != torch.float32:
        raise ValueError(f"parameter {name}: dtype {p.dtype}, only torch.float32 is supported")


def _common_device(named):
    """The device of every (name, parameter): the CPU (CPU workers) or one GPU (CUDA workers of
    the same GPU); ValueError naming a parameter that does not fit."""
    for name, p in named:
        _check_parameter(name, p)
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


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose state and update live in ZeroShard's workers.

    optimizer: "sgd", "adam", "adamw", "adagrad" or "lion" (torch.optim's semantics).
    mode: "zero2" (default: gradients reduce-scattered bucket by bucket as backward produces
      them, only the owned shard kept), "zero1" or "ddp" (full gradients all-reduced, full state).
    param_groups: optional list of {"params": [...], "lr": ..., "weight_decay": ...} for
      subsets of the model's parameters; the rest form the default group (lr, weight_decay).
    clip_grad_norm: global-norm clipping across all shards in every step (as calling
      opt.clip_grad_norm_(clip_grad_norm) after each backward).
    Other keywords: betas, eps (default: the torch.optim class's, Adagrad's 1e-10), momentum,
      dampening, nesterov, amsgrad, maximize, lr_decay, initial_accumulator_value, as
      torch.optim names them.

    bucket_elems: the job's gradient bucket size in elements (default: the planner's).

    The job is submitted, and this rank attaches to its worker, at the first need: the model's
    first forward (a forward pre-hook on it), else its first backward, step(), state_dict(),
    load_state_dict() or reading start_step. Until then add_param_group(...) works as on torch's
    ZeroRedundancyOptimizer before its first step: it takes trainable parameters of the model (one
    in the default group moves to the new group; one frozen when the optimizer was built may be
    added once it requires grad); afterwards it raises NotImplementedError (the job's shard plan
    is fixed).

    LR schedulers work: step() sends the groups' current values. Gradient accumulation: run the
    micro-batches but the last inside `with opt.no_sync():` (ddp/zero1 accumulate in the shared
    gradient buffer and reduce once per step; zero2 reduces every micro-batch into the owned
    shard, as DeepSpeed stage 2 does, so .grad never holds the full gradient). In zero1 and zero2
    a gradient handed over to the worker leaves a HandedOverGradient in .grad (no values; using it
    raises, naming opt.clip_grad_norm_) until the next forward, step() or zero_grad().
    model.zero_grad() is routed to this optimizer's zero_grad(). In ddp, backward ends once the
    gradients are averaged over the ranks (as torch's DDP): .grad then holds them, and
    torch.nn.utils.clip_grad_norm_ works on it. opt.clip_grad_norm_(max_norm, norm_type) clips
    across every shard in every mode, as FSDP's.

    Gradients as torch.optim sees them: a parameter whose .grad is None in a step (never used,
    or unused since zero_grad(set_to_none=True)) on every rank is not updated, and its state and
    step count stay (a step() without any gradient changes nothing).

    Faults: checkpoint_every=N has the workers checkpoint every N steps (sharded, kept:
    checkpoint_keep, default the job's 2); max_attempts=K lets the job start K generations. A
    trainer that dies ends the generation; zeroshard.launch restarts every trainer while the
    job has attempts left. The restarted script joins the job (rank 0 does not submit it again)
    and resumes where `opt.start_step` says: the latest checkpoint's step (the parameters are
    the checkpoint's), or 0 with the script's own initial parameters when there is none. The
    script reads opt.start_step before its first forward, starts its loop there and advances its
    data and LR schedule to it.

    Thread contract: the training thread only (backward's hooks run on it).
    """

    def __init__(self, model, optimizer="adamw", lr=1e-3, weight_decay=None, mode="zero2",
                 param_groups=None, clip_grad_norm=None, betas=(0.9, 0.999), eps=None,
                 momentum=0.0, dampening=0.0, nesterov=False, amsgrad=False, maximize=False,
                 lr_decay=0.0, initial_accumulator_value=0.0, bucket_elems=None,
                 checkpoint_every=0, checkpoint_keep=None, max_attempts=1):
        env = init()
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer: '{optimizer}' is not one of {sorted(_OPTIMIZERS)}")
        if mode not in _MODES:
            raise ValueError(f"mode: '{mode}' is not one of {sorted(_MODES)}")
        if weight_decay is None:
            weight_decay = _DEFAULT_WEIGHT_DECAY[optimizer]
        if eps is None:
            eps = _default_eps(optimizer)
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every: {checkpoint_every}, must be >= 0 (0: none)")
        if max_attempts < 1:
            raise ValueError(f"max_attempts: {max_attempts}, must be >= 1")
        self._env = env
        self._optimizer_kind = optimizer
        # What the job fixes for every group (state_dict's param_groups, load_state_dict's checks).
        self._hyper = {"betas": (float(betas[0]), float(betas[1])), "eps": float(eps),
                       "momentum": float(momentum), "dampening": float(dampening),
                       "nesterov": bool(nesterov), "amsgrad": bool(amsgrad),
                       "maximize": bool(maximize), "lr_decay": float(lr_decay),
                       "initial_accumulator_value": float(initial_accumulator_value)}
        # The rest of the job spec, written when the job is submitted.
        self._job_options = {"clip_grad_norm": clip_grad_norm, "bucket_elems": bucket_elems,
                             "checkpoint_every": int(checkpoint_every),
                             "checkpoint_keep": checkpoint_keep, "max_attempts": int(max_attempts)}
        self._mode = mode
        self._model = model
        # Sparse gradients cannot be handed over (the workers reduce dense buckets): refused here
        # rather than failing inside backward's hooks.
        for module_name, module in model.named_modules():
            if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
                raise ValueError(f"module {module_name or type(module).__name__}: "
                                 f"{type(module).__name__}(sparse=True) makes sparse gradients, "
                                 "which ZeroShard does not support; use sparse=False")
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("model: it has no parameter that requires grad")
        self._device = _common_device(named)
        name_of = {id(p): name for name, p in named}

        # Groups: the user's, then the default group with everything else.
        groups = []
        grouped = set()
        per_group = self._per_group_keys()
        for index, group in enumerate(param_groups or []):
            unknown = set(group) - per_group
            if unknown:
                raise ValueError(f"param_groups[{index}]: keys {sorted(unknown)} are not "
                                 f"supported (only {sorted(per_group)} may differ per group "
                                 f"for {optimizer})")
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
                          "weight_decay": float(group.get("weight_decay", weight_decay))})
            groups.append(entry)
        rest = [p for _, p in named if id(p) not in grouped]
        if rest:
            groups.insert(0, {"params": rest, "lr": float(lr),
                              "weight_decay": float(weight_decay)})
            self._default_group = 0
        else:
            self._default_group = None
        # As torch.optim's optimizer of this kind holds them: every group gets every key (the
        # constructor's value unless the group set its own), so schedulers find them
        # (OneCycleLR cycles betas or momentum).
        defaults = {"lr": float(lr), "weight_decay": float(weight_decay)}
        for key in _GROUP_KEYS[optimizer] + _FIXED_KEYS[optimizer]:
            defaults[key] = self._hyper[key]
        # One job per optimizer a script builds: numbered in construction order, the same on
        # every rank.
        global _jobs_submitted
        _jobs_submitted += 1
        self._sequence = _jobs_submitted
        # Each group's (lr, weight_decay) as it was added: the job spec's values (lr_scale
        # included), whatever a scheduler set before the job is submitted (LambdaLR's warm-up
        # may set lr 0, which a spec cannot hold); step() sends the groups' current values.
        self._spec_values = []
        # "constructing" (torch's __init__ adds the groups), "built" (no job yet), "attaching",
        # "attached", "failed" (the job was joined, attaching failed) or "finished".
        self._state = "constructing"
        super().__init__(groups, defaults)
        self._state = "built"
        self._failure = None
        self._attach_connection = None
        self._no_sync = False
        # zero2: segments the worker deferred (no free bucket buffer when backward asked).
        self.deferred_segments = 0
        self._warned_replaced_grad = False
        self.last_step = None
        # id(p) -> its gradient hooks' handles (and torch 1.13's AccumulateGrad node, kept alive).
        self._hooks = {}
        for _, p in named:
            self._hook_gradients(p)
        _model_optimizers[model] = self
        self._forward_hook = model.register_forward_pre_hook(_before_forward)
        model.zero_grad = types.MethodType(_model_zero_grad, model)
        _optimizers.append(self)

    def _per_group_keys(self):
        return {"params", "lr", "weight_decay", *_GROUP_KEYS[self._optimizer_kind]}

    # ---- Submitting the job and attaching, at the first need ----

    @property
    def start_step(self):
        """The step this attachment starts at: 0, or after a restart the checkpoint's (reading
        it attaches)."""
        return self._attached_value("_start_step")

    # What exists once attached; reading one attaches first (tests and benchmarks read them).
    @property
    def _job_id(self):
        return self._attached_value("_submitted_job_id")

    @property
    def _layouts(self):
        return self._attached_value("_tensor_layouts")

    @property
    def _connection(self):
        """The attach connection; None once finished."""
        if self._state == "finished":
            return None
        return self._attached_value("_attach_connection")

    def _attached_value(self, name):
        if self._state != "finished":
            self._ensure_attached()
        return self.__dict__.get(name)

    def _ensure_attached(self, from_backward=False):
        """Submits or joins the job and attaches, unless done. A spec the job cannot take raises
        with nothing submitted (the optimizer stays as built); a failure after the job was
        joined is final: every later need raises it again."""
        if self._state in ("attached", "attaching"):
            return
        if self._state == "finished":
            raise RuntimeError("this ShardedOptimizer has finished (zt.finish)")
        if self._state == "failed":
            raise RuntimeError(f"this ShardedOptimizer could not attach to its worker: "
                               f"{self._failure}")
        spec = self._job_spec()
        self._state = "attaching"
        try:
            self._submitted_job_id = self._join_job(spec)
            self._attach_connection = AttachConnection(self._env.attach_socket)
            self._attach(from_backward)
        except BaseException as e:
            self._state = "failed"
            self._failure = f"{type(e).__name__}: {e}"
            if self._attach_connection is not None:
                self._attach_connection.close()
                self._attach_connection = None
            raise
        self._state = "attached"

    def _before_forward(self):
        self._ensure_attached()
        self._clear_handed_over()

    def _job_spec(self):
        """The job spec of the groups as they are now: the tensor list in gradient-ready order
        (the reverse of model.parameters(), as DDP orders them), each group's tensors by index.
        Sets the plan: self._params, self._names, self._device."""
        named = list(self._model.named_parameters())
        name_of = {id(p): name for name, p in named}
        for index, group in enumerate(self.param_groups):
            self._group_values(index, group)  # ValueError naming the group and key
            for p in group["params"]:
                if id(p) not in name_of:
                    raise ValueError(f"param_groups[{index}]: holds a tensor that is no longer "
                                     "a parameter of the model")
        grouped = {id(p) for group in self.param_groups for p in group["params"]}
        planned = [(name, p) for name, p in reversed(named) if id(p) in grouped]
        self._device = _common_device(planned)
        self._params = [p for _, p in planned]
        self._names = [name for name, _ in planned]
        base_lr = self._spec_values[0][0]
        # The spec's lr_scale (within its range): the groups' own values come with every step.
        lr_scales = [min(lr / base_lr, 1000.0) if base_lr > 0 else 1.0
                     for lr, _ in self._spec_values]
        # StepRequest.param_groups' order: the default group, then the spec's groups.
        self._spec_groups = [i for i in range(len(self.param_groups)) if i != self._default_group]

        env, options, hyper = self._env, self._job_options, self._hyper
        spec = job_pb2.JobSpec()
        spec.name = f"{env.run_id}-{self._sequence}"
        spec.run_key = f"{env.run_key}-{self._sequence}"
        aliases = _tied_aliases(self._model, dict(zip(map(id, self._params), self._names)))
        for name, p in zip(self._names, self._params):
            tensor = spec.workload.attached.tensors.add()
            tensor.name = name
            tensor.shape.extend(list(p.shape))
            # Tied weights' other names: `zeroshard export` writes the data under each.
            tensor.aliases.extend(aliases.get(name, []))
        spec.workload.attached.workers.extend(env.workers)
        spec.device_kind = types_pb2.CUDA if self._device.type == "cuda" else types_pb2.CPU
        spec.mode = _MODES[self._mode]
        spec.optimizer.kind = _OPTIMIZERS[self._optimizer_kind]
        spec.optimizer.lr = base_lr
        spec.optimizer.weight_decay = (self._spec_values[self._default_group][1]
                                       if self._default_group is not None
                                       else self.defaults["weight_decay"])
        spec.optimizer.beta1, spec.optimizer.beta2 = hyper["betas"]
        spec.optimizer.eps = hyper["eps"]
        spec.optimizer.momentum = hyper["momentum"]
        spec.optimizer.dampening = hyper["dampening"]
        spec.optimizer.nesterov = hyper["nesterov"]
        spec.optimizer.amsgrad = hyper["amsgrad"]
        spec.optimizer.maximize = hyper["maximize"]
        spec.optimizer.lr_decay = hyper["lr_decay"]
        spec.optimizer.initial_accumulator_value = hyper["initial_accumulator_value"]
        if options["clip_grad_norm"]:
            spec.clip_grad_norm = float(options["clip_grad_norm"])
        if options["bucket_elems"] is not None:
            spec.bucket_elems = int(options["bucket_elems"])
        spec.max_attempts = options["max_attempts"]
        if options["checkpoint_every"]:
            spec.checkpoint.every_steps = options["checkpoint_every"]
            # Under the job's name, which the launcher's run id makes unique.
            spec.checkpoint.dir = spec.name
            if options["checkpoint_keep"] is not None:
                spec.checkpoint.keep = int(options["checkpoint_keep"])
        position = {id(p): t for t, p in enumerate(self._params)}
        for index in self._spec_groups:
            proto_group = spec.param_groups.add()
            # By identity: the tensors' indices in workload.attached.tensors (any group size).
            proto_group.tensors.extend(position[id(p)] for p in self.param_groups[index]["params"])
            proto_group.weight_decay = self._spec_values[index][1]
            proto_group.lr_scale = lr_scales[index]
        return spec

    def _join_job(self, spec):
        """The id of this run's job (spec.run_key, an exact lookup among the caller's jobs):
        rank 0 submits it unless a restarted script finds it still running (then every rank
        joins it); the other ranks wait for it."""
        channel = _channel.coordinator_channel(self._env.coordinator)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            if self._env.rank == 0:
                existing = find_job(stub, spec.run_key)
                if existing is None:
                    job = stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=30)
                    return job.id
                if existing.state in _FINAL_STATES:
                    raise RuntimeError(
                        f"job {existing.id} ({spec.name}) already ended "
                        f"({job_pb2.JobState.Name(existing.state)}: {existing.message}); a "
                        "restarted script cannot resume it")
                return existing.id
            deadline = time.monotonic() + _JOB_TIMEOUT_S
            while time.monotonic() < deadline:
                job = find_job(stub, spec.run_key)
                if job is not None and job.state not in _FINAL_STATES:
                    return job.id
                time.sleep(0.05)
            raise RuntimeError(f"rank 0 did not submit job {spec.name} (or it ended) within "
                               f"{_JOB_TIMEOUT_S:.0f} s")
        except grpc.RpcError as e:
            raise RuntimeError(f"the coordinator at {self._env.coordinator} refused the job: "
                               f"{e.code().name}: {e.details()}") from None
        finally:
            channel.close()

    def _await_welcome(self):
        """Waits for the worker's answer to the hello: it comes once the worker runs this
        rank of the job's next generation, which never happens if the job ends first."""
        channel = _channel.coordinator_channel(self._env.coordinator)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            while not self._connection.wait_readable(_WELCOME_POLL_S):
                try:
                    job = stub.GetJob(coordinator_pb2.GetJobRequest(job_id=self._job_id),
                                      timeout=30)
                except grpc.RpcError:
                    continue  # the coordinator may be restarting: keep waiting for the worker
                if job.state in _FINAL_STATES:
                    raise RuntimeError(
                        f"job {self._job_id} ended ({job_pb2.JobState.Name(job.state)}: "
                        f"{job.message}) before the worker welcomed rank {self._env.rank}")
        finally:
            channel.close()
        response, _ = self._connection.receive()
        return response.welcome

    def _attach(self, from_backward):
        """Hello, welcome, the parameters onto the worker's shared blocks. `from_backward`: the
        first need is a backward whose forward did not go through the model's forward pre-hook
        (it called model.forward or a submodule): it ran on the model's own parameters, which
        must then be the job's."""
        hello = attach_pb2.AttachRequest()
        hello.hello.job_id = self._job_id
        hello.hello.rank = self._env.rank
        hello.hello.world_size = self._env.world_size
        hello.hello.device_kind = self._device.type
        self._connection.send(hello)
        welcome = self._await_welcome()
        self._check_worker_device(welcome)
        self._start_step = welcome.start_step
        if len(welcome.tensors) != len(self._params):
            raise ValueError(f"the job has {len(welcome.tensors)} parameters, this model "
                             f"{len(self._params)}: the ranks' models differ")
        self._tensor_layouts = list(welcome.tensors)
        self._param_views = []
        self._grad_views = []
        for name, p, layout in zip(self._names, self._params, self._layouts):
            if layout.name != name or list(layout.shape) != list(p.shape):
                raise ValueError(f"parameter {name}: shape {list(p.shape)}, but the job's tensor "
                                 f"is {layout.name} of shape {list(layout.shape)} (the ranks' "
                                 "models differ)")
            view = self._view(layout.param_block, layout.param_offset, layout.elements, p.shape)
            if welcome.needs_initial_parameters:
                view.copy_(p.detach())
            elif from_backward and not torch.equal(view, p.detach()):
                raise RuntimeError(
                    f"parameter {name}: the job resumed at step {welcome.start_step} with the "
                    "checkpoint's parameters, but this backward ran on the model's own: its "
                    "forward did not go through the model (the ShardedOptimizer attaches at the "
                    "model's first forward); read opt.start_step before the first forward")
            self._param_views.append(view)
            if layout.grad_block >= 0:
                self._grad_views.append(
                    self._view(layout.grad_block, layout.grad_offset, layout.elements, p.shape))
            else:
                self._grad_views.append(None)
        if welcome.needs_initial_parameters:
            self._synchronize()
            request = attach_pb2.AttachRequest()
            request.initial_parameters.SetInParent()
            self._connection.call(request)
        # _pointed[t]: this optimizer set .grad to tensor t's shared gradient view (ddp/zero1),
        # so another tensor there was put by user code (warned once), not made by a backward
        # after .grad was None.
        self._pointed = [False] * len(self._params)
        with torch.no_grad():
            for t, (p, view, grad) in enumerate(zip(self._params, self._param_views,
                                                    self._grad_views)):
                p.data = view
                if grad is not None and p.grad is not None:
                    grad.copy_(p.grad)
                    p.grad = grad
                    self._pointed[t] = True
        # _has_grad[t]: tensor t has a gradient, as torch's `p.grad is not None` says: set when
        # backward accumulates one (or a .grad is handed over), cleared by zero_grad(
        # set_to_none=True) only. The workers leave a tensor without one alone.
        self._has_grad = [p.grad is not None for p in self._params]
        # Whether some .grad may hold a HandedOverGradient (a forward need not look otherwise).
        self._some_handed_over = False
        self._index = {id(p): t for t, p in enumerate(self._params)}
        self._begin_step()

    def _hook_gradients(self, p):
        """Registered when the parameter joins the optimizer (before the job exists): a hook
        before each accumulation into .grad (a HandedOverGradient there goes first: the new
        gradient starts a fresh .grad) and one after it (_on_gradient)."""
        parameter = weakref.ref(p)
        handles = [p.register_hook(lambda grad: self._before_accumulation(parameter()))]
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            handles.append(p.register_post_accumulate_grad_hook(self._on_gradient))
        else:
            # torch 1.13: the AccumulateGrad node's hook, as DDP does (the node kept alive here;
            # it outlives p.data's replacement at the attach: same dtype and device).
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
            handles.append(accumulator.register_hook(lambda *unused, p=p: self._on_gradient(p)))
            handles.append(accumulator)
        self._hooks[id(p)] = handles

    def _check_worker_device(self, welcome):
        worker_kind = welcome.device_kind or "cpu"
        if worker_kind != self._device.type:
            raise ValueError(f"parameter {self._names[0]}: on {self._device}, but the worker "
                             f"holds its buffers on {worker_kind}: move the model there")
        if worker_kind == "cuda":
            bus_id = welcome.cuda_device.pci_bus_id
            ordinal = self._connection.cuda_device_ordinal(bus_id)
            if ordinal != self._device.index:
                raise ValueError(
                    f"parameter {self._names[0]}: on {self._device}, but this rank's worker runs "
                    f"on the GPU with PCI bus id {bus_id} (cuda:{ordinal} in this process): "
                    f"move the model to cuda:{ordinal}")

    def _synchronize(self):
        """CUDA: this process's writes to the worker's blocks are complete before the worker is
        told (the protocol's contract); a no-op on the CPU."""
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _view(self, block, offset, elements, shape):
        if self._device.type == "cuda":
            flat = torch.as_tensor(self._connection.cuda_block(block).view(offset, elements),
                                   device=self._device)
        else:
            flat = torch.frombuffer(self._connection.block(block), dtype=torch.float32,
                                    count=elements, offset=offset)
        return flat.view(tuple(shape))

    def _begin_step(self):
        self._begin_micro_batch()
        self._micro_batches = 0
        self._end_of_backward_queued = False
        # ddp: the shared gradient buffer holds the average over ranks (_average_gradients).
        self._averaged = False

    def _begin_micro_batch(self):
        self._ready = [False] * len(self._params)
        self._next = 0
        self._next_segment = 0  # of tensor self._next (zero2)

    def add_param_group(self, param_group):
        """Before the job is submitted (the model's first forward, or the first step(),
        state_dict(), load_state_dict() or start_step), as torch's ZeroRedundancyOptimizer takes
        it before its first step: `params` are trainable parameters of the model (a tensor, or
        an ordered collection); keys missing take the constructor's values. A parameter of the
        default group (every trainable parameter that no constructor group named) moves to the
        new group; one frozen when the optimizer was built joins once it requires grad; one
        already in another group raises ValueError, as torch does. Tensors that are not the
        model's parameters are refused: the job names each tensor by its name in the model.
        After the job is submitted: NotImplementedError."""
        if self._state == "constructing":  # torch.optim.Optimizer.__init__ adds our groups
            super().add_param_group(param_group)
            self._spec_values.append((param_group["lr"], param_group["weight_decay"]))
            return
        if self._state != "built":
            raise NotImplementedError(
                "add_param_group: the job was submitted at the model's first forward (or the "
                "first step(), state_dict(), load_state_dict() or start_step), and its shard "
                "plan fixes which tensors the workers hold and how they are grouped; add groups "
                "before that, or pass them as zt.ShardedOptimizer(..., param_groups=[...])")
        if not isinstance(param_group, dict):
            raise TypeError(f"add_param_group: a dict expected, got {type(param_group).__name__}")
        per_group = self._per_group_keys()
        unknown = set(param_group) - per_group
        if unknown:
            raise ValueError(f"add_param_group: keys {sorted(unknown)} are not supported (only "
                             f"{sorted(per_group)} may differ per group for "
                             f"{self._optimizer_kind})")
        if "params" not in param_group:
            raise ValueError("add_param_group: the group has no 'params'")
        params = param_group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("add_param_group: params must be an ordered collection (a set's "
                            "order changes between runs); use a list")
        else:
            params = list(params)
        if not params:
            raise ValueError("add_param_group: the group has no parameters")
        name_of = {id(p): name for name, p in self._model.named_parameters()}
        group_of = {id(p): index for index, group in enumerate(self.param_groups)
                    for p in group["params"]}
        added = set()
        for p in params:
            if not isinstance(p, torch.Tensor) or id(p) not in name_of:
                raise ValueError("add_param_group: holds a tensor that is not a parameter of the "
                                 "model (a ShardedOptimizer trains its model's parameters only)")
            name = name_of[id(p)]
            if not p.requires_grad:
                raise ValueError(f"add_param_group: parameter {name} does not require grad")
            _check_parameter(name, p)
            if p.device != self._device:
                raise ValueError(f"add_param_group: parameter {name} is on {p.device}, the "
                                 f"others on {self._device}: every parameter must be on one "
                                 "device")
            if id(p) in added:
                raise ValueError(f"add_param_group: parameter {name} is in the group twice")
            added.add(id(p))
            index = group_of.get(id(p))
            if index is not None and index != self._default_group:
                raise ValueError("some parameters appear in more than one parameter group "
                                 f"(parameter {name} is in param_groups[{index}])")
        entry = {key: value for key, value in param_group.items() if key != "params"}
        merged = dict(self.defaults)
        merged.update(entry)
        self._group_values(len(self.param_groups), merged)  # ValueError naming the key
        entry.update({"params": params, "lr": float(merged["lr"]),
                      "weight_decay": float(merged["weight_decay"])})
        if self._default_group is not None:
            default = self.param_groups[self._default_group]["params"]
            default[:] = [p for p in default if id(p) not in added]
        super().add_param_group(entry)
        self._spec_values.append((entry["lr"], entry["weight_decay"]))
        for p in params:
            if id(p) not in self._hooks:
                self._hook_gradients(p)

    # ---- Backward: gradients to the worker ----

    def _before_accumulation(self, p):
        if p is not None and _handed_over(p.grad):
            p.grad = None
            self._pointed[self._index[id(p)]] = False

    def _on_gradient(self, p):
        if self._state != "attached":
            # The forward did not attach (it did not go through the model): attach now.
            self._ensure_attached(from_backward=True)
        if self._mode == "zero2":
            self._on_gradient_zero2(p)
            return
        t = self._index[id(p)]
        self._has_grad[t] = True
        if self._no_sync:
            return
        self._check_first_accumulation(t)
        self._ready[t] = True
        self._adopt_gradient(t)
        self._synchronize()
        request = attach_pb2.AttachRequest()
        request.ready.tensors.append(t)
        self._connection.send(request)
        if self._mode == "zero1":
            self._hand_over(t)
        elif not self._end_of_backward_queued:
            # ddp: backward ends by waiting for the averaged gradient, as torch's DDP does.
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward_ddp)
            self._end_of_backward_queued = True

    def _hand_over(self, t):
        """zero1/zero2: tensor t's gradient is the worker's now: .grad holds a HandedOverGradient
        if the tensor has a gradient, else stays None."""
        p = self._params[t]
        if self._has_grad[t]:
            p.grad = HandedOverGradient(p, self._names[t], self._mode)
            self._some_handed_over = True
        else:
            p.grad = None
        self._pointed[t] = False

    def _tensors_without_gradient(self):
        """Plan indices of the tensors that have no gradient (torch.optim skips them): what
        StepRequest.tensors_without_gradient tells the workers."""
        return [t for t, has in enumerate(self.__dict__.get("_has_grad", [])) if not has]

    def _check_first_accumulation(self, t):
        """A parameter's hook fires once per backward, unless the backward runs in pieces that
        accumulate it again (reentrant activation checkpointing): its gradient was handed over
        already, so the rest would be lost. Refused with the parameter's name."""
        if self._ready[t]:
            raise RuntimeError(
                f"parameter {self._names[t]}: its gradient accumulated twice in one backward "
                "(as reentrant activation checkpointing does for a parameter used inside and "
                "outside a checkpointed segment); the first accumulation was handed over to the "
                "worker already. Use torch.utils.checkpoint(..., use_reentrant=False)")

    def _adopt_gradient(self, t):
        """ddp/zero1: tensor t's gradient into the shared buffer, .grad pointing there. None (no
        gradient this step) counts as zero and stays None, as torch leaves it; a gradient handed
        over in this step's backward is the worker's already."""
        p, grad = self._params[t], self._grad_views[t]
        current = p.grad
        if _handed_over(current):
            return
        if current is None:
            grad.zero_()
            return
        self._has_grad[t] = True
        if current.data_ptr() != grad.data_ptr():
            if self._pointed[t] and not self._warned_replaced_grad:
                warnings.warn("a parameter's .grad was replaced (not accumulated in place): it is "
                              "copied into the shared buffer; keep .grad as the optimizer set it "
                              "to avoid the copy")
                self._warned_replaced_grad = True
            grad.copy_(current)
        p.grad = grad
        self._pointed[t] = True

    @torch.no_grad()
    def _end_of_backward_ddp(self):
        self._end_of_backward_queued = False
        self._average_gradients()

    def _average_gradients(self):
        """ddp: the rest of this step's gradients to the worker, which all-reduces them and
        leaves their average over ranks in the shared buffer. As torch's DDP leaves .grad after
        backward: a parameter some rank has a gradient for gets the buffer's view as .grad (also
        where this rank used it not: the others' gradients averaged with its zeros), one no
        rank has keeps None. The script may read and change them
        (torch.nn.utils.clip_grad_norm_) before step(), which applies them as they are."""
        for t in range(len(self._params)):
            if not self._ready[t]:
                self._adopt_gradient(t)
        self._synchronize()
        request = attach_pb2.AttachRequest()
        request.average_gradients.tensors_without_gradient.extend(
            self._tensors_without_gradient())
        response, _ = self._connection.call(request)
        unused = set(response.averaged.tensors_without_gradient)
        for t, (p, grad) in enumerate(zip(self._params, self._grad_views)):
            if t in unused:
                continue
            p.grad = grad
            self._pointed[t] = True
            self._has_grad[t] = True
        self._ready = [True] * len(self._params)
        self._averaged = True

    def _on_gradient_zero2(self, p):
        """zero2, inside no_sync or not: hands over what is ready without blocking; the end of
        this backward hands over the rest and ends the micro-batch."""
        t = self._index[id(p)]
        self._has_grad[t] = True
        self._check_first_accumulation(t)
        self._ready[t] = True
        if not self._end_of_backward_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self._end_of_backward_queued = True
        self._hand_over_zero2(wait=False)

    @torch.no_grad()
    def _end_of_backward(self):
        """zero2, when a backward ends: tensors that got no gradient count as zero; every
        tensor is handed over (waiting for bucket buffers now: backward has nothing left to
        overlap) and the worker reduces the micro-batch into its shard."""
        self._end_of_backward_queued = False
        self._ready = [True] * len(self._params)
        self._hand_over_zero2(wait=True)
        request = attach_pb2.AttachRequest()
        request.micro_batch_done.SetInParent()
        self._connection.send(request)
        self._micro_batches += 1
        self._begin_micro_batch()

    def _hand_over_zero2(self, wait):
        """Hands over tensors in plan order while the next one is ready. Without `wait` it
        stops at a segment the worker deferred (no free bucket buffer yet): that tensor and the
        later ones keep their .grad until the next try."""
        while self._next < len(self._params) and self._ready[self._next]:
            if not self._send_segments(self._next, wait):
                return
            self._next += 1
            self._next_segment = 0
    def _send_segments(self, t, wait):
        """Tensor t's segments from self._next_segment on; False when one was deferred."""
        p, layout = self._params[t], self._layouts[t]
        if p.grad is None or _handed_over(p.grad):
            source = None  # no gradient in this micro-batch: zero
        else:
            source = p.grad.reshape(-1)
            self._has_grad[t] = True
        ends = layout.segment_ends
        while self._next_segment < len(ends):
            begin = ends[self._next_segment - 1] if self._next_segment > 0 else 0
            end = ends[self._next_segment]
            request = attach_pb2.AttachRequest()
            request.segment.tensor, request.segment.begin, request.segment.end = t, begin, end
            request.segment.wait = wait
            response, _ = self._connection.call(request)
            if response.WhichOneof("response") == "deferred":
                self.deferred_segments += 1
                return False
            place = response.place
            destination = self._view(place.block, place.offset, end - begin, (end - begin,))
            if source is None:
                destination.zero_()
            else:
                destination.copy_(source[begin:end])
            self._synchronize()
            written = attach_pb2.AttachRequest()
            written.written.tensor, written.written.begin, written.written.end = t, begin, end
            self._connection.send(written)
            self._next_segment += 1
        self._hand_over(t)  # the trainer never holds every gradient at once
        return True

    @contextlib.contextmanager
    def no_sync(self):
        """ddp/zero1: gradients of the backward passes inside accumulate in the shared buffer
        and are reduced once, at step(). zero2 changes nothing: every backward hands its
        gradients over and the worker adds each micro-batch's reduced shard to the step's."""
        previous, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = previous

    # ---- torch.optim.Optimizer ----

    def _group_values(self, index, group):
        """attach_pb2.GroupValues of param group `index` as it is now; ValueError naming the
        group and key for a value the workers cannot take."""
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

        for key in _FIXED_KEYS[self._optimizer_kind]:
            if key in group and group[key] != self._hyper[key]:
                raise ValueError(f"param_groups[{index}]: {key} {group[key]!r} differs from the "
                                 f"job's {self._hyper[key]!r}; it cannot change during training "
                                 "(it decides the optimizer state's shape or is job-wide)")
        values = attach_pb2.GroupValues()
        values.lr = number("lr", group["lr"])
        values.weight_decay = number("weight_decay", group["weight_decay"])
        keys = _GROUP_KEYS[self._optimizer_kind]
        if "betas" in keys:
            betas = group.get("betas", self._hyper["betas"])
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"param_groups[{index}]: betas {betas!r} is not a pair")
            values.beta1 = number("betas[0]", betas[0], 0.0, 1.0, high_open=True)
            values.beta2 = number("betas[1]", betas[1], 0.0, 1.0, high_open=True)
        else:
            values.beta1, values.beta2 = self._hyper["betas"]
        values.eps = number("eps", group.get("eps", self._hyper["eps"]))
        if "momentum" in keys:
            momentum = number("momentum", group.get("momentum", self._hyper["momentum"]))
            if (momentum == 0.0) != (self._hyper["momentum"] == 0.0):
                raise ValueError(
                    f"param_groups[{index}]: momentum {momentum}: the job's optimizer state was "
                    f"made {'without' if self._hyper['momentum'] == 0.0 else 'with'} a momentum "
                    f"buffer (momentum {self._hyper['momentum']}); momentum may change, but not "
                    "to or from 0")
            values.momentum = momentum
            values.dampening = number("dampening",
                                      group.get("dampening", self._hyper["dampening"]), high=1.0)
            if self._hyper["nesterov"] and values.dampening != 0.0:
                raise ValueError(f"param_groups[{index}]: dampening {values.dampening}: nesterov "
                                 "needs dampening 0")
        return values

    def _check_parameters(self):
        for name, p, view in zip(self._names, self._params, self._param_views):
            if p.data_ptr() != view.data_ptr():
                raise ValueError(f"parameter {name}: its data was replaced after the "
                                 "ShardedOptimizer attached (at the model's first forward; the "
                                 "model changed)")

    @torch.no_grad()
    def step(self, closure=None, loss=None):
        """Hands over what backward has not, then waits for the worker's reduction, update and
        all-gather. `loss` (or the closure's) is reported to the job as this rank's loss."""
        self._ensure_attached()
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_parameters()
        # Every group's values as they are now (torch.optim reads them at every step).
        values = [self._group_values(index, self.param_groups[index])
                  for index in self._spec_groups]
        if self._default_group is not None:
            default = self._group_values(self._default_group,
                                         self.param_groups[self._default_group])
        else:
            # No tensor is in the default group: its entry is read by nobody.
            default = attach_pb2.GroupValues()
            default.CopyFrom(values[0])
        lr = self.param_groups[0]["lr"]
        self._hand_over_rest()
        request = attach_pb2.AttachRequest()
        request.step.loss = float(loss) if loss is not None else 0.0
        request.step.lr = lr
        request.step.param_groups.append(default)
        request.step.param_groups.extend(values)
        # torch.optim skips a parameter whose .grad is None: the workers skip a tensor no rank
        # has a gradient for (its state and step count stay).
        request.step.tensors_without_gradient.extend(self._tensors_without_gradient())
        response, _ = self._connection.call(request)
        self.last_step = response.step_result
        if self._mode == "zero1":
            # Every gradient is the worker's now; the shared buffer holds the reduction's pieces.
            for t, p in enumerate(self._params):
                p.grad = None
                self._pointed[t] = False
        self._clear_handed_over()
        self._begin_step()
        return loss

    def _hand_over_rest(self):
        """Before step() and clip_grad_norm_: what backward has not handed over goes to the
        worker (a tensor without a gradient as zeros). zero2: the rest of a backward whose end went
        unseen, or every tensor when no backward ran this step. ddp after the averaging: a .grad
        the script replaced (not changed in place) is copied into the shared buffer. Otherwise
        (ddp/zero1) each tensor's gradient into the shared buffer."""
        if self._mode == "zero2":
            begun = self._next > 0 or self._next_segment > 0 or any(self._ready)
            if begun or self._micro_batches == 0:
                self._ready = [True] * len(self._params)
                self._hand_over_zero2(wait=True)
        elif self._averaged:
            # The buffers are the same on every rank now: a .grad set to None stays as the
            # average (zeroing it on one rank would make the ranks' updates differ).
            for t, (p, grad) in enumerate(zip(self._params, self._grad_views)):
                if p.grad is not None and p.grad.data_ptr() != grad.data_ptr():
                    grad.copy_(p.grad)
                    p.grad = grad
        else:
            for t in range(len(self._params)):
                self._adopt_gradient(t)
        self._synchronize()

    def zero_grad(self, set_to_none=_OPTIMIZER_SET_TO_NONE):
        """As torch.optim's (the default of set_to_none is the installed torch's): True sets each
        .grad to None (the tensor has no gradient until a backward gives it one); False zeroes
        the gradients of the tensors that have one, in place: in ddp/zero1 .grad is then the
        shared gradient buffer's view (backward accumulates there, no copy), in zero2, and in
        zero1 for a gradient handed over since the last step, None (the worker has it)."""
        if self._state != "attached":
            for group in self.param_groups:
                for p in group["params"]:
                    _torch_zero_grad(p, set_to_none)
            return
        for t, (p, grad) in enumerate(zip(self._params, self._grad_views)):
            if set_to_none:
                self._has_grad[t] = False
            elif grad is not None and not _handed_over(p.grad) and (
                    self._has_grad[t] or p.grad is not None):
                grad.zero_()
                p.grad = grad
                self._pointed[t] = True
                continue
            p.grad = None
            self._pointed[t] = False

    def _zero_model_grad(self, set_to_none):
        """model.zero_grad(set_to_none): this optimizer's zero_grad, torch's for the model's
        parameters that it does not train."""
        ours = {id(p) for group in self.param_groups for p in group["params"]}
        for p in self._model.parameters():
            if id(p) not in ours:
                _torch_zero_grad(p, set_to_none)
        self.zero_grad(set_to_none)

    def _clear_handed_over(self):
        """HandedOverGradients go (at the next forward, step(), zero_grad()): .grad None."""
        if self._state != "attached" or not self._some_handed_over:
            return
        for t, p in enumerate(self._params):
            if _handed_over(p.grad):
                p.grad = None
                self._pointed[t] = False
        self._some_handed_over = False

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """torch.nn.utils.clip_grad_norm_ over every parameter of this optimizer, across all
        ranks' shards, as FSDP's clip_grad_norm_: returns the total norm of the gradient step()
        applies (averaged over ranks) as a tensor, and step() scales the gradients by
        min(1, max_norm / (total_norm + 1e-6)). norm_type: 2 or inf. Collective: every rank calls
        it with the same values, after the step's backward and before step().

        zero1/zero2: the workers compute the norm over their shards (.grad holds no values here)
        and apply the coefficient in step(). ddp: .grad holds the averaged gradient (as after
        torch's DDP backward), clipped in place by torch.nn.utils.clip_grad_norm_ itself."""
        try:
            norm_type = float(norm_type)
        except (TypeError, ValueError):
            raise ValueError(f"norm_type: {norm_type!r} is not a number") from None
        if norm_type not in (2.0, math.inf):
            raise ValueError(f"norm_type: {norm_type} is not supported (2.0 or inf: the norms the "
                             "workers compute over their shards)")
        try:
            max_norm = float(max_norm)
        except (TypeError, ValueError):
            raise ValueError(f"max_norm: {max_norm!r} is not a number") from None
        if not (math.isfinite(max_norm) and max_norm >= 0):
            raise ValueError(f"max_norm: {max_norm} must be finite and >= 0")
        self._ensure_attached()
        if self._mode == "ddp":
            if not self._averaged:
                self._average_gradients()
            return torch.nn.utils.clip_grad_norm_(self._params, max_norm, norm_type)
        self._hand_over_rest()
        request = attach_pb2.AttachRequest()
        request.clip_grad_norm.max_norm = max_norm
        request.clip_grad_norm.norm_type = norm_type
        response, _ = self._connection.call(request)
        if self._mode == "zero1":
            # The worker took every gradient left in the shared buffer.
            for t, p in enumerate(self._params):
                if p.grad is not None and not _handed_over(p.grad):
                    self._hand_over(t)
        return torch.tensor(response.grad_norm.total_norm, dtype=torch.float32,
                            device=self._device)

    # ---- state_dict / load_state_dict ----

    def _check_between_steps(self, what):
        if self._connection is None:
            raise RuntimeError(f"{what}: this optimizer has finished (zt.finish)")
        if any(self._ready) or self._next or self._micro_batches:
            raise RuntimeError(f"{what}: call it between steps (after step(), before a backward "
                               "hands this step's gradients over)")

    def _torch_optimizer(self, groups):
        """torch.optim's optimizer of this kind and hyperparameters over `groups`; None for lion
        (torch.optim has none)."""
        h = self._hyper
        kind = self._optimizer_kind
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
        return optimizer_class(groups, lr=self.defaults["lr"], **kwargs)

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
                   for group in self.param_groups]
        reference = self._torch_optimizer(dummies)
        if reference is None:  # lion: torch's conventions, our names (kernels/optimizer.h)
            groups = []
            first = 0
            for group in self.param_groups:
                groups.append({"lr": group["lr"], "betas": group["betas"],
                               "weight_decay": group["weight_decay"],
                               "maximize": self._hyper["maximize"],
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
        for ours, theirs in zip(self.param_groups, groups):
            theirs.update({key: value for key, value in ours.items() if key != "params"})
        return groups, template, initial

    def state_dict(self, consolidated=False):
        """Collective: every rank calls it at the same step, between steps.

        Sharded (default): each worker writes its shard of the current step's checkpoint (the
        job's checkpoint directory, docs/pytorch.md); returns a small picklable dict naming it:
        {"zeroshard_checkpoint": 1, "job_id", "step", "optimizer_step", "optimizer", "mode",
        "manifest" (absolute path of its manifest.json), "commit_time" (the manifest's, RFC 3339:
        which checkpoint of that step it is), "world_size", "param_groups"}.

        consolidated=True: the same checkpoint read back whole, as torch.optim's optimizer of this
        kind would return it: {"state": {index: {"step", "exp_avg", ...}}, "param_groups"}, the
        indices counting this optimizer's parameters group by group (model.parameters() order
        with one group). Every rank reads it (the files are on this host)."""
        self._check_between_steps("state_dict")
        request = attach_pb2.AttachRequest()
        request.save_state.SetInParent()
        response, _ = self._connection.call(request)
        saved = response.state_saved
        if saved.refused:
            raise RuntimeError(f"state_dict: the worker could not save the state: {saved.refused}")
        groups, template, initial = self._torch_layout()
        if not consolidated:
            manifest = _checkpoint.read_manifest(saved.manifest, expected_job_id=self._job_id)
            return {"zeroshard_checkpoint": 1, "job_id": self._job_id, "step": saved.step,
                    "optimizer_step": saved.optimizer_step, "optimizer": self._optimizer_kind,
                    "mode": self._mode, "manifest": saved.manifest,
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
        for group in self.param_groups:
            for p in group["params"]:
                name = self._names[self._index[id(p)]]
                step = steps[name]
                if step == 0 and initial:
                    # Never updated, with an optimizer that makes its state before the first
                    # step (Adagrad): torch's initial state.
                    state[index] = {key: value if not torch.is_tensor(value) or key == "step"
                                    else torch.full(p.shape, float(value.reshape(-1)[0]))
                                    for key, value in initial.items()}
                elif step > 0 and template:
                    entry = {}
                    for key, value in template.items():
                        if key == "step":
                            entry[key] = (torch.tensor(float(step), dtype=value.dtype)
                                          if torch.is_tensor(value) else type(value)(step))
                        elif value is None:
                            entry[key] = None
                        else:
                            if key not in full:
                                raise RuntimeError(f"state_dict: the checkpoint {saved.manifest} "
                                                   f"holds no {key} state")
                            entry[key] = full[key][name].view(p.shape).clone()
                    state[index] = entry
                index += 1
        return {"state": state, "param_groups": groups}

    def _check_groups(self, saved_groups):
        """ValueError naming the group when `saved_groups` cannot be this optimizer's."""
        self._check_group_layout(saved_groups)
        self._check_group_hyperparameters(saved_groups)

    def _check_group_layout(self, saved_groups):
        if not isinstance(saved_groups, list) or len(saved_groups) != len(self.param_groups):
            count = len(saved_groups) if isinstance(saved_groups, list) else "no list of"
            raise ValueError(f"param_groups: the state dict has {count} groups, this optimizer "
                             f"{len(self.param_groups)}")
        for index, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
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
            merged = dict(self.param_groups[index])
            merged.update({key: value for key, value in saved.items() if key != "params"})
            self._group_values(index, merged)

    def _apply_groups(self, saved_groups):
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({key: value for key, value in saved.items() if key != "params"})

    def load_state_dict(self, state_dict):
        """Collective: every rank calls it at the same step, between steps, with the same dict.

        Takes this optimizer's sharded state_dict() (of this job or another with the same model
        and optimizer, at any world size: the workers reshard it), which also restores the
        parameters to the checkpoint's; or a torch.optim-format one (state_dict(consolidated=
        True), or torch.optim's optimizer of the same kind), which restores the optimizer state
        and keeps the parameters as they are. The optimizer's step count continues from the
        dict's. ValueError naming what is wrong for a dict that does not fit (another layout,
        model, optimizer or hyperparameters, a missing file); nothing changes then."""
        self._check_between_steps("load_state_dict")
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

    def _load_sharded(self, state_dict):
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
        committed, header = _checkpoint.read_header(manifest,
                                                     expected_job_id=state_dict.get("job_id"))
        # A job that went back past this step and ran it again retired the state dict's checkpoint
        # (superseded, moved aside) and committed another one under the same name.
        saved_time = state_dict.get("commit_time")
        if saved_time is not None and committed.commit_time.ToJsonString() != saved_time:
            raise ValueError(f"manifest: {manifest} now holds another checkpoint of step "
                             f"{committed.step} (committed {committed.commit_time.ToJsonString()})"
                             f" than this state dict's (committed {saved_time}): its job went "
                             "back past that step and ran it again; the state dict's checkpoint "
                             "was superseded (kept beside it as superseded-step-*)")
        if len(header.tensors) != len(self._params):
            raise ValueError(f"manifest: the checkpoint {manifest} holds {len(header.tensors)} "
                             f"tensors, this model {len(self._params)} (another model)")
        for name, p, saved in zip(self._names, self._params, header.tensors):
            if saved.name != name or list(saved.shape) != list(p.shape):
                raise ValueError(f"parameter {name}: shape {list(p.shape)}, but the checkpoint "
                                 f"{manifest} has {saved.name} of shape {list(saved.shape)} "
                                 "(another model)")
        if header.optimizer != _OPTIMIZERS[self._optimizer_kind]:
            raise ValueError(f"optimizer: the checkpoint {manifest} holds "
                             f"{job_pb2.OptimizerKind.Name(header.optimizer)} state, this "
                             f"optimizer is {self._optimizer_kind}")
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

    def _load_torch_format(self, state_dict):
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_state, dict):
            raise ValueError(f"state: a dict expected, got {type(saved_state).__name__}")
        self._check_group_layout(saved_groups)
        _, template, _ = self._torch_layout()
        arrays_needed = [key for key, value in template.items()
                         if key != "step" and value is not None]
        # The saved indices name this optimizer's parameters group by group, as torch maps them.
        ours = [p for group in self.param_groups for p in group["params"]]
        param_of = dict(zip([i for group in saved_groups for i in group["params"]], ours))
        for index in saved_state:
            if index not in param_of:
                raise ValueError(f"state: parameter index {index} is in no param group")
        arrays = {}
        steps = {}
        has_state = any(saved_state.values())
        for index, p in param_of.items():
            name = self._names[self._index[id(p)]]
            entry = saved_state.get(index) or {}
            if not isinstance(entry, dict):
                raise ValueError(f"state[{index}] (parameter {name}): not a dict")
            unknown = set(entry) - set(template) - {"step"}
            if unknown:
                raise ValueError(f"state[{index}] (parameter {name}): {sorted(unknown)} are not "
                                 f"{self._optimizer_kind}'s state (another optimizer's dict?)")
            if not entry:
                # Never updated (torch.optim skipped it every step): its own step is 0, and its
                # first update initialises its state.
                for key in arrays_needed:
                    arrays[f"{key}/{name}"] = torch.zeros(p.numel())
                steps[name] = 0
                continue
            for key in arrays_needed:
                value = entry.get(key)
                if not torch.is_tensor(value):
                    raise ValueError(f"state[{index}] (parameter {name}): no {key} tensor "
                                     f"({self._optimizer_kind} needs {arrays_needed})")
                if value.numel() != p.numel():
                    raise ValueError(f"state[{index}] (parameter {name}): {key} has shape "
                                     f"{list(value.shape)}, the parameter {list(p.shape)}")
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
        self._check_group_hyperparameters(saved_groups)
        counted = [step for step in steps.values() if step is not None]
        optimizer_step = max(counted) if counted else (1 if has_state else 0)
        # Each tensor's own step, sent only when one differs from the optimizer's.
        tensor_steps = [optimizer_step if steps.get(name) is None else steps[name]
                        for name in self._names]
        for name, p in zip(self._names, self._params):
            arrays[f"param/{name}"] = p.detach()
        directory = tempfile.mkdtemp(prefix="zeroshard-state-")
        path = os.path.join(directory, "full_state.safetensors")
        try:
            _checkpoint.write_full_state(path, arrays)
            request = attach_pb2.AttachRequest()
            request.load_state.full_state_file = path
            request.load_state.optimizer_step = optimizer_step
            if counted:
                # The job's step follows the state's (none: SGD, or no step taken yet).
                request.load_state.step = max(counted)
            if any(step != optimizer_step for step in tensor_steps):
                request.load_state.tensor_steps.extend(tensor_steps)
            # Passed open: the worker never opens a path a trainer names.
            state_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                response, _ = self._connection.call(request, pass_fd=state_fd)
            finally:
                os.close(state_fd)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if response.state_loaded.refused:
            raise ValueError(f"state: the workers refused it: {response.state_loaded.refused}")
        self._apply_groups(saved_groups)

    def _finish(self):
        state, self._state = self._state, "finished"
        self._detach_from_model()
        connection, self._attach_connection = self._attach_connection, None
        if connection is None:
            return
        if state != "attached":
            connection.close()
            return
        request = attach_pb2.AttachRequest()
        request.finish.SetInParent()
        try:
            connection.call(request)
        finally:
            connection.close()

    def _detach_from_model(self):
        """Removes the hooks and model.zero_grad that the constructor installed, and the
        HandedOverGradients: the model is plain torch again."""
        self._forward_hook.remove()
        for handles in self._hooks.values():
            for handle in handles:
                if isinstance(handle, torch.utils.hooks.RemovableHandle):
                    handle.remove()
        self._hooks = {}
        if _model_optimizers.get(self._model) is self:
            del _model_optimizers[self._model]
            installed = self._model.__dict__.get("zero_grad")
            if getattr(installed, "__func__", None) is _model_zero_grad:
                del self._model.__dict__["zero_grad"]
        for group in self.param_groups:
            for p in group["params"]:
                if _handed_over(p.grad):
                    p.grad = None


def finish(optimizer=None):
    """Ends this rank's attachment of `optimizer` (default: every ShardedOptimizer): its worker
    ends the run successfully and the job succeeds once every rank finished. Called at exit."""
    if optimizer is not None:
        if optimizer in _optimizers:
            _optimizers.remove(optimizer)
        optimizer._finish()
        return
    while _optimizers:
        _optimizers.pop()._finish()


def _parameter_names(model):
    """(name, parameter) for every name model.state_dict() gives a parameter, tied weights
    included (pytorch/examples' LSTM has decoder.weight and encoder.weight, one Parameter), then
    any parameter state_dict() leaves out, under named_parameters()'s name."""
    named = [(name, value) for name, value in model.state_dict(keep_vars=True).items()
             if isinstance(value, torch.nn.Parameter)]
    seen = {name for name, _ in named}
    named += [(name, p) for name, p in model.named_parameters() if name not in seen]
    return named


def _tied_aliases(model, name_of):
    """{plan name: [its other names in model.state_dict()]} for the parameters `name_of` ({id:
    name}) holds: tied weights' aliases, in state_dict() order."""
    aliases = {}
    for name, p in _parameter_names(model):
        own = name_of.get(id(p))
        if own is not None and name != own:
            aliases.setdefault(own, []).append(name)
    return aliases


def save(model, path):
    """Rank 0 writes the model's parameters (fp32, torch's names and shapes) as safetensors:
    every name model.state_dict() has for a parameter, tied weights included (their data written
    under each name: safetensors has no aliasing), so that a strict load_state_dict of a plain
    torch model takes the file; the other ranks do nothing. Every rank holds the full parameters
    after step()."""
    if init().rank != 0:
        return
    _safetensors.write_f32(path, {name: p.detach().to("cpu", torch.float32).contiguous()
                                  for name, p in _parameter_names(model)}, replace=True)
