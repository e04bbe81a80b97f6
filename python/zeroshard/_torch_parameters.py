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

torch.compile (docs/pytorch.md, "torch.compile"): Dynamo traces the hooks of the modules inside a
compiled region, where a wait (a socket round trip) would be a graph break, and the guards on
what it reads a recompile. So while Dynamo traces, every hook here is a no-op (it reads nothing,
so it adds nothing to the graph or its guards), and the waits happen before the compiled region:
a module called eagerly from inside torch.compile's OptimizedModule (the OptimizedModule itself
when compiled before the ShardedOptimizer, the compiled model's root when compiled after; both
run their own hooks outside Dynamo) waits for its whole subtree, since its descendants' hooks are
traced.
"""

import copyreg
import sys
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


# torch >= 2.3: torch.compiler.is_compiling; 2.1-2.2: torch._utils.is_compiling; 1.13: none.
_IS_COMPILING = (getattr(getattr(torch, "compiler", None), "is_compiling", None) or
                 getattr(torch._utils, "is_compiling", None))


def compiling():
    """Whether Dynamo is tracing the caller (a constant to Dynamo, which then traces nothing
    else of the hook and guards on nothing of ours)."""
    return _IS_COMPILING is not None and _IS_COMPILING()


def in_compiled_module():
    """Whether this eager call runs inside torch.compile's OptimizedModule, whose forward is
    compiled: the modules inside it wait for their subtree. Looked up at the call: Dynamo's
    eval_frame is imported only once something was compiled, and the flag is not a public
    name."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    in_optimized_module = getattr(eval_frame, "_is_in_optimized_module", None)
    if in_optimized_module is None:
        return True  # a torch without the flag: any forward may be compiled (less overlap)
    return in_optimized_module()


# ---- A copy of the model is plain torch ----
#
# The hooks live in the modules' hook dicts and the installed methods in their __dict__, which
# pickle (torch.save(model)) and copy.deepcopy copy with the module: a file that could not be
# loaded without zeroshard, nor with torch.load(weights_only=True). So each module type that holds
# them pickles through a copyreg reducer that leaves them out (copyreg.dispatch_table serves both
# pickle and copy.deepcopy): what a copy gets is the module's state less our hooks and methods.

# The functions this package installs as hooks or as bound methods of a module.
_OURS = []
# Module types whose reducer is ours (never one that had a reducer of its own).
_REDUCED_TYPES = set()
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_state_dict_hooks")
# Dicts keyed by a hook's id, beside the hook dicts (torch 2.x).
_HOOK_ID_DICTS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                  "_forward_hooks_always_called")


def ours(function):
    """Marks `function` as one this package installs on modules (left out of copies)."""
    _OURS.append(function)
    return function


def _is_ours(value):
    if not callable(value):
        return False
    value = getattr(value, "hook", value)  # torch wraps some hooks (_WrappedHook)
    return any(value is function or getattr(value, "__func__", None) is function
               for function in _OURS)


def _plain_state(module):
    """The module's pickled state without our hooks and installed methods."""
    state = module.__getstate__()
    if not isinstance(state, dict):
        return state
    state = dict(state)
    dropped = set()
    for name in _HOOK_DICTS:
        hooks = state.get(name)
        if hooks and any(_is_ours(hook) for hook in hooks.values()):
            dropped |= {key for key, hook in hooks.items() if _is_ours(hook)}
            state[name] = type(hooks)((key, hook) for key, hook in hooks.items()
                                      if not _is_ours(hook))
    for name in _HOOK_ID_DICTS:
        ids = state.get(name)
        if ids and dropped & set(ids):
            state[name] = type(ids)((key, value) for key, value in ids.items()
                                    if key not in dropped)
    for name in [name for name, value in state.items() if _is_ours(value)]:
        del state[name]
    return state


def _reduce_plain(module):
    """copyreg's reducer of a module type that holds our hooks: protocol 2's reduction (NEWOBJ,
    which weights_only loads take) of the state less ours."""
    return copyreg.__newobj__, (type(module),), _plain_state(module)


def copies_are_plain(module):
    """Copies of `module` (pickle, copy.deepcopy) leave our hooks and methods out. A type with a
    reduction of its own (a __reduce__ / __reduce_ex__, a copyreg entry) keeps it."""
    cls = type(module)
    if cls in _REDUCED_TYPES:
        return
    if (cls in copyreg.dispatch_table or cls.__reduce_ex__ is not object.__reduce_ex__ or
            cls.__reduce__ is not object.__reduce__):
        return
    copyreg.pickle(cls, _reduce_plain)
    _REDUCED_TYPES.add(cls)


@ours
def _before_module_forward(module, inputs):
    """A submodule's forward pre-hook (a no-op on a copy of the model, and while Dynamo traces:
    see the module docstring)."""
    if compiling():
        return
    entry = _module_waits.get(module)
    if entry is not None:
        entry.waits.wait(entry.subtree if in_compiled_module() else entry.before_forward)


@ours
def _after_state_dict(module, state_dict, prefix, local_metadata):
    """module.state_dict()'s hook: whoever reads the values gets them gathered."""
    _wait_for_subtree(module)


def _wait_for_subtree(module):
    if compiling():
        return  # parameters() inside a compiled forward: waited for before the region
    entry = _module_waits.get(module)
    if entry is not None:
        entry.waits.wait(entry.subtree)


@ours
def _module_parameters(module, *args, **kwargs):
    """module.parameters() of a module whose all-gathers may be pending (installed on the
    instance, bound to it): waits for its own and its descendants', then torch's. A copy of the
    model gets torch's."""
    _wait_for_subtree(module)
    return type(module).parameters(module, *args, **kwargs)


@ours
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
        # Whether the root's hook ran eagerly since the last step (after_step).
        self._root_forward_seen = False
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
            copies_are_plain(module)
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
        """The step's answer: with parameters_pending every tensor is being gathered. When no
        forward ran the root's hook eagerly since the last step, the forward was traced
        (torch.compile after the optimizer, model.compile(), a compiled function calling the
        model: every hook is a no-op there) or bypassed the model: the next one may read any
        parameter without a hook waiting for it, so the all-gathers are waited for now."""
        self._pending = [bool(parameters_pending)] * len(self._pending)
        self._count = len(self._pending) if parameters_pending else 0
        root_forward_seen, self._root_forward_seen = self._root_forward_seen, False
        if not root_forward_seen:
            self.wait_all()

    def before_root(self):
        """The root module's forward: the tied parameters and those registered on it; every
        tensor when the forward is compiled (its modules' hooks are traced, so they wait for
        nothing)."""
        self._root_forward_seen = True
        if in_compiled_module():
            self.wait_all()
        else:
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
