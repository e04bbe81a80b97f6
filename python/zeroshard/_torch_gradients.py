"""Gradients from backward to a ZeroShard worker, for zeroshard.torch.ShardedOptimizer: the
HandedOverGradient a parameter's .grad holds once its gradient is the worker's, the per-parameter
accumulation hooks, the hand-over of each mode (ddp: the shared buffer averaged over the ranks at
the end of backward; zero1: the shared buffer; zero2: segments into the worker's bucket buffers
as backward produces them), clipping, and zero_grad as torch.optim defines it (the model's
zero_grad and forward pre-hook included).
"""

import inspect
import math
import types
import warnings
import weakref

import torch

from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._torch_parameters import compiling, copies_are_plain, ours

# zero_grad's default for set_to_none, as the installed torch has it (1.13: False, 2.x: True):
# opt.zero_grad() follows torch.optim.Optimizer's, model.zero_grad() nn.Module's.
OPTIMIZER_SET_TO_NONE = inspect.signature(torch.optim.Optimizer.zero_grad).parameters[
    "set_to_none"].default
_MODULE_SET_TO_NONE = inspect.signature(torch.nn.Module.zero_grad).parameters[
    "set_to_none"].default


class HandedOverGradient(torch.Tensor):
    """What a parameter's .grad holds in zero1 and zero2 once backward handed its gradient over to
    the worker, until the next forward, step() or zero_grad(): a tensor of the parameter's shape,
    dtype and device without storage. Its shape, dtype, device and the like can be read; any other
    use (torch.nn.utils.clip_grad_norm_, arithmetic, accumulating into it) raises a RuntimeError
    that names the parameter and opt.clip_grad_norm_. `isinstance(p.grad, zt.HandedOverGradient)`
    tells it from a gradient that holds values. Thread contract: immutable."""

    __module__ = "zeroshard.torch"  # its public name: zt.HandedOverGradient

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
        where = ("zero2 reduces it into the owning rank's shard" if self.mode in ("zero2", "zero3") else
                 "zero1 reduces it in the worker, which keeps only its shard")
        return RuntimeError(
            f"parameter {self.parameter_name}: its gradient was handed over to the ZeroShard "
            f"worker ({where}), so .grad holds no values here ({what} was called on it); clip "
            "with opt.clip_grad_norm_(max_norm) (global across shards) instead of "
            "torch.nn.utils.clip_grad_norm_, or use mode='ddp' to keep full gradients in .grad")

    @classmethod
    def __torch_function__(cls, func, classes, args=(), kwargs=None):
        if func is _AMP_UNSCALE:
            return _amp_unscale(*args, **(kwargs or {}))
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


def handed_over(grad):
    return isinstance(grad, HandedOverGradient)


# GradScaler.unscale_ (torch.amp's and torch.cuda.amp's) checks and unscales the gradients with
# this op; on HandedOverGradients the workers do it (GradientHandOver.unscale).
_AMP_UNSCALE = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)


def _amp_unscale(grads, found_inf, inv_scale):
    """torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale) on a list
    holding HandedOverGradients (GradScaler.unscale_ in zero1/zero2): the worker measures the
    norm of the gradient step() applies (a collective: every rank's GradScaler calls it alike),
    step() will apply `inv_scale`, and found_inf is set to 1 when an element is NaN or Inf, as
    the op does. Gradients that hold values get torch's op."""
    ours = [g for g in grads if isinstance(g, HandedOverGradient)]
    others = [g for g in grads if not isinstance(g, HandedOverGradient)]
    if others:
        with torch._C.DisableTorchFunction():
            _AMP_UNSCALE(others, found_inf, inv_scale)
    owners = {id(o): o for o in (g.owner() for g in ours) if o is not None}
    if len(owners) != 1:
        raise ours[0].refusal("GradScaler.unscale_ (of gradients of no live optimizer, or of "
                              "several)")
    if next(iter(owners.values())).unscale(float(inv_scale)):
        found_inf.fill_(1.0)


def torch_zero_grad(p, set_to_none):
    """What torch.optim's zero_grad does to one parameter's .grad (a handed-over one goes)."""
    if p.grad is None:
        return
    if set_to_none or handed_over(p.grad):
        p.grad = None
        return
    if p.grad.grad_fn is not None:
        p.grad.detach_()
    else:
        p.grad.requires_grad_(False)
    p.grad.zero_()


# ---- The hooks on the model and its parameters ----

# model -> the ShardedOptimizer that trains it, which its forward pre-hook and its zero_grad
# (installed on the instance) find here: they hold no reference to the optimizer, so that a copy
# of the model (copy.deepcopy, pickle) copies no optimizer and is plain torch.
_model_optimizers = weakref.WeakKeyDictionary()


@ours
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


@ours
def _before_forward(module, inputs):
    """The forward pre-hook of a model a ShardedOptimizer trains (a no-op on a copy of it). A
    no-op too where Dynamo traces it (torch.compile(model) after the optimizer, model.compile(),
    a compiled function that calls the model), so that it breaks no graph: the attach then
    happens at the first backward, and step() waits for the parameters' all-gather itself when
    no forward of the model ran this hook eagerly (_torch_parameters.ParameterWaits.after_step).
    With torch.compile(model) before the optimizer this hook is on torch's OptimizedModule,
    which runs it eagerly, and it waits for every parameter there."""
    if compiling():
        return
    optimizer = _model_optimizers.get(module)
    if optimizer is not None:
        optimizer._before_forward()


def hook_model(model, optimizer):
    """Routes the model's forward pre-hook and model.zero_grad() to `optimizer`; returns the
    forward hook's handle."""
    _model_optimizers[model] = optimizer
    forward_hook = model.register_forward_pre_hook(_before_forward)
    model.zero_grad = types.MethodType(_model_zero_grad, model)
    copies_are_plain(model)
    return forward_hook


def unhook_model(model, optimizer, forward_hook):
    """Undoes hook_model: the model is plain torch again."""
    forward_hook.remove()
    if _model_optimizers.get(model) is optimizer:
        del _model_optimizers[model]
        installed = model.__dict__.get("zero_grad")
        if getattr(installed, "__func__", None) is _model_zero_grad:
            del model.__dict__["zero_grad"]


def hook_parameter(p, before_accumulation, after_accumulation):
    """The handles of a hook before each accumulation into p.grad (`before_accumulation(p)`: a
    HandedOverGradient there goes first, the new gradient starts a fresh .grad) and one after it
    (`after_accumulation(p)`). Registered when the parameter joins the optimizer, before the job
    exists."""
    parameter = weakref.ref(p)
    handles = [p.register_hook(lambda grad: before_accumulation(parameter()))]
    if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        handles.append(p.register_post_accumulate_grad_hook(after_accumulation))
    else:
        # torch 1.13: the AccumulateGrad node's hook, as DDP does (the node kept alive here;
        # it outlives p.data's replacement at the attach: same dtype and device).
        accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
        handles.append(accumulator.register_hook(lambda *unused, p=p: after_accumulation(p)))
        handles.append(accumulator)
    return handles


def remove_hooks(handles):
    for handle in handles:
        if isinstance(handle, torch.utils.hooks.RemovableHandle):
            handle.remove()


# ---- The hand-over ----

# The epsilon torch.nn.utils.clip_grad_norm_ adds to the norm, and a max_norm that clips nothing.
_CLIP_EPSILON = 1e-6
_NO_CLIP = 1e300

class GradientHandOver:
    """An attached optimizer's gradients, step by step: which tensors have a gradient (as torch's
    `p.grad is not None` says), which are ready in this backward, what went to the worker, and
    what .grad holds meanwhile. Made at the attach, with the job's tensors (`plan`), the shared
    gradient views (ddp/zero1; None per tensor in zero2), the connection, the layouts (zero2's
    segments), `view(block, offset, elements, shape)` of a worker block and `synchronize()`.

    Invariants: _ready[t] once tensor t's gradient of this backward (micro-batch) is being handed
    over; zero2 hands tensors over in plan order, _next the first not yet done and
    _next_segment its next segment. Thread contract: the training thread only."""

    def __init__(self, mode, plan, connection, layouts, grad_views, view, synchronize):
        self._mode = mode
        self._params = plan.params
        self._names = plan.names
        self._index = plan.index
        self._device = plan.device
        self._connection = connection
        self._layouts = layouts
        self._grad_views = grad_views
        self._view = view
        self._synchronize = synchronize
        # zero2: segments the worker deferred (no free bucket buffer when backward asked).
        self.deferred_segments = 0
        self._warned_replaced_grad = False
        # _pointed[t]: this optimizer set .grad to tensor t's shared gradient view (ddp/zero1),
        # so another tensor there was put by user code (warned once), not made by a backward
        # after .grad was None.
        self._pointed = [False] * len(self._params)
        with torch.no_grad():
            for t, (p, grad) in enumerate(zip(self._params, grad_views)):
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
        self.begin_step()

    def begin_step(self):
        self._begin_micro_batch()
        self._micro_batches = 0
        self._end_of_backward_queued = False
        # ddp: the shared gradient buffer holds the average over ranks (_average_gradients).
        self._averaged = False

    def _begin_micro_batch(self):
        self._ready = [False] * len(self._params)
        self._next = 0
        self._next_segment = 0  # of tensor self._next (zero2)

    def between_steps(self):
        """Whether no gradient of the next step has been handed over yet."""
        return not (any(self._ready) or self._next or self._micro_batches)

    def tensors_without_gradient(self):
        """Plan indices of the tensors that have no gradient (torch.optim skips them): what
        StepRequest.tensors_without_gradient tells the workers."""
        return [t for t, has in enumerate(self._has_grad) if not has]

    # ---- Backward ----

    def drop_handed_over(self, p):
        """Before a backward accumulates into p.grad: a HandedOverGradient there goes (the new
        gradient starts a fresh .grad)."""
        p.grad = None
        self._pointed[self._index[id(p)]] = False

    def on_gradient(self, p, no_sync):
        """Parameter p's gradient of this backward accumulated. `no_sync`: inside
        opt.no_sync() (ddp/zero1 keep it in the shared buffer until step())."""
        if self._mode in ("zero2", "zero3"):
            self._on_gradient_zero2(p)
            return
        t = self._index[id(p)]
        self._has_grad[t] = True
        if no_sync:
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
            p.grad.owner = weakref.ref(self)  # GradScaler.unscale_ finds the worker (unscale)
            self._some_handed_over = True
        else:
            p.grad = None
        self._pointed[t] = False

    def _check_first_accumulation(self, t):
        """A parameter's hook fires once per backward, unless the backward runs in pieces that
        accumulate it again (reentrant activation checkpointing): its gradient was handed over
        already, so the rest would be lost. Refused with the parameter's name."""
        if self._ready[t]:
            # ddp/zero1 hand a step's gradients over once: a second reducing backward before
            # step() (gradient accumulation ported from DDP without its no_sync) lands here too.
            accumulation = ("" if self._mode in ("zero2", "zero3") else
                            f"; or a second backward before step() in mode {self._mode!r}: "
                            "for gradient accumulation run every micro-step but the last inside "
                            "`with opt.no_sync():` (DDP's no_sync, nanoGPT's "
                            "require_backward_grad_sync), or use mode='zero2', which reduces "
                            "every backward")
            raise RuntimeError(
                f"parameter {self._names[t]}: its gradient accumulated again after it was "
                "handed over to the worker: reentrant activation checkpointing does this for a "
                "parameter used inside and outside a checkpointed segment (use "
                "torch.utils.checkpoint(..., use_reentrant=False))" + accumulation)

    def _adopt_gradient(self, t):
        """ddp/zero1: tensor t's gradient into the shared buffer, .grad pointing there. None (no
        gradient this step) counts as zero and stays None, as torch leaves it; a gradient handed
        over in this step's backward is the worker's already."""
        p, grad = self._params[t], self._grad_views[t]
        current = p.grad
        if handed_over(current):
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
            self.tensors_without_gradient())
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
        # zero3 waits for a bucket buffer: its backward's gathers share the worker's ordered
        # collectives with the reduce-scatters, so where a bucket's reduce-scatter is issued among
        # the gathers must not depend on when a buffer came free, or the ranks would pair one
        # rank's reduce-scatter with the other's all-gather (same sizes: silently wrong values).
        self._hand_over_zero2(wait=self._mode == "zero3")

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
            if not self.send_segments(self._next, wait):
                return
            self._next += 1
            self._next_segment = 0

    def send_segments(self, t, wait):
        """Tensor t's segments from self._next_segment on; False when one was deferred (looked
        up on the instance: tests/bench/torch_attach.py times it by replacing it)."""
        p, layout = self._params[t], self._layouts[t]
        if p.grad is None or handed_over(p.grad):
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

    # ---- step(), clipping, zero_grad ----

    def hand_over_rest(self):
        """Before step() and clip_grad_norm_: what backward has not handed over goes to the
        worker (a tensor without a gradient as zeros). zero2: the rest of a backward whose end went
        unseen, or every tensor when no backward ran this step. ddp after the averaging: a .grad
        the script replaced (not changed in place) is copied into the shared buffer. Otherwise
        (ddp/zero1) each tensor's gradient into the shared buffer."""
        if self._mode in ("zero2", "zero3"):
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

    def after_step(self):
        """The worker applied the step: zero1's gradients are all the worker's (the shared
        buffer holds the reduction's pieces); the next step begins."""
        if self._mode == "zero1":
            for t, p in enumerate(self._params):
                p.grad = None
                self._pointed[t] = False
        self.clear_handed_over()
        self.begin_step()

    # GradScaler (zero1/zero2), for the current step: (inv_scale, the L2 norm the worker measured
    # of the gradient as it holds it) once unscale_ ran; the coefficient opt.clip_grad_norm_ asked
    # for after it; the non-finite norm of a step GradScaler skips, until step() or zero_grad().
    _unscale = None
    _clip_after_unscale = None
    _scaler_skipped = None

    def clip_grad_norm(self, max_norm, norm_type):
        """opt.clip_grad_norm_ with checked arguments: ddp clips the averaged .grad in place with
        torch.nn.utils.clip_grad_norm_; zero1/zero2 have the workers compute the norm over their
        shards and apply the coefficient in step(). After GradScaler.unscale_ the norm is the
        unscaled gradient's, and step() applies the coefficient and the unscale together."""
        if self._mode == "ddp":
            if not self._averaged:
                self._average_gradients()
            return torch.nn.utils.clip_grad_norm_(self._params, max_norm, norm_type)
        if self._scaler_skipped is not None:
            # Non-finite: GradScaler skips this step (zero_grad() ends it, skipped).
            total = self._scaler_skipped
        elif self._unscale is not None:
            inv_scale, l2 = self._unscale
            scaled = l2 if norm_type == 2.0 else self._worker_norm(_NO_CLIP, norm_type)
            total = scaled * inv_scale
            self._clip_after_unscale = min(1.0, max_norm / (total + _CLIP_EPSILON))
        else:
            total = self._worker_norm(max_norm, norm_type)
        return torch.tensor(total, dtype=torch.float32, device=self._device)

    def _worker_norm(self, max_norm, norm_type):
        """The worker's clip_grad_norm: the total norm (collective), and the next step() scales
        by min(1, max_norm / (norm + 1e-6))."""
        self.hand_over_rest()
        request = attach_pb2.AttachRequest()
        request.clip_grad_norm.max_norm = max_norm
        request.clip_grad_norm.norm_type = norm_type
        response, _ = self._connection.call(request)
        if self._mode == "zero1":
            # The worker took every gradient left in the shared buffer.
            for t, p in enumerate(self._params):
                if p.grad is not None and not handed_over(p.grad):
                    self._hand_over(t)
        return response.grad_norm.total_norm

    def unscale(self, inv_scale):
        """GradScaler.unscale_ on the handed-over gradients (zero1/zero2; every rank's scaler
        calls it alike): the worker measures the norm (max_norm _NO_CLIP: no clipping yet), and
        step() will multiply by inv_scale. True when an element is NaN or Inf: GradScaler then
        skips step(), and opt.zero_grad() ends the worker's step, which its non-finite check
        skips (no update, no state advanced), so that the next backward starts a fresh step as
        after torch's zero_grad()."""
        if self._unscale is not None or self._scaler_skipped is not None:
            raise RuntimeError("GradScaler.unscale_: already called on this optimizer since "
                               "the last step()")
        norm = self._worker_norm(_NO_CLIP, 2.0)
        if math.isfinite(norm):
            self._unscale = (inv_scale, norm)
            return False
        self.skip_step_for_scaler(norm)
        return True

    def apply_unscale(self, config_clip):
        """step(), after GradScaler.unscale_: asks the worker to scale the step's gradient by
        inv_scale x the clipping coefficient (opt.clip_grad_norm_'s after unscale_, else the
        constructor's clip_grad_norm on the unscaled norm, else 1), as one clip_grad_norm whose
        max_norm gives that coefficient for the norm the worker measured."""
        if self._unscale is None:
            return
        inv_scale, l2 = self._unscale
        coef = self._clip_after_unscale
        if coef is None:
            coef = (min(1.0, config_clip / (l2 * inv_scale + _CLIP_EPSILON)) if config_clip
                    else 1.0)
        scale = inv_scale * coef
        if scale > 1.0:
            raise RuntimeError(f"GradScaler: a scale of {1.0 / inv_scale} below 1 is not "
                               "supported (the workers scale gradients down only)")
        self._worker_norm(scale * (l2 + _CLIP_EPSILON), 2.0)

    def skip_step_for_scaler(self, norm):
        self._scaler_skipped = norm

    def scaler_skip_pending(self):
        """Whether zero_grad() must end a step that GradScaler skipped: zero1/zero2 after
        unscale_ found NaN or Inf; ddp once the averaged .grad holds one (torch's unscale_ ran
        on it) and step() did not come."""
        if self._scaler_skipped is not None:
            return True
        return self._mode == "ddp" and self._averaged and not all(
            bool(torch.isfinite(p.grad).all()) for p in self._params
            if p.grad is not None and not handed_over(p.grad))

    def end_scaler_step(self):
        self._unscale = self._clip_after_unscale = self._scaler_skipped = None

    def zero_grad(self, set_to_none):
        """As torch.optim's: True sets each .grad to None (the tensor has no gradient until a
        backward gives it one); False zeroes the gradients of the tensors that have one, in
        place: in ddp/zero1 .grad is then the shared gradient buffer's view (backward accumulates
        there, no copy), in zero2, and in zero1 for a gradient handed over since the last step,
        None (the worker has it)."""
        for t, (p, grad) in enumerate(zip(self._params, self._grad_views)):
            if set_to_none:
                self._has_grad[t] = False
            elif grad is not None and not handed_over(p.grad) and (
                    self._has_grad[t] or p.grad is not None):
                grad.zero_()
                p.grad = grad
                self._pointed[t] = True
                continue
            p.grad = None
            self._pointed[t] = False

    def clear_handed_over(self):
        """HandedOverGradients go (at the next forward, step(), zero_grad()): .grad None."""
        if not self._some_handed_over:
            return
        for t, p in enumerate(self._params):
            if handed_over(p.grad):
                p.grad = None
                self._pointed[t] = False
        self._some_handed_over = False
