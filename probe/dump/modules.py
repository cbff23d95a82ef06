"""Module-level (L0, mix) dumping: forward, backward and parameter gradients of nn.Modules.

Per-module forward pre/post hooks (``with_kwargs``, ``always_call``) are registered on
every submodule of the model(s) given to ``start(model)`` and removed at ``stop()``; the
root module itself is not dumped, as msprobe does, so names line up with its L0 and mix
dumps: ``Module.blocks.0.fc1.Linear.forward.0``. Backward reuses ``grad_capture``: hooks
on the autograd nodes the module's forward created, never ``register_full_backward_hook``
(its identity Function breaks in-place updates of views, e.g. ``nn.ReLU(inplace=True)``
on a slice). Parameter gradients come from hooks on the parameters and are written as
``Module.{path}.{Class}.parameters_grad.{k}`` (msprobe 26.x naming; k counts the backward
passes of the step) once every parameter of the module has its gradient. For a DDP or
FSDP2 model the gradients are read instead once the wrapper has reduced them
(``reduced_grads``), also at L1, where no module is hooked.

The hooks maintain ``Construct.current``, which is how an API call in mix finds its
parent module in O(1). A hook failure is logged once per module; the module's result is
never changed (the hooks return None).
"""
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from probe.dump import reduced_grads
from probe.dump.construct import OPTIMIZER
from probe.dump.records import ForwardEntry
from probe.hook_module import grad_capture
from probe.hook_module.interceptor import state
from probe.hook_module.torch_function_off import no_function_mode
from probe.log_once import LogOnce
from probe.python_compat import SLOTS
from probe.tensor_tree import flat_tensors
from probe.torch_compat import compiling as _is_compiling
from probe.torch_compat import restore_optimizer_step_hooks, run_eagerly

# Dynamo traces module hooks inside a compiled model: they return at once there.
_said = LogOnce(logging.getLogger(__name__))


def runs_compiled(model, codes=None) -> bool:
    """Whether ``model`` is a ``torch.compile`` wrapper, or dynamo already holds compiled
    code for its forward or, when not (dynamo before torch 2.5 leaves a forward whose loop
    over blocks has a graph break uncompiled, and compiles each block), for the forward of
    one of its submodules' own classes (``torch.compile(model)`` called with the original
    passed to ``start``: known from the second step on). ``codes``: those forwards' code
    objects, when the caller walked the modules already (``forward_codes``)."""
    try:
        from torch._dynamo import eval_frame
        if isinstance(model, eval_frame.OptimizedModule) or getattr(model, "_compiled_call_impl", None):
            return True
        compiled = eval_frame._debug_get_cache_entry_list
        if compiled(type(model).forward.__code__):
            return True
        return any(compiled(code) for code in (forward_codes(model) if codes is None else codes))
    except Exception:       # another torch: dynamo's internals moved; hook as before
        return False


def forward_codes(model) -> list:
    """The code objects of the ``forward`` of ``model``'s own module classes (torch's left out)."""
    classes = {type(m) for m in model.modules()}
    return [cls.forward.__code__ for cls in classes
            if not cls.__module__.startswith("torch.") and hasattr(cls.forward, "__code__")]


# A module spans many autograd nodes; grad_capture's per-API walk limit is too small.
_MODULE_MAX_NODES = 1 << 16
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
# Module hooks run outside any API call, so in mix the interceptor's function mode is live
# there: every tensor attribute read (t.shape, t.grad_fn) would go through it (~3 us each).


class OwnWork:
    """probe's own torch calls in a hook or a draw: not APIs (interceptor), not kernels
    (L2 mode), and tensor attribute reads skip the function mode."""
    __slots__ = ("mode",)

    def __enter__(self):
        state.depth += 1
        blocked.value += 1
        self.mode = no_function_mode()
        self.mode.__enter__()

    def __exit__(self, *exc):
        try:
            self.mode.__exit__(*exc)
        finally:
            blocked.value -= 1
            state.depth -= 1


class Blocked:
    """> 0 while a ``module_dump`` module runs: nothing inside it is dumped (kernels too)."""
    value = 0


blocked = Blocked()


def _hook_call(before, outputs, n_inputs, seen_grad, on_done):
    return grad_capture.hook_call(before, outputs, n_inputs, seen_grad, on_done, max_nodes=_MODULE_MAX_NODES)


def _plain(out):
    """A dataclass output (HF ModelOutput is also a dict) as a dict of its fields."""
    if isinstance(out, (torch.Tensor, tuple, list, dict)) or out is None:
        return out
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
    return out


@dataclass(**SLOTS)
class _ModuleCall:
    """One dumped module forward between its pre- and post-hook."""
    name: str                      # Module.{path}.{Class}
    fwd: str                       # its forward entry's name
    bwd: str                       # its backward entry's name
    summaries: Any                 # entry_builder.Summaries of the call
    parent: Optional[tuple]        # the enclosing module's (forward, backward) names (mix)
    entry: ForwardEntry = field(default_factory=ForwardEntry)
    params: Optional[dict] = None  # the parameters' summaries (data_mode with inputs)
    grad: Optional[Tuple[Any, int]] = None   # (autograd edges before the call, number of inputs)


@dataclass(**SLOTS)
class _Running:
    """A module call in progress (``ModuleDumper.running`` is their stack)."""
    module: torch.nn.Module
    call: Optional[_ModuleCall]    # None where the filter left the call out or its hook failed
    parent: Optional[tuple]        # ``Construct.current`` before the call
    key: str                       # the call's scope key (``Module.a.Linear.0``)
    whole: bool                    # a ``module_dump`` module: nothing inside it is dumped


@dataclass(**SLOTS)
class _ParamOwner:
    """A module holding a parameter: its gradient goes into that module's entry."""
    module: str                    # Module.{path}.{Class}
    param: str                     # the parameter's name in the module
    order: List[str]               # all of the module's parameter names with gradients, in order


@dataclass(**SLOTS)
class _ReducedModule:
    """A module of a DDP / FSDP2 model whose parameters' reduced gradients make its entry."""
    module: torch.nn.Module
    name: str                      # Module.{path}.{Class}
    params: List[str]              # its parameters' names, in the entry's order


class ModuleDumper:
    """Module hooks of one dump run; shares writer, filter, stacks and summaries with ``api``."""

    def __init__(self, api_collector, construct):
        self.api = api_collector
        self.construct = construct
        self.counters = {}
        self.handles = []
        self.running: List[_Running] = []     # the module calls in progress, innermost last
        self.dumped = set()          # module names with a dumped forward this step
        self.grad_pending = {}       # module name -> {param name: summary}
        self.grad_counters = {}
        self.grad_flush_queued = False
        self.optimizer_prev = []
        self._reduced = reduced_grads.ReducedGrads()   # DDP / FSDP2: gradients read after the reduction

    def reset_step(self):
        self.counters.clear()
        self.running.clear()
        self.dumped.clear()
        self.grad_pending.clear()
        self.grad_counters.clear()

    # ---- attaching --------------------------------------------------------
    def attach(self, models):
        """Hook every submodule of ``models`` (a module or a list of them)."""
        if isinstance(models, torch.nn.Module):
            models = [models]
        models = list(models)
        owners: Dict[Any, List[_ParamOwner]] = {}   # parameter -> the modules holding it
        for i, model in enumerate(models):
            prefix = f"{i}." if len(models) > 1 else ""
            if runs_compiled(model):
                # Inside a compiled graph the hooks would run as no-ops (dynamo traces them
                # stepping aside) and, added and removed each step, change the guards dynamo
                # keeps on the modules' hooks: a recompile per dumped step.
                _said.warning(id(model), "probe: the model runs under torch.compile: L0/mix record no "
                                "module entries inside its compiled graph (its hooks would only make dynamo "
                                "recompile each step); its APIs are dumped, those inside graphs inductor "
                                "compiled too (mix)")
                continue
            reduced = reduced_grads.wrapper_kind(model) is not None
            if reduced:   # DDP / FSDP2: the gradients the wrapper reduced, not a hook's local ones
                self._attach_reduced(model, prefix, follow_forward=True)
            for path, module in model.named_modules():
                if not path:
                    continue  # the root is not dumped (msprobe's names)
                name = f"Module.{prefix}{path}.{type(module).__name__}"
                self._hook_module(module, name, whole=False)
                if reduced:
                    continue
                params = [(p_name, p) for p_name, p in module._parameters.items()
                          if p is not None and p.requires_grad]
                for p_name, p in params:
                    owners.setdefault(p, []).append(_ParamOwner(name, p_name, [n for n, _ in params]))
        for p, who in owners.items():
            self.handles.append(p.register_hook(self._param_hook(who)))

    def attach_reduced(self, models):
        """L1: the parameter gradients of a DDP / FSDP2 model (``start(model)``) after the
        wrapper's reduction, as ``parameters_grad`` entries of every module; no module
        hooks. Other models get nothing here (L1 records APIs)."""
        if isinstance(models, torch.nn.Module):
            models = [models]
        models = list(models)
        for i, model in enumerate(models):
            if reduced_grads.wrapper_kind(model) is None:
                continue
            if runs_compiled(model):   # its forward hook would change dynamo's guards each step
                _said.warning(("reduced", id(model)), "probe: the model runs under torch.compile: its "
                              "parameter gradients after the data-parallel reduction are not recorded")
                continue
            self._attach_reduced(model, f"{i}." if len(models) > 1 else "", follow_forward=False)

    def _attach_reduced(self, model, prefix, follow_forward):
        groups: List[_ReducedModule] = []
        for path, module in model.named_modules():
            if not path:
                continue   # the root is not dumped (msprobe's names)
            p_names = [n for n, p in module._parameters.items() if p is not None and p.requires_grad]
            if p_names:
                groups.append(_ReducedModule(module, f"Module.{prefix}{path}.{type(module).__name__}", p_names))
        if groups:
            self.handles.extend(self._reduced.attach(model, self._reduced_reader(groups, follow_forward)))

    def attach_whole(self, module, name):
        """``module_dump``: the module as one entry, nothing inside it. Returns the handles."""
        before = len(self.handles)
        self._hook_module(module, f"Module.{name}.{type(module).__name__}", whole=True)
        handles = self.handles[before:]
        del self.handles[before:]
        return handles

    def attach_optimizer(self):
        """mix: APIs run by ``optimizer.step()`` map to "optimizer" in construct.json."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        restore_optimizer_step_hooks()   # torch < 2.3: a torch.compile so far took them away
        construct = self.construct

        def pre(optimizer, args, kwargs):
            self.optimizer_prev.append(construct.current)
            construct.tree.setdefault("optimizer", None)
            construct.current = OPTIMIZER

        def post(optimizer, args, kwargs):
            if self.optimizer_prev:
                construct.current = self.optimizer_prev.pop()
        self.handles.append(register_optimizer_step_pre_hook(pre))
        self.handles.append(register_optimizer_step_post_hook(post))

    def detach(self):
        for h in self.handles:
            h.remove()
        self.handles = []
        self.running.clear()
        if self.construct is not None:
            self.construct.current = None

    # ---- forward ------------------------------------------------------------
    def _hook_module(self, module, name, whole):
        api = self.api
        flt = api.filter
        counters = self.counters
        running = self.running
        construct = self.construct

        def pre(mod, args, kwargs):
            if _is_compiling():   # inside a graph dynamo traces: probe stays out of it
                return None
            if state.depth or blocked.value:
                return None
            n = counters.get(name, 0)
            counters[name] = n + 1
            fwd = f"{name}.forward.{n}"
            key = f"{name}.{n}"
            if not flt.wants(key, fwd, module=True):
                running.append(_Running(mod, None, None, key, whole))
            else:
                parent = construct.current if construct is not None else None
                call = None
                try:
                    with OwnWork():
                        call = self._before(mod, name, fwd, args, kwargs, parent)
                except Exception as exc:
                    api.entries.fail(name, exc)
                running.append(_Running(mod, call, parent, key, whole))
                if construct is not None:
                    construct.tree[fwd] = parent and parent[0]
                    construct.current = (fwd, call.bwd if call else None)
            if whole:   # nothing inside is dumped: APIs see a probe call in progress
                blocked.value += 1
                state.depth += 1
            return None

        def post(mod, args, kwargs, output):
            if _is_compiling():
                return None
            if whole and running and running[-1].module is mod and running[-1].whole:
                blocked.value -= 1
                state.depth -= 1
            if state.depth or blocked.value:
                return None
            while running:
                frame = running.pop()
                if frame.module is mod:
                    break
            else:
                return None
            call, parent = frame.call, frame.parent
            flt.module_exit(frame.key)
            if call is None:
                return None
            if construct is not None:
                construct.current = parent
            try:
                with OwnWork():
                    self._after(call, output)
            except Exception as exc:
                api.entries.fail(name, exc)
            return None

        # torch < 2.5: hooks called from code dynamo compiles are not compiled themselves
        self.handles.append(module.register_forward_pre_hook(run_eagerly(pre), with_kwargs=True))
        self.handles.append(module.register_forward_hook(run_eagerly(post), with_kwargs=True, always_call=True))

    def _before(self, module, name, fwd, args, kwargs, parent):
        api = self.api
        entries = api.entries
        flt = api.filter
        call = _ModuleCall(name, fwd, f"{name}.backward.{fwd.rsplit('.', 1)[1]}", entries.summaries(), parent)
        self.dumped.add(name)
        if flt.forward:
            if flt.inputs:
                entries.inputs(call.entry, fwd, args, kwargs, call.summaries)
                call.params = {k: entries.describe(p, call.summaries, f"{fwd}.parameters.{k}")
                               for k, p in module._parameters.items() if p is not None}
            api.stacks.capture(fwd)
        if flt.backward and torch.is_grad_enabled():
            inputs = flat_tensors((args, kwargs), dataclasses_too=True)
            call.grad = (grad_capture.edges_before(inputs), len(inputs))
        return call

    def _after(self, call, output):
        api = self.api
        flt = api.filter
        entry = call.entry
        out = _plain(output)
        if flt.forward:
            if flt.outputs:
                api.entries.outputs(entry, call.fwd, out, call.summaries)
            if call.params is not None:
                entry.parameters = call.params
            call.summaries.resolve()
            api.writer.add_entry(call.fwd, entry)
        if call.grad is not None:
            before, n_inputs = call.grad
            outputs = flat_tensors(out, dataclasses_too=True)
            if any(t.requires_grad for t in outputs):
                _hook_call(before, outputs, n_inputs, self._grad_seen, self._backward_done_fn(call))

    # ---- backward -----------------------------------------------------------
    def _backward_done_fn(self, call):
        api = self.api
        name, bwd, parent = call.name, call.bwd, call.parent
        construct = self.construct

        def on_done(out_grads, in_grads):
            try:
                entry = api.entries.backward_entry(bwd, out_grads, in_grads, api.filter.inputs, api.filter.outputs)
                api.writer.add_entry(bwd, entry)
                if construct is not None:
                    construct.tree[bwd] = parent and parent[1]
            except Exception as exc:
                api.entries.fail(name, exc)
        return on_done

    def _grad_seen(self, grad):
        with OwnWork():
            return self.api.entries.grad_seen(grad)

    def _reduced_reader(self, groups, follow_forward):
        api = self.api

        def read():
            flt = api.filter
            if not flt.backward:
                return
            try:
                with OwnWork():
                    for group in groups:
                        if follow_forward:   # L0/mix: the modules whose forward was dumped
                            wanted = group.name in self.dumped
                        else:                # L1: outside any scope of API calls; list by name
                            wanted = not flt.scope and flt.wants(group.name, f"{group.name}.parameters_grad")
                        if wanted:
                            self._reduced_grads(group)
            except Exception as exc:
                api.entries.fail(f"{groups[0].name}.parameters_grad", exc)   # said once per model
        return read

    def _reduced_grads(self, group):
        """One module's ``parameters_grad`` entry from ``p.grad`` as the wrapper left it
        (a DTensor's: its local shard, with the layout)."""
        entries = self.api.entries
        name, p_names = group.name, group.params
        pending = {}
        for p_name in p_names:
            p = group.module._parameters.get(p_name)   # FSDP2 swaps sharded and unsharded ones: read now
            grad = None if p is None else p.grad
            if grad is not None:
                # written by the collective, below autograd: the version may not say so
                entries.cache.forget(grad)
                pending[p_name] = entries.grad_seen(grad)
        if pending:
            self.grad_pending[name] = pending
            self._flush_grads(name, [p for p in p_names if p in pending])

    def _param_hook(self, owners):
        api = self.api

        def hook(grad):
            if api.filter.backward:
                try:
                    with OwnWork():
                        self._param_grad(owners, grad)
                except Exception as exc:
                    api.entries.fail(owners[0].module, exc)
            return None
        return hook

    def _param_grad(self, owners, grad):
        summary = None
        for owner in owners:
            name, p_name, order = owner.module, owner.param, owner.order
            if name not in self.dumped:
                continue
            if summary is None:
                summary = self.api.entries.grad_seen(grad)
                if len(owners) > 1:   # copies below must carry the numbers, not a shared pending fetch
                    self.api.entries.resolve_grads([summary])
            pending = self.grad_pending.setdefault(name, {})
            pending[p_name] = summary if len(owners) == 1 else dict(summary)
            if len(pending) == len(order):
                self._flush_grads(name, order)
            elif not self.grad_flush_queued:
                self.grad_flush_queued = True
                _queue_callback(self._flush_all_grads)

    def _flush_all_grads(self):
        self.grad_flush_queued = False
        for name in list(self.grad_pending):
            self._flush_grads(name)

    def _flush_grads(self, name, order=None):
        pending = self.grad_pending.pop(name, None)
        if not pending:
            return
        k = self.grad_counters.get(name, 0)
        self.grad_counters[name] = k + 1
        entry_name = f"{name}.parameters_grad.{k}"
        api = self.api
        keys = order or list(pending)
        api.entries.resolve_grads(list(pending.values()))
        # {parameter name: [gradient summary]}: keys are the module's own, so a dict
        entry = {p: [api.entries.finish_grad(pending[p], f"{entry_name}.{p}")] for p in keys if p in pending}
        api.writer.add_entry(entry_name, entry)
