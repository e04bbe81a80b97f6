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
issued the parameters' all-gather; each module's next forward waits only for its own parameters
(zero1/zero2; overlap_all_gather=False waits for all in step()). The optimizer state never enters
this process.
"""

# This module is the public face: the launcher's environment, ShardedOptimizer (a
# torch.optim.Optimizer whose methods delegate), finish and save. Behind it: _torch_job_spec (the
# settings, groups, plan and JobSpec), _torch_attachment (the job's submission, the attach and the
# lifecycle states), _torch_gradients (the gradient hand-over and zero_grad) and _torch_state_dict
# (state_dict / load_state_dict).

import atexit
import contextlib
import math
import os
import sys

import torch

from zeroshard import _safetensors
from zeroshard import _torch_job_spec as _job_spec
from zeroshard._attach import AttachError, WorkerLost, WrongWorker
from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._torch_attachment import Attachment
from zeroshard._torch_gradients import (OPTIMIZER_SET_TO_NONE, HandedOverGradient, handed_over,
                                        hook_model, hook_parameter, remove_hooks,
                                        torch_zero_grad, unhook_model)
from zeroshard._torch_parameters import ParameterWaits
from zeroshard._torch_zero3 import ShardedParameters

__all__ = ["init", "rank", "world_size", "ShardedOptimizer", "HandedOverGradient", "save",
           "finish", "WorkerLost", "AttachError", "WrongWorker"]

_environment = None
_optimizers = []
_jobs_submitted = 0
# "Type: message" of the exception that is ending the script (the excepthook's), else None.
_uncaught = None
# The longest failure text a finish carries to the worker (it becomes the job's message).
_FAILURE_TEXT_LIMIT = 1000


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
        _install_excepthook()
        atexit.register(_finish_at_exit)
    return _environment


def _describe(exc_type, exc):
    text = f"{exc_type.__name__}: {exc}"
    if len(text) > _FAILURE_TEXT_LIMIT:
        text = text[:_FAILURE_TEXT_LIMIT - 3] + "..."
    return text


def _install_excepthook():
    """Chains sys.excepthook so that an uncaught exception is the job's failure: the exit's
    finish then tells each worker that the script failed (its type and message), the run fails
    and the job is retried per max_attempts, instead of ending as a success."""
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        global _uncaught
        _uncaught = _describe(exc_type, exc)
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook


def _finish_at_exit():
    """atexit: finish every ShardedOptimizer, as failed when the script ends by an uncaught
    exception. A script that replaced sys.excepthook after init() still has the exception in
    sys.last_value (the interpreter sets it before atexit runs)."""
    failure = _uncaught
    if failure is None and getattr(sys, "last_value", None) is not None:
        failure = _describe(type(sys.last_value), sys.last_value)
    while _optimizers:
        _optimizers.pop()._finish(failure)


def rank():
    return init().rank


def world_size():
    return init().world_size


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer whose state and update live in ZeroShard's workers.

    optimizer: "sgd", "adam", "adamw", "adagrad" or "lion" (torch.optim's semantics).
    mode: "zero2" (default: gradients reduce-scattered bucket by bucket as backward produces
      them, only the owned shard kept), "zero1" or "ddp" (full gradients all-reduced, full state),
      or "zero3" (as zero2, and the parameters too are sharded: between uses each parameter's
      storage is empty; each module's are gathered before its forward and again before its
      backward, and freed after; read them whole inside `with opt.full_parameters():`, and after
      zt.finish the model holds the last values again).
    param_groups: optional list of {"params": [...], "lr": ..., "weight_decay": ...} for
      subsets of the model's parameters; the rest form the default group (lr, weight_decay).
    clip_grad_norm: global-norm clipping across all shards in every step (as calling
      opt.clip_grad_norm_(clip_grad_norm) after each backward).
    Other keywords: betas, eps (default: the torch.optim class's, Adagrad's 1e-10), momentum,
      dampening, nesterov, amsgrad, maximize, lr_decay, initial_accumulator_value, as
      torch.optim names them.

    bucket_elems: the job's gradient bucket size in elements (default: the planner's).
    overlap_all_gather: zero1/zero2: step() returns once the workers applied the update and
      issued the parameters' all-gather (default True), and each module's forward pre-hook waits
      only for the parameters in it (nn.Sequential and the like: only their own); tied
      parameters and those registered on the model itself are waited for before the model's
      forward. Each module's parameters(), named_parameters() and state_dict() wait for the
      pending ones they hold; this optimizer's state_dict(), load_state_dict(), zt.save and
      zt.finish for every pending one; code that reads parameters another way between step()
      and the next forward (an EMA over references taken earlier) calls
      opt.wait_for_parameters() first. False: step() waits for the whole all-gather.

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
                 checkpoint_every=0, checkpoint_keep=None, max_attempts=1,
                 overlap_all_gather=True):
        _check_model_argument(model)
        env = init()
        settings = _job_spec.JobSettings(
            optimizer, mode, weight_decay, eps, betas, momentum, dampening, nesterov, amsgrad,
            maximize, lr_decay, initial_accumulator_value, clip_grad_norm, bucket_elems,
            checkpoint_every, checkpoint_keep, max_attempts)
        self._env = env
        self._settings = settings
        self._model = model
        named = _job_spec.trainable_parameters(model)
        self._device = _job_spec.common_device(named)
        groups, self._default_group = _job_spec.constructor_groups(settings, named, param_groups,
                                                                   lr)
        # One job per optimizer a script builds: numbered in construction order, the same on
        # every rank.
        global _jobs_submitted
        _jobs_submitted += 1
        self._sequence = _jobs_submitted
        # Each group's (lr, weight_decay) as it was added: the job spec's values (lr_scale
        # included), whatever a scheduler set before the job is submitted (LambdaLR's warm-up
        # may set lr 0, which a spec cannot hold); step() sends the groups' current values.
        self._spec_values = []
        self._attachment = Attachment(env, settings)
        super().__init__(groups, settings.defaults(lr, settings.weight_decay))
        self._attachment.built()
        self._no_sync = False
        self.last_step = None
        self._overlap_all_gather = bool(overlap_all_gather)
        # Made at the attach (the module hooks need the plan).
        self._parameter_waits = None
        self._sharded = None  # zero3's ShardedParameters
        # id(p) -> its gradient hooks' handles (and torch 1.13's AccumulateGrad node, kept alive).
        self._hooks = {}
        for _, p in named:
            self._hook_gradients(p)
        self._forward_hook = hook_model(model, self)
        _optimizers.append(self)

    # ---- Submitting the job and attaching, at the first need ----

    @property
    def start_step(self):
        """The step this attachment starts at: 0, or after a restart the checkpoint's (reading
        it attaches)."""
        return self._attached_value("start_step")

    # What exists once attached; reading one attaches first (tests and benchmarks read them).
    @property
    def _job_id(self):
        return self._attached_value("job_id")

    @property
    def _layouts(self):
        return self._attached_value("layouts")

    @property
    def _connection(self):
        """The attach connection; None once finished."""
        if self._attachment.finished:
            return None
        return self._attached_value("connection")

    @property
    def deferred_segments(self):
        """zero2: segments the worker deferred (no free bucket buffer when backward asked)."""
        hand_over = self._attachment.hand_over
        return hand_over.deferred_segments if hand_over is not None else 0

    def _attached_value(self, name):
        if not self._attachment.finished:
            self._ensure_attached()
        return getattr(self._attachment, name)

    def _ensure_attached(self, from_backward=False):
        self._attachment.ensure(self._plan_job, self.param_groups, self.defaults["lr"],
                                from_backward)
        if self._parameter_waits is None and self._attachment.attached:
            self._parameter_waits = ParameterWaits(self._model, self._attachment.plan,
                                                   self._attachment.connection)
            if self._settings.mode == "zero3":
                self._sharded = ShardedParameters(self._model, self._attachment.plan,
                                                  self._attachment.connection,
                                                  self._attachment.pool_view)
                self._attachment.state_dicts.parameter_stream = self._sharded.parameter_stream

    def _plan_job(self):
        """The plan and job spec of the groups as they are now (Attachment.ensure's)."""
        plan = _job_spec.plan_job(self._settings, self._model, self.param_groups,
                                  self._default_group)
        self._device = plan.device
        spec = _job_spec.job_spec(self._settings, self._env, self._sequence, self._model, plan,
                                  self.param_groups, self._spec_values, self._default_group,
                                  self.defaults["weight_decay"])
        return plan, spec

    def _before_forward(self):
        self._ensure_attached()
        if self._parameter_waits is not None:
            self._parameter_waits.before_root()
        if self._sharded is not None:
            self._sharded.before_root()
        self._clear_handed_over()

    def wait_for_parameters(self):
        """Returns once every parameter's all-gather since the last step() is done (at once
        when none is pending, or with overlap_all_gather=False): call it before reading
        parameters outside their modules' forward (an EMA copy, a functional call on another
        module's weight)."""
        if self._parameter_waits is not None and not self._attachment.finished:
            self._parameter_waits.wait_all()

    def full_parameters(self, writeback=True):
        """A context manager inside which every parameter holds its full values, as FSDP's
        summon_full_params. zero3: gathered a module at a time on entry and freed at exit
        (collective: every rank enters and leaves it at the same point); with `writeback`, the
        values written inside go back to the owning ranks at exit (write the same values on
        every rank: each keeps only its own pieces). Other modes: the parameters are always
        whole and writes land in place (the pending all-gathers are waited for)."""
        if self._sharded is None:
            self.wait_for_parameters()
            return contextlib.nullcontext()
        return self._sharded.full_parameters(writeback)

    def _hook_gradients(self, p):
        self._hooks[id(p)] = hook_parameter(p, self._before_accumulation, self._on_gradient)

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
        state = self._attachment.state
        if state is Attachment.State.CONSTRUCTING:  # torch.optim.Optimizer.__init__ adds ours
            super().add_param_group(param_group)
            self._spec_values.append((param_group["lr"], param_group["weight_decay"]))
            return
        if state is not Attachment.State.BUILT:
            raise NotImplementedError(
                "add_param_group: the job was submitted at the model's first forward (or the "
                "first step(), state_dict(), load_state_dict() or start_step), and its shard "
                "plan fixes which tensors the workers hold and how they are grouped; add groups "
                "before that, or pass them as zt.ShardedOptimizer(..., param_groups=[...])")
        entry, added = _job_spec.added_group(self._settings, self._model, self.param_groups,
                                             self._default_group, self._device, self.defaults,
                                             param_group)
        if self._default_group is not None:
            default = self.param_groups[self._default_group]["params"]
            default[:] = [p for p in default if id(p) not in added]
        super().add_param_group(entry)
        self._spec_values.append((entry["lr"], entry["weight_decay"]))
        for p in entry["params"]:
            if id(p) not in self._hooks:
                self._hook_gradients(p)

    # ---- Backward: gradients to the worker (_torch_gradients.GradientHandOver) ----

    def _before_accumulation(self, p):
        if p is not None and handed_over(p.grad):
            self._attachment.hand_over.drop_handed_over(p)

    def _on_gradient(self, p):
        if not self._attachment.attached:
            # The forward did not attach (it did not go through the model): attach now.
            self._ensure_attached(from_backward=True)
        self._attachment.hand_over.on_gradient(p, self._no_sync)
        if self._sharded is not None:
            self._sharded.on_gradient(self._attachment.plan.index[id(p)])

    def _tensors_without_gradient(self):
        """Plan indices of the tensors that have no gradient (torch.optim skips them): what
        StepRequest.tensors_without_gradient tells the workers."""
        hand_over = self._attachment.hand_over
        return hand_over.tensors_without_gradient() if hand_over is not None else []

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

    @torch.no_grad()
    def step(self, closure=None, loss=None):
        """Hands over what backward has not, then waits for the worker's reduction and update,
        and (overlap_all_gather=False, or ddp) the all-gather. `loss` (or the closure's) is
        reported to the job as this rank's loss."""
        self._ensure_attached()
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        attachment = self._attachment
        attachment.check_parameters()
        # Every group's values as they are now (torch.optim reads them at every step).
        group_values = self._settings.group_values
        values = [group_values(index, self.param_groups[index])
                  for index in attachment.plan.spec_groups]
        if self._default_group is not None:
            default = group_values(self._default_group, self.param_groups[self._default_group])
        else:
            # No tensor is in the default group: its entry is read by nobody.
            default = attach_pb2.GroupValues()
            default.CopyFrom(values[0])
        lr = self.param_groups[0]["lr"]
        hand_over = attachment.hand_over
        # After GradScaler.unscale_: the worker scales by 1/scale (and the clip) in this step.
        hand_over.apply_unscale(self._settings.options["clip_grad_norm"])
        hand_over.hand_over_rest()
        request = attach_pb2.AttachRequest()
        request.step.loss = float(loss) if loss is not None else 0.0
        request.step.lr = lr
        request.step.param_groups.append(default)
        request.step.param_groups.extend(values)
        # torch.optim skips a parameter whose .grad is None: the workers skip a tensor no rank
        # has a gradient for (its state and step count stay).
        request.step.tensors_without_gradient.extend(hand_over.tensors_without_gradient())
        request.step.overlap_all_gather = self._overlap_all_gather
        response, _ = attachment.connection.call(request)
        self.last_step = response.step_result
        self._parameter_waits.after_step(response.step_result.parameters_pending)
        hand_over.after_step()
        hand_over.end_scaler_step()
        return loss

    def zero_grad(self, set_to_none=OPTIMIZER_SET_TO_NONE):
        """As torch.optim's (the default of set_to_none is the installed torch's): True sets each
        .grad to None (the tensor has no gradient until a backward gives it one); False zeroes
        the gradients of the tensors that have one, in place: in ddp/zero1 .grad is then the
        shared gradient buffer's view (backward accumulates there, no copy), in zero2, and in
        zero1 for a gradient handed over since the last step, None (the worker has it)."""
        if not self._attachment.attached:
            for group in self.param_groups:
                for p in group["params"]:
                    torch_zero_grad(p, set_to_none)
            return
        if self._attachment.hand_over.scaler_skip_pending():
            # GradScaler found NaN or Inf and did not call step(): the worker's step ends here,
            # skipped by its own non-finite check (nothing updated, no state advanced).
            self.step()
        self._attachment.hand_over.zero_grad(set_to_none)

    def _zero_model_grad(self, set_to_none):
        """model.zero_grad(set_to_none): this optimizer's zero_grad, torch's for the model's
        parameters that it does not train."""
        ours = {id(p) for group in self.param_groups for p in group["params"]}
        # Not model.parameters(): that waits for the all-gathers, which a zero_grad() after
        # step() must not (the next forward waits for each module's).
        model_parameters = {id(p): p for module in self._model.modules()
                            for p in module._parameters.values() if p is not None}
        for p in model_parameters.values():
            if id(p) not in ours:
                torch_zero_grad(p, set_to_none)
        self.zero_grad(set_to_none)

    def _clear_handed_over(self):
        """HandedOverGradients go (at the next forward, step(), zero_grad()): .grad None."""
        if self._attachment.attached:
            self._attachment.hand_over.clear_handed_over()

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
        return self._attachment.hand_over.clip_grad_norm(max_norm, norm_type)

    # ---- state_dict / load_state_dict (_torch_state_dict.OptimizerState) ----

    def _check_between_steps(self, what):
        if self._connection is None:
            raise RuntimeError(f"{what}: this optimizer has finished (zt.finish)")
        if not self._attachment.hand_over.between_steps():
            raise RuntimeError(f"{what}: call it between steps (after step(), before a backward "
                               "hands this step's gradients over)")

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
        self.wait_for_parameters()
        return self._attachment.state_dicts.state_dict(consolidated)

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
        self.wait_for_parameters()
        self._attachment.state_dicts.load(state_dict)

    # ---- The end ----

    def _finish(self, failure=None):
        """`failure`: why the script ends (an uncaught exception), which fails the run."""
        if self._attachment.finished:
            return
        if self._sharded is not None and self._attachment.attached and failure is None:
            # The model stays the user's: plain torch with the last values.
            self._sharded.keep_all()
        self._detach_from_model()
        # The worker waits for every all-gather before it answers finish: afterwards the
        # parameters (still the shared views) hold the last step's values.
        self._attachment.finish(failure)
        if self._parameter_waits is not None:
            self._parameter_waits.forget()

    def _detach_from_model(self):
        """Removes the hooks and model.zero_grad that the constructor installed, and the
        HandedOverGradients: the model is plain torch again."""
        unhook_model(self._model, self, self._forward_hook)
        if self._parameter_waits is not None:
            self._parameter_waits.remove()
        if self._sharded is not None:
            self._sharded.remove()
        for handles in self._hooks.values():
            remove_hooks(handles)
        self._hooks = {}
        for group in self.param_groups:
            for p in group["params"]:
                if handed_over(p.grad):
                    p.grad = None


def _check_model_argument(model):
    """TypeError saying what to pass when `model` is not an nn.Module (torch.optim's habit of
    passing model.parameters() or a list of groups)."""
    if isinstance(model, torch.nn.Module):
        return
    raise TypeError(
        f"ShardedOptimizer takes the model (a torch.nn.Module), not {type(model).__name__}: "
        "the job names each tensor by its name in the model (checkpoints, zeroshard export, "
        "the ranks' comparison of their models) and the optimizer hooks the model's forward "
        "and backward. Pass it as ShardedOptimizer(model, \"adamw\", lr=...), and parameter "
        "groups as param_groups=[{\"params\": [...], \"weight_decay\": 0.0}] (parameters of "
        "that model) or with add_param_group before the first forward")


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
    """Rank 0 writes the model's parameters (fp32, torch's names and shapes) as safetensors:
    every name model.state_dict() has for a parameter, tied weights included (their data written
    under each name: safetensors has no aliasing), so that a strict load_state_dict of a plain
    torch model takes the file; the other ranks do nothing. Every rank holds the full parameters
    after step() (their all-gathers waited for here)."""
    for optimizer in _optimizers:
        sharded = optimizer._sharded
        if sharded is not None and not sharded.all_materialized():
            raise RuntimeError(
                "zt.save: in zero3 the parameters are gathered only while used; call it inside "
                "`with opt.full_parameters():` on every rank, or after zt.finish(opt)")
    if init().rank != 0:
        return
    for optimizer in _optimizers:
        optimizer.wait_for_parameters()
    _safetensors.write_f32(path, {name: p.detach().to("cpu", torch.float32).contiguous()
                                  for name, p in _job_spec.parameter_names(model)}, replace=True)
