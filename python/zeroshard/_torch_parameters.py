"""The parameters' all-gather overlapped with the next forward, for
zeroshard.torch.ShardedOptimizer: step() returns once the worker issued the all-gathers
(zero1/zero2), and each module's forward pre-hook waits only for the tensors it needs
(attach.proto's wait_parameters), as the built-in workload's Engine::Parameters(tensor) does per
layer.

Who waits for a tensor (docs/pytorch.md, "Overlap"), before a module's first forward after
step(): a submodule's pre-hook waits for its own parameters (recurse=False) and those of its
descendants, since a module may read its children's weights without calling them
(nn.MultiheadAttention reads out_proj's); containers that only call their children
(nn.Sequential, nn.ModuleList, nn.ModuleDict) wait for their own only, so that each layer inside
waits for itself. A tied parameter (the same tensor under several names) is waited for by the
pre-hook of every module that holds it and by the root module's, since any module may read it
(a head called functionally on the embedding's weight); a parameter registered on the root module
by the root's. Every module's parameters(), named_parameters() (installed on the instance, as
the model's zero_grad is) and state_dict() wait for the pending tensors they hold, so that a
script reading them after step() sees the update. Anything else that reads a parameter between step()
and its module's forward (an EMA over references taken earlier) calls opt.wait_for_parameters()
first; opt.state_dict(), load_state_dict(), zt.save and zt.finish do so themselves.
"""

import types
import weakref

import torch

from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._torch_job_spec import parameter_names

# module -> _ModuleEntry: the hooks and installed methods find a module's waits here and hold no
# reference themselves, so that a copy of the model (copy.deepcopy, pickle) copies no connection
# and is plain torch.
_module_waits = weakref.WeakKeyDictionary()


class _ModuleEntry:
    """One module's waits: `before_forward` (its pre-hook's tensors) and `subtree` (every tensor
    its parameters() yields), plan indices in plan order. Thread contract: immutable."""

    def __init__(self, waits, before_forward, subtree):
        self.waits = waits
        self.before_forward = before_forward
        self.subtree = subtree


def _before_module_forward(module, inputs):
    """A submodule's forward pre-hook (a no-op on a copy of the model)."""
    entry = _module_waits.get(module)
    if entry is not None:
        entry.waits.wait(entry.before_forward)


def _after_state_dict(module, state_dict, prefix, local_metadata):
    """module.state_dict()'s hook: whoever reads the values gets them gathered."""
    _wait_for_subtree(module)


def _wait_for_subtree(module):
    entry = _module_waits.get(module)
    if entry is not None:
        entry.waits.wait(entry.subtree)


def _module_parameters(module, *args, **kwargs):
    """module.parameters() of a module whose all-gathers may be pending (installed on the
    instance, bound to it): waits for its own and its descendants', then torch's. A copy of the
    model gets torch's."""
    _wait_for_subtree(module)
    return type(module).parameters(module, *args, **kwargs)


def _module_named_parameters(module, *args, **kwargs):
    """module.named_parameters(), as _module_parameters."""
    _wait_for_subtree(module)
    return type(module).named_parameters(module, *args, **kwargs)


# A pickled model binds torch's methods instead (a bound method pickles as getattr(model, name)).
_module_parameters.__name__ = _module_parameters.__qualname__ = "parameters"
_module_named_parameters.__name__ = _module_named_parameters.__qualname__ = "named_parameters"
_INSTALLED = {"parameters": _module_parameters, "named_parameters": _module_named_parameters}

# Modules whose forward only calls their children (through their hooks), if it runs at all.
_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def module_tensors(model, plan):
    """{module: (the plan indices its pre-hook waits for, those its parameters() yields)} for
    every module of `model`, each list in plan order, by the rules above: the root's pre-hook
    list holds the tied parameters and those registered on it."""
    names = {}
    for name, p in parameter_names(model):
        if id(p) in plan.index:
            names.setdefault(id(p), []).append(name)
    holders = {}  # module -> {tensors registered on it}
    for t, p in enumerate(plan.params):
        aliases = names.get(id(p), [])
        owners = [model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
                  for name in aliases]
        if len(aliases) != 1:
            owners.append(model)  # tied (or unnamed): any module may read it
        for owner in owners:
            holders.setdefault(owner, set()).add(t)
    tensors = {}
    for module in model.modules():
        subtree = set()
        for descendant in module.modules():
            subtree |= holders.get(descendant, set())
        if module is model or isinstance(module, _CONTAINERS):
            before_forward = holders.get(module, set())
        else:
            before_forward = subtree
        tensors[module] = (sorted(before_forward), sorted(subtree))
    return tensors


class ParameterWaits:
    """Which tensors' all-gathers may still be running since the last step(), and the waits for
    them. Made at the attach; installs on every module of the model a forward pre-hook (where it
    has tensors to wait for; not on the root, whose wait is before_root(), called from the
    optimizer's model pre-hook after the attach), a state_dict hook, and its parameters() and
    named_parameters() (remove() takes them all away).

    Invariant: _pending[t] until a wait_parameters naming t was answered after the step_result
    that left it pending; _count is how many are pending. Thread contract: the training thread
    only."""

    def __init__(self, model, plan, connection):
        self._connection = connection
        self._pending = [False] * len(plan.params)
        self._count = 0
        self._handles = []
        self._modules = []
        for module, (before_forward, subtree) in module_tensors(model, plan).items():
            _module_waits[module] = _ModuleEntry(self, before_forward, subtree)
            self._modules.append(weakref.ref(module))
            if module is model:
                self._root_tensors = before_forward
            elif before_forward:
                self._handles.append(module.register_forward_pre_hook(_before_module_forward))
            self._handles.append(module._register_state_dict_hook(_after_state_dict))
            for name, method in _INSTALLED.items():
                setattr(module, name, types.MethodType(method, module))

    def remove(self):
        """The hooks and methods go (zt.finish): the model is plain torch again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for reference in self._modules:
            module = reference()
            if module is None:
                continue
            for name, method in _INSTALLED.items():
                installed = module.__dict__.get(name)
                if getattr(installed, "__func__", None) is method:
                    del module.__dict__[name]
            entry = _module_waits.get(module)
            if entry is not None and entry.waits is self:
                del _module_waits[module]
        self._modules = []

    @property
    def pending(self):
        """Plan indices of the tensors whose all-gather may still be running."""
        return [t for t, pending in enumerate(self._pending) if pending]

    def after_step(self, parameters_pending):
        """The step's answer: with parameters_pending every tensor is being gathered."""
        self._pending = [bool(parameters_pending)] * len(self._pending)
        self._count = len(self._pending) if parameters_pending else 0

    def before_root(self):
        """The root module's forward: the tied parameters and those registered on it."""
        self.wait(self._root_tensors)

    def wait(self, tensors):
        """Returns once the all-gathers of `tensors` (plan indices) are done; one round trip for
        those still pending, none when none is."""
        if not self._count:
            return
        waiting = [t for t in tensors if self._pending[t]]
        if not waiting:
            return
        request = attach_pb2.AttachRequest()
        request.wait_parameters.tensors.extend(waiting)
        self._connection.call(request)
        for t in waiting:
            self._pending[t] = False
        self._count -= len(waiting)

    def wait_all(self):
        """Every pending tensor (opt.wait_for_parameters())."""
        if self._count:
            self.wait(self.pending)

    def forget(self):
        """The worker waited for every all-gather itself (zt.finish's answer)."""
        self.after_step(False)
