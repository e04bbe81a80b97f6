"""zero3 for zeroshard.torch.ShardedOptimizer(mode="zero3"): the trainer keeps no full
parameters between uses (docs/pytorch.md, "zero3").

Each parameter keeps its Parameter object and its own storage, resized to 0 bytes between uses,
as FSDP2 does (views autograd saved for backward stay valid: they point at that storage, refilled
before it is read again). Between uses the Parameter's class is ReleasedParameter (the same
object), which answers its shape, gradient and the like and raises on any read of its values,
naming opt.full_parameters(): torch does not check reads against the storage's size. Before a
module runs, its parameters are gathered: the worker all-gathers their buckets into its gather
pool (shared memory), this process copies each tensor out into its own storage and releases the
pool's place at once, so that the pool holds a module only while it is copied. The worker
prefetches the next modules in the order recorded on the first step.

Who gathers what (the units), by the rules of "Overlap" (_torch_parameters.module_tensors): a
module's forward pre-hook gathers its whole subtree (a module may read a child's weight without
calling it, as nn.MultiheadAttention reads out_proj's), so a transformer block is gathered once,
as a unit, like an FSDP2 block; containers (nn.Sequential, ModuleList, ModuleDict) gather only
their own; the model itself gathers the tied parameters and those registered on it, for its
whole forward. A parameter is materialized while any unit holds it (a count per tensor).

Backward: a hook on each output of a unit's forward gathers the unit again when the gradient of
that output arrives (torch 1.13 has no module backward pre-hook, so the outputs' hooks serve in
every version), once per backward; the unit is released when every one of its tensors' gradient
was accumulated (the post-accumulation hooks), and any unit still held when backward ends is
released then.

Thread contract: the training thread only.
"""

import collections
import contextlib
import weakref

import torch

from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._torch_parameters import compiling, module_tensors, ours

# module -> its _Unit (the hooks hold no reference to the optimizer: a copy of the model is plain).
_units_of = weakref.WeakKeyDictionary()


def _storage(tensor):
    """The tensor's storage, resizable: untyped (bytes) in torch 2.x, typed (elements) in 1.13."""
    if hasattr(tensor, "untyped_storage"):
        return tensor.untyped_storage(), tensor.element_size()
    return tensor.storage(), 1


def free_storage(tensor):
    storage, _ = _storage(tensor)
    storage.resize_(0)


def allocate_storage(tensor):
    storage, unit_bytes = _storage(tensor)
    size = tensor.numel() * unit_bytes
    if storage.size() != size:
        storage.resize_(size)


# What a released parameter answers (everything else raises): its metadata (shape and the like,
# as planned) and what autograd, hooks and optimizers read and write (its gradient,
# requires_grad), never its values.
_ANSWERED = {"shape", "size", "numel", "nelement", "dim", "ndim", "ndimension", "dtype", "device", "layout", "requires_grad", "requires_grad_", "grad", "grad_fn",
             "is_leaf", "is_cuda", "is_sparse", "is_quantized", "is_meta", "is_floating_point",
             "is_complex", "element_size", "register_hook", "register_post_accumulate_grad_hook",
             "_backward_hooks", "_post_accumulate_grad_hooks", "untyped_storage", "storage",
             "data_ptr", "__hash__", "_version"}


def _called(func):
    """The name of what __torch_function__ got: a method's, or a property's (its getter or
    setter is a method-wrapper of the getset_descriptor)."""
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") in ("__get__", "__set__", "__delete__") and owner is not None:
        return getattr(owner, "__name__", "")
    return getattr(func, "__name__", "")


class ReleasedParameter(torch.nn.Parameter):
    """A zero3 parameter between uses: the same object as the user's Parameter (its __class__ is
    swapped, so autograd's, optimizers' and the model's references stay valid), holding an empty
    tensor of its full shape whose storage has 0 bytes. Reading its values raises an error naming
    opt.full_parameters() (torch does not check a read against the storage's size: without the
    error it would read freed memory); its shape and the like answer, and its gradient and
    requires_grad work as a Parameter's."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = _called(func)
        if name in _ANSWERED:
            return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})
        raise RuntimeError(
            f"zero3: this parameter holds no values outside its module's forward and backward "
            f"({name} read it); read or write parameters inside `with opt.full_parameters():` "
            f"(on every rank), or after zt.finish(opt)")




class _Unit:
    """A module's tensors (plan indices) and its backward state."""

    def __init__(self, owner, tensors):
        self.owner = owner
        self.tensors = tensors
        self.backward_held = False
        self.waiting = set()


def _tensors_in(output):
    """The tensors requiring grad in a forward's output (a tensor, or nested tuples, lists and
    dicts of them)."""
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors_in(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors_in(item)]
    return []


@ours
def _before_unit_forward(module, inputs):
    if compiling():
        return
    unit = _units_of.get(module)
    if unit is not None:
        unit.owner.materialize(unit.tensors)


@ours
def _check_state_dict(module, state_dict, prefix, local_metadata):
    """model.state_dict()'s hook in zero3: a parameter without storage would be saved empty."""
    unit = _units_of.get(module)
    if unit is not None and not unit.owner.all_materialized():
        raise RuntimeError(
            "model.state_dict(): in zero3 the parameters hold no values between uses; call it "
            "inside `with opt.full_parameters():` on every rank (or after zt.finish(opt)), or use "
            "opt.state_dict() for the sharded checkpoint")


@ours
def _check_state_dict_before(module, prefix, keep_vars):
    _check_state_dict(module, None, prefix, None)


@ours
def _after_unit_forward(module, inputs, output):
    if compiling():
        return
    unit = _units_of.get(module)
    if unit is not None:
        unit.owner.after_forward(unit, output)


class ShardedParameters:
    """The model's parameters in zero3: gathered into their own storage for each use, freed
    after. Made at the attach, once the worker wrote or loaded the parameters (each tensor's
    storage is freed here). `pool_view(offset, elements, shape)`: a tensor over the gather pool's
    block."""

    def __init__(self, model, plan, connection, pool_view):
        self._plan = plan
        self._connection = connection
        self._pool_view = pool_view
        self._held = [0] * len(plan.params)
        self._module_of = [name.rsplit(".", 1)[0] if "." in name else name
                           for name in plan.names]
        self._units_with = collections.defaultdict(list)  # tensor -> units holding it
        self._handles = []
        self._backward_units = []
        self._end_queued = False
        self._root_unit = None
        self._modules = []
        # Each parameter's data is a tensor of its own (self._full[t]) whose storage is resized,
        # never replaced, so that views autograd saved in forward see the values refilled before
        # backward; between uses it has 0 bytes and the Parameter is a ReleasedParameter.
        self._full = []
        with torch.no_grad():
            for p in plan.params:
                full = torch.empty(p.shape, dtype=p.dtype, device=p.device)
                free_storage(full)
                self._full.append(full)
                p.data = full
                p.__class__ = ReleasedParameter
        for module, (before_forward, _) in module_tensors(model, plan).items():
            if not before_forward and module is not model:
                continue
            unit = _Unit(self, before_forward)
            _units_of[module] = unit
            self._modules.append(weakref.ref(module))
            for t in before_forward:
                self._units_with[t].append(unit)
            if module is model:
                self._root_unit = unit  # its pre-hook: before_root(), after the attach
                # The post-hook catches state_dict(keep_vars=True); torch 2.x's pre-hook names
                # state_dict() before the first parameter read raises.
                self._handles.append(module._register_state_dict_hook(_check_state_dict))
                if hasattr(module, "register_state_dict_pre_hook"):
                    self._handles.append(module.register_state_dict_pre_hook(
                        _check_state_dict_before))
            else:
                self._handles.append(module.register_forward_pre_hook(_before_unit_forward))
            self._handles.append(module.register_forward_hook(_after_unit_forward))

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for reference in self._modules:
            module = reference()
            unit = _units_of.get(module) if module is not None else None
            if unit is not None and unit.owner is self:
                del _units_of[module]
        self._modules = []

    # ---- Gathering and freeing ----

    def materialize(self, tensors):
        """Every tensor of `tensors` holds its full values (gathered where none did) until
        release(tensors)."""
        needed = [t for t in tensors if self._held[t] == 0]
        for group in self._groups(needed).values():
            self._gather_into_storage(group)
        for t in tensors:
            self._held[t] += 1

    def _groups(self, tensors):
        """`tensors` by worker module, in forward order (the reverse of plan order): the pool
        holds one module at a time while it is copied."""
        groups = collections.OrderedDict()
        for t in sorted(tensors, reverse=True):
            groups.setdefault(self._module_of[t], []).append(t)
        return groups

    @contextlib.contextmanager
    def _pooled(self, tensors):
        """Gathers `tensors` (one worker module) and yields [(t, its view in the pool)], held in
        the pool until the block ends."""
        request = attach_pb2.AttachRequest()
        request.gather.tensors.extend(tensors)
        response, _ = self._connection.call(request)
        try:
            with torch.no_grad():
                yield [(t, self._pool_view(offset, self._full[t].numel(), self._full[t].shape))
                       for t, offset in zip(tensors, response.gathered.offsets)]
        finally:
            release = attach_pb2.AttachRequest()
            release.release.tensors.extend(tensors)
            self._connection.send(release)

    def _gather_into_storage(self, tensors):
        with self._pooled(tensors) as pooled:
            for t, view in pooled:
                full = self._full[t]
                allocate_storage(full)
                full.copy_(view)
                self._plan.params[t].__class__ = torch.nn.Parameter

    def release(self, tensors):
        for t in tensors:
            self._held[t] -= 1
            if self._held[t] == 0:
                self._plan.params[t].__class__ = ReleasedParameter
                free_storage(self._full[t])

    # ---- Forward and backward ----

    def before_root(self):
        """The model's forward pre-hook (after the attach): the tied parameters and those
        registered on the model itself, for the whole forward."""
        if self._root_unit is not None:
            self.materialize(self._root_unit.tensors)

    def after_forward(self, unit, output):
        if unit.tensors and torch.is_grad_enabled():
            outputs = _tensors_in(output)
            if outputs:
                def before_backward(grad, unit=unit):
                    self._before_backward(unit)
                    return None
                for tensor in outputs:
                    tensor.register_hook(before_backward)
        self.release(unit.tensors)

    def _before_backward(self, unit):
        if unit.backward_held:
            return
        self.materialize(unit.tensors)
        unit.backward_held = True
        unit.waiting = {t for t in unit.tensors if self._plan.params[t].requires_grad}
        self._backward_units.append(unit)
        if not self._end_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            self._end_queued = True
        if not unit.waiting:
            self._release_backward(unit)

    def on_gradient(self, t):
        """Tensor t's gradient of this backward was accumulated: the units waiting only for it
        are done with their parameters."""
        for unit in self._units_with.get(t, ()):
            if unit.backward_held:
                unit.waiting.discard(t)
                if not unit.waiting:
                    self._release_backward(unit)

    def _release_backward(self, unit):
        unit.backward_held = False
        self.release(unit.tensors)

    def _end_backward(self):
        """Backward ended: units whose tensors got no gradient are released now."""
        self._end_queued = False
        units, self._backward_units = self._backward_units, []
        for unit in units:
            if unit.backward_held:
                self._release_backward(unit)

    # ---- Reading them whole ----

    @contextlib.contextmanager
    def full_parameters(self, writeback=True):
        """Every parameter holds its full values inside (gathered a module at a time). At exit,
        with `writeback`, the values that changed go back to the owners: each worker module is
        gathered again, the tensors that differ from it are written into the pool and the worker
        keeps its owned pieces of them (write_parameters); every rank must write the same values,
        as with FSDP's summon_full_params. Without it, writes are dropped."""
        everything = list(range(len(self._plan.params)))
        self.materialize(everything)
        try:
            yield
            if writeback:
                self._write_back(everything)
        finally:
            self.release(everything)

    def _write_back(self, tensors):
        for group in self._groups(tensors).values():
            with self._pooled(group) as pooled:
                changed = []
                for t, view in pooled:
                    if not torch.equal(view, self._full[t]):
                        view.copy_(self._full[t])
                        changed.append(t)
                if changed:
                    write = attach_pb2.AttachRequest()
                    write.write_parameters.tensors.extend(changed)
                    self._connection.call(write)

    def parameter_stream(self):
        """(plan indices, produce): produce() yields each one's values, flat, in that order, a
        worker module at a time from the gather pool (each valid until the next is asked for):
        a torch-format load writes them to the workers' file without the trainer holding them
        all."""
        groups = list(self._groups(range(len(self._plan.params))).values())

        def produce():
            for group in groups:
                with self._pooled(group) as pooled:
                    for _, view in pooled:
                        yield view.reshape(-1)

        return [t for group in groups for t in group], produce

    def all_materialized(self):
        return all(held > 0 for held in self._held)

    def keep_all(self):
        """The model becomes plain torch with the last values (zt.finish): every parameter is
        gathered and stays."""
        self.materialize(list(range(len(self._plan.params))))
