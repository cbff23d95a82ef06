"""Registered APIs inside ``torch.compile``'d graphs, dumped as an eager run names them.

A compiled model runs inductor's kernels, not the torch functions probe intercepts, so
the function mode sees nothing of it. Instead, while a debugger dumps at L1 or mix,
every inductor compile goes through :func:`instrumented_compile`:

* **forward**: dynamo's graph holds one node per torch-level call, with the function it
  called, ``stack_trace`` and ``nn_module_stack``. Each node whose function is registered
  (``Functional.linear``, ``Tensor.__add__``...) gets the statistics of its tensor inputs
  and outputs computed *inside the graph*: one extra output, a flat float64 vector of
  (Max, Min, Mean, Norm) per tensor that inductor fuses into its kernels. The graph's
  runtime wrapper takes that vector off the outputs and names the calls from the
  debugger's counters in graph order, so a compiled dump pairs by name with an eager one.
* **backward**: AOT autograd's backward graph tags each node with the forward call it
  differentiates (``fwd_source_fn_stack``, matched through ``seq_nr``). Per call, the
  gradients flowing into its backward nodes (of its outputs) and out of them (of its
  inputs) get the same in-graph statistics, as an extra output of the backward graph.

One host transfer per graph call on an accelerator happens at the writer's next flush
(the vector is small); on the CPU the numbers are read on the spot. The user's outputs
are the graph's own; ``tests/test_dump_compiled_graphs.py`` checks training stays
bitwise identical. Graphs left as they are, each said once: CUDA graphs (their outputs
are overwritten at the next replay), low-precision graphs (a statistic would make
inductor store a bf16/fp16 intermediate it otherwise keeps in fp32 inside a fused
kernel: the model's numbers would change), dynamic shapes, and torch before 2.5.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import operator
import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from probe.dump import stats
from probe.dump.compiled_operators import OPERATOR_NODE_NAMES, OperatorNames
from probe.dump.compiled_partition import Partitions, mark, partitioning
from probe.dump.records import BackwardEntry, ForwardEntry, describe_value, tensor_summary
from probe.dump.stack import format_frame, is_plumbing
from probe.hook_module.interceptor import guard
from probe.hook_module.torch_function_off import no_function_mode
from probe.log_once import LogOnce
from probe.torch_compat import TORCH, real_tensors
from probe.vocabulary import BACKWARD, FORWARD, MODULE, STAT_KEYS

log = logging.getLogger(__name__)
_said = LogOnce(log)

SUPPORTED = TORCH >= (2, 5)
N_STATS = len(STAT_KEYS)   # Max, Min, Mean, Norm: the layout of the in-graph vector, per tensor
_LOW_PRECISION = (torch.float16, torch.bfloat16)

# Python operators in dynamo's graph -> the dunder an eager run names them by
# (``a + b`` is ``Tensor.__add__``; ``2 * a``, whose left operand is no tensor, ``__rmul__``).
_OPERATORS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "truediv",
    operator.floordiv: "floordiv", operator.mod: "mod", operator.pow: "pow", operator.matmul: "matmul",
    operator.and_: "and", operator.or_: "or", operator.xor: "xor", operator.lshift: "lshift",
    operator.rshift: "rshift", operator.iadd: "iadd", operator.isub: "isub", operator.imul: "imul",
    operator.itruediv: "itruediv", operator.eq: "eq", operator.ne: "ne", operator.lt: "lt",
    operator.le: "le", operator.gt: "gt", operator.ge: "ge", operator.neg: "neg",
    operator.getitem: "getitem", operator.setitem: "setitem", operator.invert: "invert",
    operator.abs: "abs",
}
_REFLECTED = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor"}


def _summarise(*tensors):
    """The in-graph statistics: per tensor (Max, Min, Mean, Norm) in float64, from the
    reductions an eager dump of an accelerator tensor starts (``stats.device_reductions``),
    traced into the graph; the mean divides the sum as the eager fetch does."""
    parts = []
    for t in tensors:
        r = stats.device_reductions(t)   # tensors here are never empty (TensorSlot)
        v = r.parts.to(torch.float64)
        parts.append(torch.cat((v[:2], v[2:3] / r.numel, v[3:])))
    return torch.cat(parts)


def _summarise_apart(*tensors):
    """``_summarise`` through an operator inductor cannot see into (``probe::summarise``): it
    runs as an extern kernel of its own, so the graph's kernels are fused as without probe.
    For tensors inductor stores anyway (the extern kernels' inputs and outputs)."""
    return torch.cat([torch.ops.probe.summarise(t.detach()) for t in tensors])


if SUPPORTED:
    @torch.library.custom_op("probe::summarise", mutates_args=())
    def _summarise_op(t: torch.Tensor) -> torch.Tensor:
        return _summarise(t)

    @_summarise_op.register_fake
    def _summarise_shape(t):
        return t.new_empty(N_STATS, dtype=torch.float64)


# ---- what one graph records -------------------------------------------------------------
@dataclass
class TensorSlot:
    """A tensor whose statistics sit at ``index`` (times N_STATS) of the graph's vector."""
    index: int
    dtype: str
    shape: List[int]
    requires_grad: bool = False


@dataclass
class ApiCall:
    """One registered call in a forward graph, in graph order."""
    api: str                  # "Functional.linear"
    source: str               # dynamo's name of the call (``source_fn_stack``), the backward's key
    args: List[Any]           # TensorSlot / describe_value form, as the entry writes them
    kwargs: Dict[str, Any]
    outputs: List[Any]
    stack: Optional[str]      # the FX node's stack_trace
    module: Optional[Tuple[str, str]]   # innermost nn_module_stack (path, class): _module_path
    producers: List[str] = field(default_factory=list)   # per tensor input: its node's key


@dataclass
class BackwardCall:
    """One call's gradients in a backward graph: of its outputs (flowing in), of its inputs (out)."""
    source: str
    grads_in: List[TensorSlot]
    grads_out: List[Optional[TensorSlot]]
    position: int = 0   # where its first node runs in the backward graph


@dataclass
class GraphPlan:
    """What one compiled graph's extra outputs mean, and the forward names of its calls
    still waiting for their backward (a stack: backward runs in reverse order)."""
    calls: List[ApiCall] = field(default_factory=list)
    backward: List[BackwardCall] = field(default_factory=list)
    pending: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    frames: Dict[str, list] = field(default_factory=dict)   # call -> its stack.json frames
    summarise: Callable = _summarise   # how its statistics are computed in the graph
    inputs_of: Dict[str, List[str]] = field(default_factory=dict)   # node key -> its tensor inputs' keys
    extra: int = 1   # outputs added to the forward graph: the vector, then any tensors
    # with tensors: for each saved tensor, the graph's own output it is (its index), or
    # None where it is an added output (in order)
    from_outputs: List[Optional[int]] = field(default_factory=list)


# ---- the recorder, owned by a debugger ------------------------------------------------
class CompiledGraphs:
    """Turns the extra outputs of instrumented graphs into dump entries.

    ``start()``/``stop()`` follow the debugger's dumping; outside them graphs run with
    their statistics computed and dropped (a graph is compiled once, instrumented). On
    the CPU the numbers are read when the graph returns; on an accelerator the vectors
    wait for the writer's next flush, where they are fetched in one transfer.
    """

    def __init__(self, collector, construct):
        self.collector = collector
        self.entries = collector.entries
        # construct.json: each entry's module, as eager mix names it (``Module.{path}.{Class}
        # .forward.{n}``, n counting that module's graph runs in the step); at L1 too, where
        # no module hook can say it (the debugger writes it)
        self.construct = construct
        self.module_counters: Dict[Tuple[str, str], int] = {}
        self.active = False
        self._waiting: List[Tuple[Any, list]] = []   # (device vector, [(summary, index)])
        collector.writer.before_flush.append(self.fill)

    def start(self):
        self.active = True

    def reset_step(self):
        self.module_counters.clear()
        self.construct.reset()

    def _parents(self, plan: GraphPlan) -> Dict[str, str]:
        """call source -> its module's entry name without the direction (``Module.fc.Linear``
        and the counter), counting each module once per graph run."""
        seen: Dict[Tuple[str, str], str] = {}
        out = {}
        for call in plan.calls:
            if call.module is None:
                continue
            name = seen.get(call.module)
            if name is None:
                n = self.module_counters.get(call.module, 0)
                self.module_counters[call.module] = n + 1
                name = seen[call.module] = f"{MODULE}.{call.module[0]}.{call.module[1]}.{{}}.{n}"
            out[call.source] = name
        return out

    def stop(self):
        self.active = False

    def forward(self, plan: GraphPlan, vector, tensors):
        """A forward graph ran: name its calls (counters in graph order) and write them."""
        names = {}
        collector = self.collector
        flt = collector.filter
        fill: list = []
        made = []
        parents = self._parents(plan)
        for call in plan.calls:
            n = collector.counters.get(call.api, 0)
            collector.counters[call.api] = n + 1
            base = f"{call.api}.{n}"
            parent = parents.get(call.source)
            names[call.source] = (base, parent)
            if not flt.forward or (not flt.everything and not flt.wants(base)):
                continue
            fwd = base + ".forward"
            entry = ForwardEntry()
            if flt.inputs:
                entry.input_args = [self._form(a, fill, tensors, f"{fwd}.input.{i}") for i, a in enumerate(call.args)]
                entry.input_kwargs = {k: self._form(v, fill, tensors, f"{fwd}.{k}") for k, v in call.kwargs.items()}
            if flt.outputs:
                entry.output = [self._form(o, fill, tensors, f"{fwd}.output.{i}") for i, o in enumerate(call.outputs)]
            made.append((fwd, entry))
            collector.stacks.record(fwd, plan.frames[call.source])
            self.construct.tree[fwd] = parent and parent.format(FORWARD)
        self._write(vector, fill, made)
        return names

    def backward(self, plan: GraphPlan, names, vector, tensors):
        collector = self.collector
        flt = collector.filter
        if not flt.backward:
            return
        fill: list = []
        made = []
        for call in plan.backward:
            base, parent = names.get(call.source, (None, None))
            if base is None or (not flt.everything and not flt.wants(base, base + ".backward")):
                continue
            bwd = base + ".backward"
            self.construct.tree[bwd] = parent and parent.format(BACKWARD)
            entry = BackwardEntry()
            if flt.inputs:
                entry.input = [self._form(g, fill, tensors, f"{bwd}.input.{i}") for i, g in enumerate(call.grads_in)]
            if flt.outputs:
                entry.output = [self._form(g, fill, tensors, f"{bwd}.output.{i}") for i, g in enumerate(call.grads_out)]
            made.append((bwd, entry))
        self._write(vector, fill, made)

    def _form(self, slot, fill, tensors, file_stem):
        """An argument's entry form: a tensor's summary waits in ``fill`` for its numbers."""
        if isinstance(slot, list):
            return [self._form(x, fill, tensors, f"{file_stem}.{i}") for i, x in enumerate(slot)]
        if isinstance(slot, dict) and "type" not in slot:
            return {k: self._form(x, fill, tensors, f"{file_stem}.{k}") for k, x in slot.items()}
        if not isinstance(slot, TensorSlot):
            return slot
        s = tensor_summary(slot.dtype, list(slot.shape), slot.requires_grad)
        fill.append((s, slot.index))
        if tensors:
            s["data_name"] = self.entries.save(tensors[slot.index], file_stem)
        return s

    def _write(self, vector, fill, made):
        """Hand the entries to the writer once their numbers are in, or will be by the
        flush that encodes them (it may come while they are being added)."""
        if fill:
            if vector.device.type == "cpu":
                _fill(vector.tolist(), fill)
            else:
                self._waiting.append((vector, fill))
        for name, entry in made:
            self.collector.writer.add_entry(name, entry)

    def fill(self):
        """The writer's ``before_flush``: every waiting vector fetched in one transfer."""
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        with no_function_mode(), real_tensors():
            values = torch.cat([v.to(waiting[0][0].device) for v, _ in waiting]).cpu().tolist()
        offset = 0
        for v, fill in waiting:
            _fill(values[offset:offset + v.numel()], fill)
            offset += v.numel()


def _fill(values, fill):
    for summary, index in fill:
        i = index * N_STATS
        summary.update(zip(STAT_KEYS, values[i:i + N_STATS]))


# ---- building a plan: which nodes, which tensors ----------------------------------------
class _Refused(Exception):
    """A graph left unhooked, with the reason said once."""


def _api_name(node, by_func, dunders, operators=None):
    """The registry name an eager run gives the call ``node`` records, or None."""
    target = node.target
    if operators is not None:
        node_name = target if node.op == "call_method" else getattr(target, "__name__", None)
        if node_name in OPERATOR_NODE_NAMES:
            frame = _user_frame(node.meta.get("stack_trace"))
            dunder = frame and operators.dunder(node_name, frame[0], frame[1])
            if dunder:
                return dunders.get(dunder) or by_func.get(getattr(torch.Tensor, dunder, None))
    if node.op == "call_method":
        func = getattr(torch.Tensor, target, None)
        return None if func is None else by_func.get(func)
    if node.op != "call_function":
        return None
    op = _OPERATORS.get(target)
    if op is not None:
        first = node.args[0] if node.args else None
        tensor_first = isinstance(first, torch.fx.Node) and _is_tensor(first)
        if op in _REFLECTED and not tensor_first:
            op = "r" + op
        elif op == "getitem" and not tensor_first:
            return None   # unpacking a tuple
        dunder = f"__{op}__"
        return dunders.get(dunder) or by_func.get(getattr(torch.Tensor, dunder, None))
    return by_func.get(target) or _inlined_functional(node, by_func)


def _inlined_functional(node, by_func):
    """``F.pad`` inlined by dynamo leaves ``torch._C._nn.pad`` in the graph: named by the
    ``torch.nn.functional`` function whose body holds the node, when that is registered."""
    frames = [f for f in _parse_frames(node.meta.get("stack_trace")) if not is_plumbing(f[0])]
    if frames and frames[-1][0] == _FUNCTIONAL_FILE:
        return by_func.get(getattr(torch.nn.functional, frames[-1][2], None))
    return None


def _value(node):
    return node.meta.get("example_value", node.meta.get("val"))


def _is_tensor(node):
    return isinstance(_value(node), torch.Tensor)


def _mutates(node, api):
    method = api.rsplit(".", 1)[-1]
    if method.startswith("__i") or method in ("__setitem__",):
        return True
    return method.endswith("_") and not method.endswith("__") or "out" in node.kwargs


class _PlanBuilder:
    """Collects the tensors to summarise, in the order their statistics sit in the vector."""

    def __init__(self, graph):
        self.graph = graph
        self.nodes: List[torch.fx.Node] = []   # summarised tensors, in slot order

    def slot(self, node, tensors):
        value = _value(node)
        if isinstance(value, torch.Tensor):
            if any(not isinstance(d, int) for d in value.shape):
                raise _Refused("dynamic shapes")
            if value.dtype in _LOW_PRECISION:
                raise _Refused("float16/bfloat16 values")
            if value.numel() == 0 or value.is_complex():   # nothing to reduce, as in an eager dump
                return tensor_summary(str(value.dtype), list(value.shape), bool(value.requires_grad))
            tensors.append(node)
            self.nodes.append(node)
            return TensorSlot(len(self.nodes) - 1, str(value.dtype), list(value.shape), bool(value.requires_grad))
        if isinstance(value, (int, float, bool)):
            return describe_value(value)
        return None

    def form(self, a, tensors):
        """``a`` (an argument) as its entry writes it, its tensors added to ``tensors``."""
        if isinstance(a, torch.fx.Node):
            return self.slot(a, tensors)
        if isinstance(a, (list, tuple)):
            return [self.form(x, tensors) for x in a]
        if isinstance(a, dict):
            return {k: self.form(x, tensors) for k, x in a.items()}
        if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
            return {"type": type(a).__name__, "value": str(a)}
        return describe_value(a)


def _parse_frames(stack_trace):
    """An FX node's ``stack_trace`` (traceback's text) as (file, line, function, source)
    frames, outermost first."""
    frames = []
    lines = (stack_trace or "").splitlines()
    for i, text in enumerate(lines):
        text = text.strip()
        if not text.startswith('File "'):
            continue
        try:
            file_part, line_part, func_part = text.split(", ", 2)
            frame = (file_part[6:-1], int(line_part.split()[1]), func_part[3:])
        except (ValueError, IndexError):
            continue
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        frames.append(frame + (None if following.startswith("File ") else following,))
    return frames


def _stack_frames(stack_trace):
    """stack.json's frames of a graph node, innermost first, probe's own left out."""
    return [format_frame(*f) for f in reversed(_parse_frames(stack_trace)) if not is_plumbing(f[0])]


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FUNCTIONAL_FILE = torch.nn.functional.__file__


def _user_frame(stack_trace):
    """(file, line) of the innermost frame outside torch and probe: where the call was written."""
    for f in reversed(_parse_frames(stack_trace)):
        if not f[0].startswith(_TORCH_DIR) and not is_plumbing(f[0]):
            return f[0], f[1]
    return None


_ROOT = re.compile(r"^L\[['\"][^'\"]+['\"]\]")          # L['self']: the compiled frame's local
_INDEX = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]+)['\"]?\]")   # [0], ['fc'], ._modules['fc']


def _module_path(node) -> Optional[Tuple[str, str]]:
    """(path below the compiled module, class name) of the innermost module the call ran
    in, from dynamo's ``nn_module_stack`` (``("L['self'].layers.0.ln", LayerNorm)``):
    the path as ``named_modules()`` names it, the root's own calls and a form this torch
    writes otherwise (``L__self___layers_0``, torch < 2.3) None."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    root = _ROOT.match(path)
    if root is None:
        return None
    path = _INDEX.sub(lambda m: "." + m.group(1), path[root.end():]).lstrip(".")
    name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
    return (path, name) if path else None


def _check_values(apis):
    """Raise ``_Refused`` before the graph is touched if any registered call's tensors
    have dynamic shapes or a half type."""
    for node, api in apis.items():
        if api is None:
            continue
        for v in _flat([_value(a) for a in node.all_input_nodes] + [_value(node)]):
            if isinstance(v, torch.Tensor):
                if any(not isinstance(d, int) for d in v.shape):
                    raise _Refused("dynamic shapes")
                if v.dtype in _LOW_PRECISION:
                    raise _Refused("float16/bfloat16 values")


def instrument_forward(gm, by_func, dunders, with_tensors=False, only=None):
    """Add the statistics of every registered call's tensors to ``gm`` as one extra output
    (and, ``with_tensors``, the tensors themselves, detached, after it); ``only``: the
    APIs to instrument (default: every registered one).

    Returns the graph's :class:`GraphPlan`, or raises ``_Refused``. Inputs are summarised
    just before their call (an in-place API overwrites them), outputs just after; a tensor
    already summarised and not written since is not summarised again.
    """
    graph = gm.graph
    operators = OperatorNames()
    plan = GraphPlan(summarise=_summarise if only is None else _summarise_apart)
    apis = {node: _api_name(node, by_func, dunders, operators) for node in graph.nodes
            if node.op in ("call_function", "call_method")}
    if only is not None:
        apis = {node: api if api in only else None for node, api in apis.items()}
    _check_values(apis)
    builder = _PlanBuilder(graph)
    summarised = {}      # node -> TensorSlot, while not written since
    vectors: List[torch.fx.Node] = []
    created: List[torch.fx.Node] = []    # getitems of tuple outputs
    try:
        _add_statistics(graph, apis, plan, builder, summarised, vectors, created)
    except BaseException:
        for n in reversed(vectors + created):   # the graph as it was
            graph.erase_node(n)
        raise
    if not vectors:
        return None
    out = graph.output_node()
    results = out.args[0]
    results = tuple(results) if isinstance(results, (tuple, list)) else (results,)
    with graph.inserting_before(out):
        extra = [mark(graph.call_function(torch.cat, (vectors,)))]
        if with_tensors:
            # A tensor the graph returns anyway is read from that output, not returned a
            # second time as its detached alias: on torch 2.6 an output aliasing an output
            # that is itself an alias (a view) is regenerated from AOT's TensorAlias wrapper
            # and raises (TypeError in _functionalize_apply_view_metas; fixed in later torch)
            position = {r: i for i, r in reversed(list(enumerate(results))) if isinstance(r, torch.fx.Node)}
            plan.from_outputs = [position.get(n) for n in builder.nodes]
            extra += [mark(graph.call_method("detach", (n,))) for n in builder.nodes if n not in position]
    out.args = (results + tuple(extra),)
    plan.extra = len(extra)
    graph.lint()
    gm.recompile()
    plan.frames = {c.source: _stack_frames(c.stack) for c in plan.calls}
    return plan


def _node_key(node):
    """What AOT's backward graph calls the forward node (``fwd_source_fn_stack``), or, for
    an input of the graph, ``primal:K`` (its gradient is the backward graph's output K)."""
    if node.op == "placeholder":
        return f"primal:{node.meta['_probe_primal']}"
    source = node.meta.get("source_fn_stack")
    return source[-1][0] if source else node.name


def _add_statistics(graph, apis, plan, builder, summarised, vectors, created):
    for i, node in enumerate(n for n in graph.nodes if n.op == "placeholder"):
        node.meta["_probe_primal"] = i
    for node in graph.nodes:
        if node.op in ("call_function", "call_method"):
            plan.inputs_of[_node_key(node)] = [_node_key(a) for a in node.all_input_nodes if _is_tensor(a)]
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method"):
            continue
        api = apis.get(node)
        if api is None:
            continue
        source = node.meta.get("source_fn_stack")
        key = source[-1][0] if source else node.name

        def form(a, fresh):
            if isinstance(a, torch.fx.Node) and a in summarised:
                return summarised[a]
            out = builder.form(a, fresh)
            if isinstance(a, torch.fx.Node) and isinstance(out, TensorSlot):
                summarised[a] = out
            return out

        before = []
        args = [form(a, before) for a in node.args]
        kwargs = {k: form(v, before) for k, v in node.kwargs.items() if k != "out"}
        if before:
            with graph.inserting_before(node):
                vectors.append(mark(graph.call_function(plan.summarise, tuple(before))))
        if _mutates(node, api):
            for a in node.args[:1]:
                summarised.pop(a, None)
        value = _value(node)
        after = []
        last = node
        if isinstance(value, (tuple, list)):
            outputs = []
            for i, v in enumerate(value):
                with graph.inserting_after(last):
                    last = mark(graph.call_function(operator.getitem, (node, i)))
                created.append(last)
                last.meta["example_value"] = v
                outputs.append(builder.form(last, after))
        else:
            outputs = [form(node, after)]
        if after:
            with graph.inserting_after(last):
                vectors.append(mark(graph.call_function(plan.summarise, tuple(after))))
        tensor_inputs = [a for a in list(node.args) + list(node.kwargs.values()) for a in _flat([a])
                         if isinstance(a, torch.fx.Node) and _is_tensor(a)]
        plan.calls.append(ApiCall(api, key, args, kwargs, outputs, node.meta.get("stack_trace"),
                                  _module_path(node), [_node_key(a) for a in tensor_inputs]))


# ---- backward: gradients of each call, from AOT's backward graph ------------------------
def _fwd_source(node):
    stack = node.meta.get("fwd_source_fn_stack")
    return stack[-1][0] if stack else None


def _is_grad_value(node, group_source):
    """May ``node`` hold a gradient flowing into the backward of ``group_source``?"""
    if node.op == "placeholder":
        return node.name.startswith("tangents")
    if node.op != "call_function" or node.meta.get("source_fn_stack"):
        return False   # a forward value recomputed in the backward graph
    return _fwd_source(node) != group_source


def _numel(node):
    v = node.meta.get("val")
    return v.numel() if isinstance(v, torch.Tensor) else 0


def _shape(node):
    v = node.meta.get("val")
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def instrument_backward(gm, plan: GraphPlan, with_tensors=False):
    """Add the statistics of each planned call's gradients to AOT's backward graph ``gm``.

    A call's backward nodes are those tagged with its source. What flows into them from
    outside (a tangent, another call's gradient) and has the shape of one of the call's
    outputs is the gradient of that output; what they hand on and has the shape of one of
    its tensor inputs is that input's gradient (inputs of equal shape are taken in order).
    """
    graph = gm.graph
    by_source = collections.defaultdict(list)
    position = {node: i for i, node in enumerate(graph.nodes)}
    for node in graph.nodes:
        src = _fwd_source(node)
        if src is not None and node.op == "call_function" and not node.meta.get("source_fn_stack"):
            by_source[src].append(node)
    if not by_source:
        return None
    tensors: list = []
    backward = []
    index = {}
    out_node = graph.output_node()

    def slot(node):
        if node not in index:
            v = node.meta["val"]
            index[node] = TensorSlot(len(tensors), str(v.dtype), list(v.shape))
            tensors.append(node)
        return index[node]

    for call in plan.calls:
        group = by_source.get(call.source)
        if not group:
            continue
        members = set(group)
        out_shapes = [o.shape if isinstance(o, TensorSlot) else None for o in call.outputs]
        in_slots = [a for a in _flat(call.args) + _flat(list(call.kwargs.values())) if isinstance(a, TensorSlot)]
        flowing_in = []
        for n in group:
            for a in n.all_input_nodes:
                if a not in members and a not in flowing_in and _is_grad_value(a, call.source) and _numel(a) \
                        and _shape(a) in out_shapes:
                    flowing_in.append(a)
        handed_on = [n for n in group if isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].numel()
                     and any(u not in members or u is out_node for u in n.users)]
        grads_out: List[Optional[TensorSlot]] = []
        free = list(handed_on)
        goes_to = {n: _destinations(n, members, out_node) for n in handed_on}
        for s, producer in zip(in_slots, call.producers + [None] * len(in_slots)):
            # the gradient that reaches the backward of the call (or the graph input) that
            # made this input; failing that, the next of the same shape
            wanted = _backward_owners(producer, plan.inputs_of, by_source)
            match = next((n for n in free if _shape(n) == s.shape and wanted & goes_to[n]), None) \
                if wanted else None
            if match is None:
                match = next((n for n in free if _shape(n) == s.shape), None)
            if match is not None:
                free.remove(match)
            grads_out.append(None if match is None else slot(match))
        ordered_in = sorted(flowing_in, key=lambda a: out_shapes.index(_shape(a)))
        backward.append(BackwardCall(call.source, [slot(a) for a in ordered_in], grads_out,
                                     min(position[n] for n in group)))
    if not tensors:
        return None
    backward.sort(key=lambda c: c.position)   # as the backward pass runs them, as an eager dump lists them
    vector = _graph_copy_summarise(graph, tensors, out_node, plan.summarise)
    results = out_node.args[0]
    out_node.args = ((*results, vector, *(tensors if with_tensors else ())),)
    graph.lint()
    gm.recompile()
    return backward


def _destinations(node, members, out_node):
    """Where a gradient a call's backward hands on ends up: the sources of the backward
    nodes that use it (through additions that sum it with others), ``primal:K`` for the
    graph's output K."""
    found = set()
    todo = [(node, u) for u in node.users if u not in members]
    seen = set()
    while todo:
        prev, u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if u is out_node:
            outs = u.args[0]
            found.update(f"primal:{k}" for k, o in enumerate(outs) if o is prev)
            continue
        src = _fwd_source(u)
        if src is not None and not u.meta.get("source_fn_stack"):
            found.add(src)
        else:   # an accumulation or view with no forward call: look past it
            todo.extend((u, w) for w in u.users)
    return found


def _backward_owners(key, inputs_of, by_source, depth=0):
    """The node keys whose backward receives the gradient of the forward value ``key``: the
    call itself if its backward computes something, else (a view, an addition) those that
    made its inputs, and so on."""
    if key is None or depth > 32:
        return set()
    if key.startswith("primal:") or key in by_source:
        return {key}
    owners = set()
    for k in inputs_of.get(key) or ():
        owners |= _backward_owners(k, inputs_of, by_source, depth + 1)
    return owners


def _flat(items):
    flat = []
    for x in items:
        if isinstance(x, (list, tuple)):
            flat.extend(_flat(x))
        elif isinstance(x, dict):
            flat.extend(_flat(list(x.values())))
        else:
            flat.append(x)
    return flat


def _graph_copy_summarise(graph, nodes, before, summarise):
    """``_summarise`` over ``nodes`` traced to aten ops (with their fake values, as the
    lowering needs) and copied into ``graph`` before ``before``."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx
    vals = [n.meta["val"] for n in nodes]
    fake_mode = torch._guards.detect_fake_mode(vals)
    ctx = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with ctx:
        sub = make_fx(summarise, decomposition_table=select_decomp_table())(*vals)
    env = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for p, n in zip(placeholders, nodes):
        env[p] = n
    result = None
    copied = []
    try:
        with graph.inserting_before(before):
            for n in sub.graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "output":
                    result = env[n.args[0]]
                    break
                env[n] = graph.node_copy(n, lambda x: env[x])
                copied.append(env[n])
    except BaseException:
        for n in reversed(copied):
            graph.erase_node(n)
        raise
    return result


# ---- the compile entry point ------------------------------------------------------------
def _passed_through(compiled, name):
    """An attribute of the compiled graph probe wraps (``_boxed_call``...), read through the
    wrapper, but not dynamo's ``_torchdynamo_orig_callable``: dynamo unwraps a callable that
    has one (``innermost_fn``, where it wraps the graph in ``disable``), and on torch 2.6
    AOT autograd's forward has one: read through, it made dynamo call the plain graph and
    skip probe's wrapper, and nothing inside compiled graphs was dumped."""
    if name.startswith("_torchdynamo"):
        raise AttributeError(name)
    return getattr(compiled, name)


class _Stripped:
    """A compiled graph's callable with probe's outputs (the last ``extra``) taken off.
    ``from_outputs`` (see ``GraphPlan``) puts the graph's own outputs among the saved
    tensors, detached."""

    def __init__(self, compiled, extra, on_outputs, from_outputs=()):
        self.compiled = compiled
        self.extra = extra
        self.on_outputs = on_outputs
        self.from_outputs = from_outputs
        self._boxed_call = getattr(compiled, "_boxed_call", False)

    def __call__(self, *args):
        with no_function_mode():   # the graph's own extern calls are no API calls of the user's
            outs = self.compiled(*args)
        cut = len(outs) - self.extra
        try:
            tensors = list(outs[cut + 1:])
            if any(i is not None for i in self.from_outputs):
                added = iter(tensors)
                tensors = [next(added) if i is None else outs[i].detach() for i in self.from_outputs]
            self.on_outputs(outs[cut], tensors)
        except Exception as exc:   # never into the training step
            _said.warning("record", "probe: recording a compiled graph failed (%s: %s); training goes on",
                          type(exc).__name__, exc)
        results = outs[:cut]
        return tuple(results) if isinstance(outs, tuple) else list(results)

    def __getattr__(self, name):
        return _passed_through(self.compiled, name)


class _Verified:
    """A graph compiled with probe's outputs and without; its first call decides which runs.

    Added outputs change which intermediates inductor stores and how it splits its loops,
    and with that, sometimes, the code that computes the model's own numbers (a vectorised
    ``cos`` where the scalar one ran, a multiply-add fused or not): not bitwise any more.
    So the first call runs the plain and the instrumented version on the same inputs, random
    state and buffers restored between them, and a backward of each with the same random
    gradients; the instrumented graph is kept only where every output and input gradient is
    bitwise the plain graph's. If it is not, the next candidate is tried: the graph with
    only the calls inductor runs as extern kernels (matrix products, convolutions,
    attention), whose inputs and outputs it stores anyway, their statistics computed by an
    operator of probe's that inductor runs apart (``probe::summarise``: nothing of it is
    fused into the graph's kernels); then the plain graph, said once.
    A value the plain graph does not reproduce itself (atomic additions) is left out of
    the check (``_Check``). What the forward saves for the backward is not left to this
    check, which compares numbers and so sees a kernel computing them otherwise only on
    inputs where they differ: each candidate is partitioned as the plain graph, and one
    whose forward still differs is not offered (``compiled_partition``).
    What it costs: one extra compile per graph (two where the first candidate fails), and
    two extra forwards and backwards at its first call (three where a value differs).
    """

    def __init__(self, plain, candidates, hook):
        self.plain = plain
        self.candidates = candidates   # instrumented callables, or functions making one
        self.hook = hook
        self.chosen = None
        self._boxed_call = getattr(plain, "_boxed_call", False)   # as dynamo calls it; passed through

    def __call__(self, *args):
        if self.chosen is None:
            with guard(), no_function_mode():   # compiling and checking are no calls of the user's
                self.chosen = self._choose(args)
        return self.chosen(*args)

    def _choose(self, args):
        boxed = len(args) == 1 and isinstance(args[0], list)   # one list: the boxed convention
        inputs = list(args[0]) if boxed else list(args)
        check = _Check(self.plain, inputs, boxed)
        differed = False
        for candidate in self.candidates:
            if candidate is not None and not isinstance(candidate, _Stripped):
                candidate = candidate()   # compiled only when needed
            if candidate is None:
                continue
            self.hook.checking = True
            try:
                if check.same(candidate):
                    return candidate
                differed = True
            except Exception as exc:   # the check itself failed: keep the model's numbers
                _said.warning("check", "probe: checking an instrumented graph failed (%s: %s); it runs as "
                              "compiled without probe", type(exc).__name__, exc)
                break
            finally:
                self.hook.checking = False
        if differed:
            _said.warning("numerics", "probe: a compiled graph with probe's statistics computes the model's "
                          "numbers differently (inductor fused or vectorised it otherwise): left unhooked, its APIs "
                          "are not dumped")
        return self.plain

    def __getattr__(self, name):
        return _passed_through(self.plain, name)


class _Check:
    """Are a candidate's outputs and input gradients bitwise the plain graph's on ``inputs``?

    Where one differs, the plain graph is run once more: a value the plain graph does not
    reproduce itself (a gradient summed by atomic adds in a Triton kernel, an embedding's
    or a scatter's) can't be held to bitwise, by probe or by a second run without it, and
    is left out, said once; every other value must be bitwise.

    The inputs that need a gradient are given as detached leaves over the same storage:
    the check's backward must end at this graph's inputs. With the real ones, an input
    that comes from earlier graphs (after a graph break) and a parameter used there too
    (GPT-2's tied embedding) made autograd go on into the earlier graphs' backward for
    that parameter's whole gradient, freeing their saved tensors: the user's own backward
    then raised ("backward through the graph a second time")."""

    def __init__(self, plain, inputs, boxed):
        inputs = [t.detach().requires_grad_(True) if isinstance(t, torch.Tensor) and t.requires_grad else t
                  for t in inputs]
        self.plain, self.inputs, self.boxed = plain, inputs, boxed
        self.tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        self.reference = None
        self.unstable = None          # positions the plain graph does not reproduce

    def same(self, candidate) -> bool:
        if self.reference is None:
            self.reference = self._numbers(self.plain)
        got = self._numbers(candidate)
        differ = _differing(self.reference, got)
        if not differ:
            return True
        if self.unstable is None:
            self.unstable = _differing(self.reference, self._numbers(self.plain))
        if differ <= self.unstable:
            _said.warning("unstable", "probe: %d output(s) or gradient(s) of a compiled graph differ between two "
                          "runs of the graph without probe (atomic additions): checked bitwise on the others",
                          len(self.unstable))
            return True
        return False

    def _numbers(self, fn) -> list:
        """Outputs, then the gradients of the inputs that need one for fixed random
        output gradients, with random state and updated buffers as before."""
        tensors, inputs = self.tensors, self.inputs
        buffers = [(t, t._version, t.detach().clone()) for t in tensors if not t.requires_grad]
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

        def restore():
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            with torch.no_grad(), no_function_mode():
                for t, version, copy in buffers:
                    if t._version != version:   # the graph updated it (running statistics)
                        t.copy_(copy)
        try:
            # the user's saved-tensor hooks (offloading, counting) see only the user's calls
            with no_function_mode(), torch.autograd.graph.saved_tensors_hooks(_kept, _kept):
                restore()
                outs = list(fn(list(inputs)) if self.boxed else fn(*inputs))
                needs = [t for t in tensors if t.requires_grad]
                grads_of = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
                if not (needs and grads_of and torch.is_grad_enabled()):
                    return outs
                gen = torch.Generator(device=grads_of[0].device).manual_seed(0)
                seeds = [torch.randn(o.shape, dtype=o.dtype, device=o.device, generator=gen) for o in grads_of]
                grads = torch.autograd.grad(grads_of, needs, seeds, allow_unused=True)
                return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs] + list(grads)
        finally:
            restore()


def _kept(t):
    return t


def _differing(a: list, b: list) -> set:
    """Positions where ``a`` and ``b`` are not bitwise equal (all of them if their lengths differ)."""
    if len(a) != len(b):
        return set(range(max(len(a), len(b))))
    return {k for k, (x, y) in enumerate(zip(a, b)) if not _bitwise(x, y)}


def _bitwise(a, b):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a is None and b is None or (not isinstance(a, torch.Tensor) and a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
        return torch.equal(a.detach().contiguous().view(width), b.detach().contiguous().view(width))
    return torch.equal(a, b)


def _copy_graph_module(gm):
    """A GraphModule over a copy of ``gm``'s graph (same attributes and node metadata),
    with what dynamo hangs on the module and its placeholders: AOT autograd reads the
    parameters among the inputs from them (``_param_name_to_source``, ``_dynamo_source``),
    and the partitioner saves those for free; without them the copy was partitioned
    otherwise than ``gm``."""
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    copied: Dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, copied))
    for old, new in copied.items():
        if hasattr(old, "_dynamo_source"):
            new._dynamo_source = old._dynamo_source
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta = dict(getattr(gm, "meta", {}))
    if hasattr(gm, "_param_name_to_source"):
        copy._param_name_to_source = gm._param_name_to_source
    return copy


_inside = threading.local()


class CompileHook:
    """Routes inductor's compiles through the instrumentation while installed.

    ``torch.compile(model)`` looks ``torch._inductor.compile_fx.compile_fx`` up at each
    compile, so a model compiled before the debugger was built (but first called after)
    is instrumented too. ``install()`` at the debugger's construction, ``uninstall()`` at
    its close; each compile is said in the log at DEBUG.
    """

    def __init__(self, recorder: CompiledGraphs, by_func, dunders, with_tensors=False):
        self.recorder = recorder
        self.with_tensors = with_tensors
        self.by_func = by_func
        self.dunders = dunders
        self._original: Optional[Callable] = None
        self.instrumented = 0   # graphs compiled with their statistics
        self.checking = False   # a graph's first call is comparing its two versions: record nothing
        # model -> its modules' forwards (``forward_codes``), walked once: after_step runs at
        # every step, and an inference step (one forward) is short enough for the walk to show
        self._codes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def install(self):
        if not SUPPORTED:
            if _said.first("version"):
                log.info("probe: torch %s has no backward metadata in compiled graphs (2.5+): a "
                         "torch.compile'd model is dumped only where it runs eagerly", torch.__version__)
            return
        import torch._inductor.compile_fx as cfx
        if self._original is None:
            self._original = cfx.compile_fx
            cfx.compile_fx = self.compile

    def uninstall(self):
        if self._original is None:
            return
        import torch._inductor.compile_fx as cfx
        if cfx.compile_fx == self.compile:
            cfx.compile_fx = self._original
        self._original = None

    def after_step(self, model):
        """Say once when ``model`` ran compiled but none of its graphs came through here."""
        if self._original is None or self.instrumented or model is None or _said.said("not-inductor"):
            return
        from probe.dump.modules import forward_codes, runs_compiled
        models = model if isinstance(model, (list, tuple)) else [model]
        codes = self._codes
        for m in models:
            if m not in codes:
                codes[m] = forward_codes(m)
        if any(runs_compiled(m, codes[m]) for m in models):
            _said.warning("not-inductor", "probe: the model runs compiled but none of its graphs went through "
                          "inductor since the debugger was built (another backend, or compiled before): only "
                          "what runs eagerly is dumped")

    def compile(self, gm, example_inputs, *args, **kwargs):
        original = self._original
        if original is None or getattr(_inside, "on", False) or not isinstance(gm, torch.fx.GraphModule):
            return (original or _compile_fx())(gm, example_inputs, *args, **kwargs)
        reason = _refusal(kwargs.get("config_patches") or {})
        spare = _copy_graph_module(gm)   # for the instrumented versions
        partitions = Partitions(_output_count(gm))
        _inside.on = True
        try:
            with guard():
                # the plain graph first: each candidate's forward is held to its partition
                plain_kwargs = dict(kwargs, inner_compile=self._inner(kwargs.get("inner_compile"), None, partitions))
                # a cache hit skips the partition and inner_compile: nothing to compare with
                with _no_autograd_cache(), partitioning(partitions, plain=True):
                    plain = original(gm, example_inputs, *args, **plain_kwargs)
                instrumented = None
                if reason is None:
                    try:
                        instrumented = self._instrumented(_copy_graph_module(spare), example_inputs, args, kwargs,
                                                          None, partitions)
                    except _Refused as exc:
                        reason = str(exc)
                if reason is not None:
                    _said.warning(reason, "probe: a compiled graph with %s is not instrumented: its APIs are "
                                  "not dumped (%s)", reason, _WHY.get(reason, ""))
                    return plain
                if instrumented is None and partitions.plan_less:
                    return plain   # no registered call in it
        finally:
            _inside.on = False

        def fallback():   # only the calls inductor runs as extern kernels (see _Verified)
            _inside.on = True
            try:
                return self._instrumented(spare, example_inputs, args, kwargs, EXTERN_KERNEL_APIS, partitions)
            except _Refused:
                return None
            finally:
                _inside.on = False
        return _Verified(plain, [instrumented, fallback], self)

    def _instrumented(self, gm, example_inputs, args, kwargs, only, partitions):
        """``gm`` compiled with the statistics of its calls (``only`` those APIs), or None:
        where it has none of them (``partitions.plan_less``), where instrumenting failed,
        and where AOT autograd partitioned it otherwise than the plain graph (said once)."""
        partitions.start_candidate()
        try:
            plan = instrument_forward(gm, self.by_func, self.dunders, self.with_tensors, only)
        except _Refused:
            raise
        except Exception as exc:   # probe's bug: the graph compiles as it was
            _said.warning("instrument", "probe: instrumenting a compiled graph failed (%s: %s); its APIs "
                          "are not dumped", type(exc).__name__, exc)
            return None
        if plan is None:
            partitions.plan_less = True
            return None
        self.instrumented += 1   # came through here (see after_step), kept or not
        kwargs = dict(kwargs, inner_compile=self._inner(kwargs.get("inner_compile"), plan, partitions))
        with _no_autograd_cache(), partitioning(partitions, plain=False):
            compiled = self._original(gm, example_inputs, *args, **kwargs)
        if not partitions.candidate_matches():
            _said.warning("partition", "probe: a compiled graph with probe's statistics is partitioned otherwise "
                          "by AOT autograd (its forward saves for the backward what the graph without probe "
                          "recomputes, or the reverse; the numbers could differ): left as compiled without probe's "
                          "statistics where no other version matches")
            return None
        return _Stripped(compiled, plan.extra, lambda vector, tensors: self._forward_ran(plan, vector, tensors),
                         plan.from_outputs)

    def _forward_ran(self, plan, vector, tensors):
        if self.checking:
            return
        recorder = self.recorder
        names = recorder.forward(plan, vector, tensors) if recorder.active else None
        if torch.is_grad_enabled():
            plan.pending.append(names)

    def _inner(self, inner, plan, partitions):
        if inner is None:
            from torch._inductor.compile_fx import compile_fx_inner as inner

        def compile_inner(gm, example_inputs, **kw):
            # a backward graph is compiled at its first run, on the autograd engine's thread
            # (a device's own thread on an accelerator), where probe's guard is not yet up and
            # the function mode, carried over by autograd, would record the compile's calls
            with guard():
                return compile_fx_inner_instrumented(gm, example_inputs, **kw)

        def compile_fx_inner_instrumented(gm, example_inputs, **kw):
            if not kw.get("is_backward"):
                partitions.record(gm, plain=plan is None)
            if plan is None or not kw.get("is_backward"):
                return inner(gm, example_inputs, **kw)
            try:
                calls = instrument_backward(gm, plan, self.with_tensors)
            except Exception as exc:
                _said.warning("instrument-bw", "probe: instrumenting a backward graph failed (%s: %s); its "
                              "gradients are not dumped", type(exc).__name__, exc)
                calls = None
            compiled = inner(gm, example_inputs, **kw)
            if not calls:
                return compiled
            plan.backward = calls
            extra = 1 + (len({s.index for c in calls for s in c.grads_in + c.grads_out if s is not None})
                         if self.with_tensors else 0)
            return _Stripped(compiled, extra, lambda vector, tensors: self._backward_ran(plan, vector, tensors))
        return compile_inner

    def _backward_ran(self, plan, vector, tensors):
        if self.checking:
            return
        names = plan.pending.pop() if plan.pending else None
        if names is not None and self.recorder.active:
            self.recorder.backward(plan, names, vector, tensors)


# APIs inductor lowers to extern kernels (aten's or a library's): their inputs and outputs
# are stored whatever probe reads, so statistics of them leave the graph's kernels as they were
EXTERN_KERNEL_APIS = frozenset({
    "Functional.linear", "Functional.bilinear", "Functional.conv1d", "Functional.conv2d", "Functional.conv3d",
    "Functional.conv_transpose1d", "Functional.conv_transpose2d", "Functional.conv_transpose3d",
    "Functional.scaled_dot_product_attention", "Torch.matmul", "Torch.mm", "Torch.bmm", "Torch.addmm",
    "Torch.baddbmm", "Torch.addbmm", "Torch.einsum", "Torch.conv2d", "Tensor.matmul", "Tensor.mm",
    "Tensor.bmm", "Tensor.__matmul__", "Tensor.__rmatmul__"})

_WHY = {
    "CUDA graphs": "their outputs are overwritten at the next replay",
    "float16/bfloat16 values": "a statistic would make inductor store an intermediate it keeps in float32 "
                               "inside a fused kernel, changing the model's numbers",
    "dynamic shapes": "shapes are known only at run time",
}


def _refusal(config_patches):
    from torch._inductor import config
    if config_patches.get("triton.cudagraphs") or config.triton.cudagraphs:
        return "CUDA graphs"
    return None


def _output_count(gm) -> int:
    results = gm.graph.output_node().args[0]
    return len(results) if isinstance(results, (tuple, list)) else 1


def _no_autograd_cache():
    """AOT autograd's cache off: its hits skip inductor's inner compile, where probe
    instruments a backward graph and reads each forward's partition."""
    return torch._functorch.config.patch(enable_autograd_cache=False)


def _compile_fx():
    from torch._inductor.compile_fx import compile_fx
    return compile_fx
