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
import math
import os
import shutil
import tempfile
import time
import warnings

import grpc
import torch

from zeroshard import _checkpoint
from zeroshard._attach import AttachConnection, AttachError, WorkerLost
from zeroshard._jobs import find_job
from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard import _channel
from zeroshard._proto.zeroshard.v1 import coordinator_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._proto.zeroshard.v1 import types_pb2

__all__ = ["init", "rank", "world_size", "ShardedOptimizer", "save", "finish", "WorkerLost",
           "AttachError"]

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
# How long a rank waits for rank 0's job to appear, and for its worker to take it.
_JOB_TIMEOUT_S = 120.0
# While a trainer waits for its welcome, it asks the coordinator this often whether the job
# ended meanwhile (then no generation will ever welcome it).
_WELCOME_POLL_S = 1.0
_FINAL_STATES = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED)

_environment = None
_optimizers = []
_jobs_submitted = 0


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


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose state and update live in ZeroShard's workers.

    optimizer: "sgd", "adam", "adamw", "adagrad" or "lion" (torch.optim's semantics).
    mode: "zero2" (default: gradients reduce-scattered bucket by bucket as backward produces
      them, only the owned shard kept), "zero1" or "ddp" (full gradients all-reduced, full state).
    param_groups: optional list of {"params": [...], "lr": ..., "weight_decay": ...} for
      subsets of the model's parameters; the rest form the default group (lr, weight_decay).
    clip_grad_norm: global-norm clipping across all shards (torch.nn.utils.clip_grad_norm_).
    Other keywords: betas, eps, momentum, dampening, nesterov, amsgrad, maximize, lr_decay,
      initial_accumulator_value, as torch.optim names them.

    bucket_elems: the job's gradient bucket size in elements (default: the planner's).

    LR schedulers work: step() sends the groups' current lr. Gradient accumulation: run the
    micro-batches but the last inside `with opt.no_sync():` (ddp/zero1 accumulate in the shared
    gradient buffer and reduce once per step; zero2 reduces every micro-batch into the owned
    shard, as DeepSpeed stage 2 does, so .grad never holds the full gradient).

    Faults: checkpoint_every=N has the workers checkpoint every N steps (sharded, kept:
    checkpoint_keep, default the job's 2); max_attempts=K lets the job start K generations. A
    trainer that dies ends the generation; zeroshard.launch restarts every trainer while the
    job has attempts left. The restarted script joins the job (rank 0 does not submit it again)
    and resumes where `opt.start_step` says: the latest checkpoint's step (the parameters are
    the checkpoint's), or 0 with the script's own initial parameters when there is none. The
    script starts its loop at opt.start_step and advances its data and LR schedule to it.
    """

    def __init__(self, model, optimizer="adamw", lr=1e-3, weight_decay=None, mode="zero2",
                 param_groups=None, clip_grad_norm=None, betas=(0.9, 0.999), eps=1e-8,
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
        for name, p in named:
            if p.is_sparse or p.layout != torch.strided:
                raise ValueError(f"parameter {name}: sparse parameters are not supported")
            if not p.is_contiguous():
                raise ValueError(f"parameter {name}: it is not contiguous")
            if p.dtype != torch.float32:
                raise ValueError(f"parameter {name}: dtype {p.dtype}, only torch.float32 is "
                                 "supported")
        # Every parameter on the CPU (CPU workers) or on one GPU (CUDA workers of the same GPU).
        self._device = named[0][1].device
        if self._device.type == "cuda" and self._device.index is None:
            self._device = torch.device("cuda", torch.cuda.current_device())
        if self._device.type not in ("cpu", "cuda"):
            raise ValueError(f"parameter {named[0][0]}: on {self._device}, only CPU and CUDA "
                             "parameters can attach to workers")
        for name, p in named:
            if p.device != self._device:
                raise ValueError(f"parameter {name}: on {p.device}, but {named[0][0]} is on "
                                 f"{self._device}: every parameter must be on one device")
        name_of = {id(p): name for name, p in named}

        # Groups: the user's, then the default group with everything else.
        groups = []
        grouped = set()
        per_group = {"params", "lr", "weight_decay", *_GROUP_KEYS[optimizer]}
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
        super().__init__(groups, defaults)
        base_lr = self.param_groups[0]["lr"]
        # The spec's lr_scale (within its range): the groups' own values come with every step.
        self._lr_scales = [min(g["lr"] / base_lr, 1000.0) if base_lr > 0 else 1.0
                           for g in self.param_groups]
        # StepRequest.param_groups' order: the default group, then the spec's groups.
        self._spec_groups = [i for i in range(len(self.param_groups)) if i != self._default_group]

        # The tensor list in gradient-ready order: the reverse of model.parameters().
        self._params = [p for _, p in reversed(named)]
        self._names = [name_of[id(p)] for p in self._params]
        group_of = {}
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                group_of[id(p)] = index
        spec = job_pb2.JobSpec()
        # One job per optimizer a script builds: the same sequence number on every rank.
        global _jobs_submitted
        _jobs_submitted += 1
        spec.name = f"{env.run_id}-{_jobs_submitted}"
        spec.run_key = f"{env.run_key}-{_jobs_submitted}"
        for name, p in zip(self._names, self._params):
            tensor = spec.workload.attached.tensors.add()
            tensor.name = name
            tensor.shape.extend(list(p.shape))
        spec.workload.attached.workers.extend(env.workers)
        spec.device_kind = types_pb2.CUDA if self._device.type == "cuda" else types_pb2.CPU
        spec.mode = _MODES[mode]
        spec.optimizer.kind = _OPTIMIZERS[optimizer]
        spec.optimizer.lr = base_lr
        default_decay = (self.param_groups[self._default_group]["weight_decay"]
                         if self._default_group is not None else weight_decay)
        spec.optimizer.weight_decay = default_decay
        spec.optimizer.beta1, spec.optimizer.beta2 = float(betas[0]), float(betas[1])
        spec.optimizer.eps = float(eps)
        spec.optimizer.momentum = float(momentum)
        spec.optimizer.dampening = float(dampening)
        spec.optimizer.nesterov = bool(nesterov)
        spec.optimizer.amsgrad = bool(amsgrad)
        spec.optimizer.maximize = bool(maximize)
        spec.optimizer.lr_decay = float(lr_decay)
        spec.optimizer.initial_accumulator_value = float(initial_accumulator_value)
        if clip_grad_norm:
            spec.clip_grad_norm = float(clip_grad_norm)
        if bucket_elems is not None:
            spec.bucket_elems = int(bucket_elems)
        spec.max_attempts = int(max_attempts)
        if checkpoint_every:
            spec.checkpoint.every_steps = int(checkpoint_every)
            # Under the job's name, which the launcher's run id makes unique.
            spec.checkpoint.dir = spec.name
            if checkpoint_keep is not None:
                spec.checkpoint.keep = int(checkpoint_keep)
        position = {id(p): t for t, p in enumerate(self._params)}
        for index, group in enumerate(self.param_groups):
            if index == self._default_group:
                continue
            proto_group = spec.param_groups.add()
            # By identity: the tensors' indices in workload.attached.tensors (any group size).
            proto_group.tensors.extend(position[id(p)] for p in group["params"])
            proto_group.weight_decay = group["weight_decay"]
            proto_group.lr_scale = self._lr_scales[index]

        self._job_id = self._join_job(spec)
        self._connection = AttachConnection(env.attach_socket)
        self._attach()
        _optimizers.append(self)

    # ---- Joining the job and attaching ----

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

    def _attach(self):
        hello = attach_pb2.AttachRequest()
        hello.hello.job_id = self._job_id
        hello.hello.rank = self._env.rank
        hello.hello.world_size = self._env.world_size
        hello.hello.device_kind = self._device.type
        self._connection.send(hello)
        welcome = self._await_welcome()
        self._check_worker_device(welcome)
        self.start_step = welcome.start_step
        if len(welcome.tensors) != len(self._params):
            raise ValueError(f"the job has {len(welcome.tensors)} parameters, this model "
                             f"{len(self._params)}: the ranks' models differ")
        self._layouts = list(welcome.tensors)
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
        with torch.no_grad():
            for p, view, grad in zip(self._params, self._param_views, self._grad_views):
                p.data = view
                p.grad = grad
        self._index = {id(p): t for t, p in enumerate(self._params)}
        self._no_sync = False
        # zero2: segments the worker deferred (no free bucket buffer when backward asked).
        self.deferred_segments = 0
        self._warned_replaced_grad = False
        self.last_step = None
        self._begin_step()
        self._hooks = []
        for p in self._params:
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_gradient))
            else:
                # torch 1.13: the AccumulateGrad node's hook, as DDP does (kept alive here).
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                handle = accumulator.register_hook(
                    lambda *unused, p=p: self._on_gradient(p))
                self._hooks.append((accumulator, handle))

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

    def _begin_micro_batch(self):
        self._ready = [False] * len(self._params)
        self._next = 0
        self._next_segment = 0  # of tensor self._next (zero2)

    def add_param_group(self, param_group):
        """Not supported: the job's plan, submitted when the optimizer was built, fixes which
        tensors the workers hold and how they are grouped. Build the optimizer with every group
        (param_groups=...) instead."""
        if not hasattr(self, "_job_id"):
            # torch.optim.Optimizer.__init__ adds the constructor's groups through here.
            return super().add_param_group(param_group)
        raise NotImplementedError(
            "add_param_group: a ShardedOptimizer's parameters and groups are fixed when it is "
            "built (the workers' shard plan covers exactly those tensors); pass every group to "
            "zt.ShardedOptimizer(..., param_groups=[...]) instead")

    # ---- Backward: gradients to the worker ----

    def _on_gradient(self, p):
        if self._mode == "zero2":
            self._on_gradient_zero2(p)
            return
        if self._no_sync:
            return
        t = self._index[id(p)]
        self._check_first_accumulation(t)
        self._ready[t] = True
        self._adopt_gradient(t)
        self._synchronize()
        request = attach_pb2.AttachRequest()
        request.ready.tensors.append(t)
        self._connection.send(request)

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
        """ddp/zero1: makes sure tensor t's gradient is in the shared buffer."""
        p, grad = self._params[t], self._grad_views[t]
        if p.grad is None:
            grad.zero_()
        elif p.grad.data_ptr() != grad.data_ptr():
            if not self._warned_replaced_grad:
                warnings.warn("a parameter's .grad was replaced (not accumulated in place): it is "
                              "copied into the shared buffer; keep .grad as the optimizer set it "
                              "to avoid the copy")
                self._warned_replaced_grad = True
            grad.copy_(p.grad)
        p.grad = grad

    def _on_gradient_zero2(self, p):
        """zero2, inside no_sync or not: hands over what is ready without blocking; the end of
        this backward hands over the rest and ends the micro-batch."""
        t = self._index[id(p)]
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
        source = p.grad.reshape(-1) if p.grad is not None else None
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
        p.grad = None  # the worker has it; the trainer never holds every gradient at once
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
                                 "ShardedOptimizer was built (the model changed)")

    @torch.no_grad()
    def step(self, closure=None, loss=None):
        """Hands over what backward has not, then waits for the worker's reduction, update and
        all-gather. `loss` (or the closure's) is reported to the job as this rank's loss."""
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
        if self._mode == "zero2":
            begun = self._next > 0 or self._next_segment > 0 or any(self._ready)
            if begun or self._micro_batches == 0:
                # A backward whose end went unseen, or none this step: the rest counts as zero.
                self._ready = [True] * len(self._params)
                self._hand_over_zero2(wait=True)
        else:
            for t in range(len(self._params)):
                self._adopt_gradient(t)
        self._synchronize()
        request = attach_pb2.AttachRequest()
        request.step.loss = float(loss) if loss is not None else 0.0
        request.step.lr = lr
        request.step.param_groups.append(default)
        request.step.param_groups.extend(values)
        response, _ = self._connection.call(request)
        self.last_step = response.step_result
        self._begin_step()
        return loss

    def zero_grad(self, set_to_none=None):
        """Zeroes the gradients in place (the shared buffer in ddp/zero1), whatever set_to_none
        says: the worker reads them from there."""
        for p, grad in zip(self._params, self._grad_views):
            if grad is None:
                p.grad = None
            else:
                grad.zero_()
                p.grad = grad

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
        optimizer's group order) and one parameter's state after a step (its keys in torch's
        order, "step" as torch stores it, None where torch keeps None)."""
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
        else:
            groups = reference.state_dict()["param_groups"]
            probe = torch.zeros(1, requires_grad=True)
            probe_optimizer = self._torch_optimizer([{"params": [probe]}])
            probe.grad = torch.ones(1)
            probe_optimizer.step()
            template = probe_optimizer.state_dict()["state"].get(0, {})
        for ours, theirs in zip(self.param_groups, groups):
            theirs.update({key: value for key, value in ours.items() if key != "params"})
        return groups, template

    def state_dict(self, consolidated=False):
        """Collective: every rank calls it at the same step, between steps.

        Sharded (default): each worker writes its shard of the current step's checkpoint (the
        job's checkpoint directory, docs/pytorch.md); returns a small picklable dict naming it:
        {"zeroshard_checkpoint": 1, "job_id", "step", "optimizer_step", "optimizer", "mode",
        "manifest" (absolute path of its manifest.json), "world_size", "param_groups"}.

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
        groups, template = self._torch_layout()
        if not consolidated:
            return {"zeroshard_checkpoint": 1, "job_id": self._job_id, "step": saved.step,
                    "optimizer_step": saved.optimizer_step, "optimizer": self._optimizer_kind,
                    "mode": self._mode, "manifest": saved.manifest,
                    "world_size": saved.world_size, "param_groups": groups}
        header, full = _checkpoint.read_full_state(saved.manifest, expected_job_id=self._job_id)
        step = header.optimizer_step
        state = {}
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                name = self._names[self._index[id(p)]]
                if step > 0 and template:
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
        _, header = _checkpoint.read_header(manifest, expected_job_id=state_dict.get("job_id"))
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
        _, template = self._torch_layout()
        arrays_needed = [key for key, value in template.items()
                         if key != "step" and value is not None]
        # The saved indices name this optimizer's parameters group by group, as torch maps them.
        ours = [p for group in self.param_groups for p in group["params"]]
        param_of = dict(zip([i for group in saved_groups for i in group["params"]], ours))
        for index in saved_state:
            if index not in param_of:
                raise ValueError(f"state: parameter index {index} is in no param group")
        arrays = {}
        steps = set()
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
                if has_state and arrays_needed:
                    raise ValueError(f"state[{index}] (parameter {name}): no state, while other "
                                     "parameters have some")
                for key in arrays_needed:
                    arrays[f"{key}/{name}"] = torch.zeros(p.numel())
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
                steps.add(int(float(entry["step"])))
        if len(steps) > 1:
            raise ValueError(f"state: the parameters' step counts differ ({sorted(steps)}); "
                             "ZeroShard keeps one count for all")
        self._check_group_hyperparameters(saved_groups)
        optimizer_step = steps.pop() if steps else (1 if has_state else 0)
        for name, p in zip(self._names, self._params):
            arrays[f"param/{name}"] = p.detach()
        directory = tempfile.mkdtemp(prefix="zeroshard-state-")
        path = os.path.join(directory, "full_state.safetensors")
        try:
            _checkpoint.write_full_state(path, arrays)
            request = attach_pb2.AttachRequest()
            request.load_state.full_state_file = path
            request.load_state.optimizer_step = optimizer_step
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
        if self._connection is None:
            return
        request = attach_pb2.AttachRequest()
        request.finish.SetInParent()
        try:
            self._connection.call(request)
        finally:
            self._connection.close()
            self._connection = None


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


def save(model, path):
    """Rank 0 writes the model's parameters (fp32, torch's names and shapes) as safetensors;
    the other ranks do nothing. Every rank holds the full parameters after step()."""
    if init().rank != 0:
        return
    import json
    import struct
    tensors = {name: p.detach().to("cpu", torch.float32).contiguous()
               for name, p in model.named_parameters()}
    header = {}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        for tensor in tensors.values():
            out.write(tensor.numpy().tobytes())
    os.replace(temporary, path)
