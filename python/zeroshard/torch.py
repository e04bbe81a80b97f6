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
import time
import warnings

import grpc
import torch

from zeroshard._attach import AttachConnection, AttachError, WorkerLost
from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2

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
# torch.optim's default weight decay per optimizer (AdamW decays by default).
_DEFAULT_WEIGHT_DECAY = {"sgd": 0.0, "adam": 0.0, "adamw": 1e-2, "adagrad": 0.0, "lion": 0.0}
# How long a rank waits for rank 0's job to appear, and for its worker to take it.
_JOB_TIMEOUT_S = 120.0

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


def _fnmatch_literal(name):
    """A pattern that matches exactly `name` (param groups are fnmatch patterns)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in name)


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
    """

    def __init__(self, model, optimizer="adamw", lr=1e-3, weight_decay=None, mode="zero2",
                 param_groups=None, clip_grad_norm=None, betas=(0.9, 0.999), eps=1e-8,
                 momentum=0.0, dampening=0.0, nesterov=False, amsgrad=False, maximize=False,
                 lr_decay=0.0, initial_accumulator_value=0.0, bucket_elems=None):
        env = init()
        if optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer: '{optimizer}' is not one of {sorted(_OPTIMIZERS)}")
        if mode not in _MODES:
            raise ValueError(f"mode: '{mode}' is not one of {sorted(_MODES)}")
        if weight_decay is None:
            weight_decay = _DEFAULT_WEIGHT_DECAY[optimizer]
        self._env = env
        self._mode = mode
        self._model = model
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
            if p.device.type != "cpu":
                raise ValueError(f"parameter {name}: on {p.device}, only CPU parameters can "
                                 "attach to CPU workers")
        name_of = {id(p): name for name, p in named}

        # Groups: the user's, then the default group with everything else.
        groups = []
        grouped = set()
        for index, group in enumerate(param_groups or []):
            unknown = set(group) - {"params", "lr", "weight_decay"}
            if unknown:
                raise ValueError(f"param_groups[{index}]: keys {sorted(unknown)} are not "
                                 "supported (only params, lr, weight_decay may differ per group)")
            members = list(group.get("params", []))
            for p in members:
                if id(p) not in name_of:
                    raise ValueError(f"param_groups[{index}]: holds a tensor that is not a "
                                     "trainable parameter of the model")
                if id(p) in grouped:
                    raise ValueError(f"parameter {name_of[id(p)]}: in two param_groups")
                grouped.add(id(p))
            groups.append({"params": members, "lr": float(group.get("lr", lr)),
                           "weight_decay": float(group.get("weight_decay", weight_decay))})
        rest = [p for _, p in named if id(p) not in grouped]
        if rest:
            groups.insert(0, {"params": rest, "lr": float(lr),
                              "weight_decay": float(weight_decay)})
            self._default_group = 0
        else:
            self._default_group = None
        super().__init__(groups, {"lr": float(lr), "weight_decay": float(weight_decay)})
        base_lr = self.param_groups[0]["lr"]
        self._lr_scales = [g["lr"] / base_lr if base_lr > 0 else 1.0 for g in self.param_groups]

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
        for name, p in zip(self._names, self._params):
            tensor = spec.workload.attached.tensors.add()
            tensor.name = name
            tensor.shape.extend(list(p.shape))
        spec.workload.attached.workers.extend(env.workers)
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
        spec.max_attempts = 1
        for index, group in enumerate(self.param_groups):
            if index == self._default_group:
                continue
            proto_group = spec.param_groups.add()
            proto_group.patterns.extend(_fnmatch_literal(name_of[id(p)]) for p in group["params"])
            proto_group.weight_decay = group["weight_decay"]
            proto_group.lr_scale = self._lr_scales[index]

        self._job_id = self._join_job(spec)
        self._connection = AttachConnection(env.attach_socket)
        self._attach()
        _optimizers.append(self)

    # ---- Joining the job and attaching ----

    def _join_job(self, spec):
        channel = grpc.insecure_channel(self._env.coordinator)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            if self._env.rank == 0:
                job = stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=30)
                return job.id
            deadline = time.monotonic() + _JOB_TIMEOUT_S
            while time.monotonic() < deadline:
                jobs = stub.ListJobs(coordinator_pb2.ListJobsRequest(limit=1000), timeout=30)
                for job in jobs.jobs:
                    if job.spec.name == spec.name:
                        return job.id
                time.sleep(0.05)
            raise RuntimeError(f"rank 0 did not submit job {spec.name} within "
                               f"{_JOB_TIMEOUT_S:.0f} s")
        except grpc.RpcError as e:
            raise RuntimeError(f"the coordinator at {self._env.coordinator} refused the job: "
                               f"{e.code().name}: {e.details()}") from None
        finally:
            channel.close()

    def _attach(self):
        hello = attach_pb2.AttachRequest()
        hello.hello.job_id = self._job_id
        hello.hello.rank = self._env.rank
        hello.hello.world_size = self._env.world_size
        response, _ = self._connection.call(hello)
        welcome = response.welcome
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

    def _view(self, block, offset, elements, shape):
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

    # ---- Backward: gradients to the worker ----

    def _on_gradient(self, p):
        if self._mode == "zero2":
            self._on_gradient_zero2(p)
            return
        if self._no_sync:
            return
        t = self._index[id(p)]
        self._ready[t] = True
        if self._mode == "zero2":
            self._hand_over_zero2()
        else:
            self._adopt_gradient(t)
            request = attach_pb2.AttachRequest()
            request.ready.tensors.append(t)
            self._connection.send(request)

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
        self._ready[self._index[id(p)]] = True
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
            destination = torch.frombuffer(self._connection.block(place.block),
                                           dtype=torch.float32, count=end - begin,
                                           offset=place.offset)
            if source is None:
                destination.zero_()
            else:
                destination.copy_(source[begin:end])
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

    def _base_lr(self):
        base = self.param_groups[0]["lr"] / self._lr_scales[0]
        for index, group in enumerate(self.param_groups):
            expected = base * self._lr_scales[index]
            if not math.isclose(group["lr"], expected, rel_tol=1e-9, abs_tol=1e-15):
                raise ValueError(
                    f"param_groups[{index}]: lr {group['lr']} breaks the ratio to group 0's lr "
                    f"it had when the optimizer was built ({self._lr_scales[index]}); groups' lrs "
                    "may change only by the same factor (as LR schedulers do)")
        return base

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
        lr = self._base_lr()
        if self._mode == "zero2":
            begun = self._next > 0 or self._next_segment > 0 or any(self._ready)
            if begun or self._micro_batches == 0:
                # A backward whose end went unseen, or none this step: the rest counts as zero.
                self._ready = [True] * len(self._params)
                self._hand_over_zero2(wait=True)
        else:
            for t in range(len(self._params)):
                self._adopt_gradient(t)
        request = attach_pb2.AttachRequest()
        request.step.loss = float(loss) if loss is not None else 0.0
        request.step.lr = lr
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

    def state_dict(self):
        raise NotImplementedError(
            "ShardedOptimizer.state_dict: the optimizer state lives in the workers; use the "
            "job's checkpoints (checkpoint policy) and `zeroshard export` for now")

    def load_state_dict(self, state_dict):
        raise NotImplementedError("ShardedOptimizer.load_state_dict: see state_dict")

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
    tensors = {name: p.detach().to(torch.float32).contiguous()
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
