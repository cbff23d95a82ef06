"""The graph inductor is handed for a compiled graph, as a form two compiles can compare.

Probe compiles each graph twice, with its statistics and without (``compiled_graphs``).
Its added nodes are extra users of the model's tensors, and AOT autograd's partitioner
weighs users when it chooses what the forward saves for the backward and what the
backward recomputes: with them, HF Llama's loss graph saved the softmax where the plain
graph recomputes ``exp(x - amax - lse)`` in its backward, computing it with another
kernel (a scalar ``std::log`` instead of a vectorised one). The two agree on most inputs
and differ on some, so a bitwise check on one call cannot tell them apart.

So the partition is made equal by construction, and then checked:

* every node probe adds carries :data:`PROBE_MARK` as its stack trace, which AOT copies
  onto every aten node it traces from it;
* the instrumented compile's partitioner runs on the joint graph with probe's nodes taken
  out and the others named as the plain compile's joint graph names them (the min cut
  breaks ties by name), and probe's nodes are put back into the forward it returns
  (:func:`partitioned_without_probe`);
* the forward AOT hands inductor, probe's nodes left out, must then be node for node the
  plain graph's forward, its outputs (the user's, then what is saved for the backward)
  included (:func:`model_form`, :class:`Partitions`). Equal forwards mean the same saved
  tensors, so the same backward graph; a candidate whose forward differs is never kept,
  whatever its inputs.
"""
from __future__ import annotations

import contextlib
import difflib
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.utils._pytree as pytree

log = logging.getLogger(__name__)

# the stack trace of every node probe adds to a graph: no frame of it parses (stack.py
# reads ``File "...`` lines), and AOT autograd carries it onto the aten nodes it traces
PROBE_MARK = "probe: statistics (no frame)"


def mark(node: torch.fx.Node) -> torch.fx.Node:
    """Tag ``node`` as probe's own (left out of :func:`model_form`)."""
    node.meta["stack_trace"] = PROBE_MARK
    return node


def is_probes(node: torch.fx.Node) -> bool:
    return node.meta.get("stack_trace") == PROBE_MARK


def model_form(gm: torch.fx.GraphModule, user_outputs: int, probes=()) -> Optional[Tuple[Any, ...]]:
    """The model's part of an AOT graph: the nodes its outputs need (probe's outputs left
    out) and those nothing reads (an in-place write), each as its op, target and arguments (nodes as their position), the
    placeholders with their shape and dtype, then the outputs, each as the tensor it is a
    view of (saving a matrix product or a view of it holds the same numbers): the first
    ``user_outputs`` (the graph's own) in order, the rest (saved for the backward) as a
    set, AOT lists them in no order of the model's; the outputs at ``probes`` are
    probe's (what AOT added for them, see :func:`_without_probes`). None where
    a node the model needs reads one of probe's (a common subexpression merged across
    the two): the graphs differ."""
    nodes = list(gm.graph.nodes)
    out = nodes[-1]
    outs = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    outs = [_base(o) if isinstance(o, torch.fx.Node) else o for i, o in enumerate(outs)
            if not (isinstance(o, torch.fx.Node) and is_probes(o)) and i not in probes]
    needed = set()
    # and what writes in place with no user (an input's mutation kept in the graph)
    todo = [o for o in outs if isinstance(o, torch.fx.Node)] + \
        [n for n in nodes if n.op == "call_function" and not n.users and not is_probes(n)]
    while todo:
        n = todo.pop()
        if n in needed:
            continue
        if is_probes(n):
            return None
        needed.add(n)
        todo.extend(n.all_input_nodes)
    index: Dict[torch.fx.Node, int] = {}
    form: List[Any] = []

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("node", index[a])
        if isinstance(a, (list, tuple)):
            return tuple(arg(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, arg(v)) for k, v in a.items()))
        return repr(a)

    for node in nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            shape = (tuple(val.shape), str(val.dtype)) if isinstance(val, torch.Tensor) else repr(val)
            entry: Tuple[Any, ...] = ("placeholder", shape)
        elif node in needed:
            entry = (node.op, str(node.target), arg(node.args), arg(node.kwargs))
        else:
            continue
        index[node] = len(form)
        form.append(entry)
    # the graph's own outputs in order, then what it saves for the backward, in any order
    outputs = [arg(o) for o in outs]
    form.append(("output", tuple(outputs[:user_outputs]), tuple(sorted(outputs[user_outputs:], key=repr))))
    return tuple(form)


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The tensor ``node`` is a view of (itself if it is none)."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node) \
            and _is_view(node.target):
        node = node.args[0]
    return node


def _is_view(target) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    if schema.name in ("aten::_unsafe_view", "aten::reshape"):
        return True
    returns = schema.returns
    alias = returns[0].alias_info if len(returns) == 1 else None
    return alias is not None and not alias.is_write


class Partitions:
    """The model forms of one graph's compiles: the plain one's, and each instrumented
    candidate's, as inductor's inner compile receives their forward graphs."""

    def __init__(self, user_outputs: int):
        self.user_outputs = user_outputs   # outputs of dynamo's graph: the forward's first ones
        self.plain: Optional[Tuple[Any, ...]] = None
        self.last: Optional[Tuple[Any, ...]] = None   # the latest instrumented candidate's
        self.plain_seen = False
        self.last_seen = False
        self.plan_less = False   # the graph has no call to instrument
        # the plain joint graph's nodes: name, op, target
        self.joint_nodes: Optional[List[Tuple[str, str, str]]] = None
        self.forward_outputs: Optional[List[str]] = None   # its forward outputs' names
        self.probe_outputs: List[int] = []   # the candidate's forward outputs that are probe's

    def record(self, gm, plain: bool):
        try:
            form = model_form(gm, self.user_outputs, () if plain else self.probe_outputs)
        except Exception as exc:   # probe's bug: not shown the same, so not kept
            log.debug("probe: reading a forward graph's form failed (%s: %s)", type(exc).__name__, exc)
            form = None
        if plain:
            self.plain, self.plain_seen = form, True
        else:
            self.last, self.last_seen = form, True

    def start_candidate(self):
        self.last, self.last_seen, self.probe_outputs = None, False, []

    def candidate_matches(self) -> bool:
        """Did the latest candidate's forward come out as the plain graph's? False where
        either was not seen (a cache hit skipped the inner compile): not shown the same."""
        return self.plain_seen and self.last_seen and self.plain is not None and self.last == self.plain


# ---- partitioning as without probe ------------------------------------------------------
def partitioned_without_probe(partition: Callable, partitions: "Partitions", plain: bool) -> Callable:
    """AOT autograd's partitioner (``min_cut_rematerialization_partition``) for one of a
    graph's compiles. The plain compile's: as it is, the names of its joint graph's nodes
    kept. An instrumented compile's: run on the joint graph with probe's nodes taken out
    and the others named as in the plain joint graph (the min cut breaks ties by node
    name: with a name that probe's nodes had shifted, Llama's layer norm saved ``rstd/32``
    where the plain graph saves ``rstd``), then probe's nodes put back into the forward it
    returns. So what the forward saves and what the backward recomputes are chosen as for
    the graph without probe (probe's reductions of a tensor made the partitioner save it
    rather than recompute it). Where probe's nodes cannot be taken out cleanly (a model
    node reads one), the partitioner runs on the graph as it is; the comparison of the
    forwards (:class:`Partitions`) then decides."""
    def partition_fn(joint, joint_inputs, *args, num_fwd_outputs, **kwargs):
        if plain:
            partitions.joint_nodes = [(n.name, n.op, str(n.target)) for n in joint.graph.nodes]
            partitions.forward_outputs = [o.name if isinstance(o, torch.fx.Node) else repr(o)
                                          for o in _leaves(joint.graph.output_node())[:num_fwd_outputs]]
            return partition(joint, joint_inputs, *args, num_fwd_outputs=num_fwd_outputs, **kwargs)
        try:
            taken = _without_probes(joint, num_fwd_outputs, partitions.joint_nodes, partitions.forward_outputs)
        except Exception as exc:   # probe's bug: partitioned as it is, the forwards' comparison decides
            log.debug("probe: taking probe's nodes out of a joint graph failed (%s: %s)", type(exc).__name__, exc)
            taken = None
        if taken is None:
            return partition(joint, joint_inputs, *args, num_fwd_outputs=num_fwd_outputs, **kwargs)
        bare, positions, names = taken
        try:
            fw, bw = partition(bare, joint_inputs, *args, num_fwd_outputs=num_fwd_outputs - len(positions),
                               **kwargs)
            _put_back(joint, fw, positions, names)
            partitions.probe_outputs = positions
        except Exception as exc:   # probe's bug, or a value probe reads the forward cannot compute
            log.debug("probe: partitioning without probe's nodes failed (%s: %s)", type(exc).__name__, exc)
            return partition(joint, joint_inputs, *args, num_fwd_outputs=num_fwd_outputs, **kwargs)
        return fw, bw
    return partition_fn


def _leaves(node):
    return pytree.arg_tree_leaves(*node.args)


def _without_probes(joint, num_fwd_outputs, plain, forward_outputs):
    """A copy of ``joint`` without probe's nodes, its other nodes named as the plain joint
    graph's (``plain``: each node's name, op and target), the positions of probe's
    outputs among its forward outputs (those that are not the plain graph's
    ``forward_outputs``), and each kept node's name in the copy; None where
    probe's nodes are read by the model's, or the rest is not the plain graph's.

    The rest may hold nodes the plain graph has not, that only probe's nodes read (an
    output of a tuple the model does not use, which probe summarises): they go with
    probe's."""
    graph = joint.graph
    ours = {n for n in graph.nodes if n.op != "output" and is_probes(n)}
    if not ours or plain is None:
        return None
    rest = [n for n in graph.nodes if n not in ours]
    matcher = difflib.SequenceMatcher(None, [(op, target) for _, op, target in plain], [(n.op, str(n.target)) for n in rest],
                                      autojunk=False)
    names: Dict[torch.fx.Node, str] = {}
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            names.update((n, p[0]) for n, p in zip(rest[j1:j2], plain[i1:i2]))
        elif tag == "insert":
            ours.update(rest[j1:j2])
        else:
            return None
    outs = _leaves(graph.output_node())
    # probe's outputs among the forward's: its own, and what AOT added for them (the base
    # of a detached tensor probe returns in tensor mode): all but the plain graph's outputs
    positions = []
    wanted = iter(forward_outputs or ())
    expected = next(wanted, None)
    for i, o in enumerate(outs[:num_fwd_outputs]):
        name = (names.get(o) if isinstance(o, torch.fx.Node) else repr(o)) if o not in ours else None
        if name is not None and name == expected:
            expected = next(wanted, None)
        else:
            positions.append(i)
    if expected is not None or not positions or any(o in ours for o in outs[num_fwd_outputs:]):
        return None
    for n in ours:   # read by probe's nodes and outputs only
        if any(u.op != "output" and u not in ours for u in n.users):
            return None
    bare_graph = torch.fx.Graph()
    env: Dict[torch.fx.Node, torch.fx.Node] = {}
    for n in graph.nodes:
        if n in ours:
            continue
        if n.op == "output":
            kept = [env[o] if isinstance(o, torch.fx.Node) else o for i, o in enumerate(outs) if i not in positions]
            out = bare_graph.output(kept)
            out.meta = dict(n.meta)
            desc = n.meta.get("desc")   # what each output is (torch 2.9+)
            if isinstance(desc, (list, tuple)) and len(desc) == len(outs):
                out.meta["desc"] = [d for i, d in enumerate(desc) if i not in positions]
            break
        copy = bare_graph.create_node(n.op, n.target, torch.fx.map_arg(n.args, env.__getitem__),
                                      torch.fx.map_arg(n.kwargs, env.__getitem__), names[n], n.type)
        if copy.name != names[n]:
            return None
        copy.meta = dict(n.meta)
        env[n] = copy
    bare = torch.fx.GraphModule(joint, bare_graph)
    bare.meta = dict(getattr(joint, "meta", {}))
    return bare, positions, names


def _put_back(joint, fw, positions, named):
    """Probe's nodes of ``joint`` copied into the forward ``fw`` before its output, what
    they read found by name (the partitioner keeps the joint graph's names, the plain
    one's here) or computed again; their outputs put back at ``positions``."""
    graph = fw.graph
    by_name = {n.name: n for n in graph.nodes}
    out = graph.output_node()
    env: Dict[torch.fx.Node, torch.fx.Node] = {}

    def get(n):
        if n in env:
            return env[n]
        if not is_probes(n) and named.get(n) in by_name:
            env[n] = by_name[named[n]]
            return env[n]
        for a in n.all_input_nodes:   # a value the forward does not keep: computed for probe
            get(a)
        if n.op == "placeholder":
            raise LookupError(n.name)
        with graph.inserting_before(out):
            env[n] = mark(graph.node_copy(n, lambda x: env[x]))
        return env[n]

    joint_outs = _leaves(joint.graph.output_node())
    ours = [get(joint_outs[i]) for i in positions]
    fw_outs = list(_leaves(out))
    for i, node in zip(positions, ours):
        fw_outs.insert(i, node)
    out.args = (fw_outs,)
    graph.lint()
    fw.recompile()


@contextlib.contextmanager
def partitioning(partitions: "Partitions", plain: bool):
    """Inductor's partitioner replaced by :func:`partitioned_without_probe` for a compile
    (``compile_fx`` looks it up as its module's global at each compile)."""
    import torch._inductor.compile_fx as cfx
    original = getattr(cfx, "min_cut_rematerialization_partition", None)
    if original is None:   # another torch: the comparison of the forwards still decides
        yield
        return
    cfx.min_cut_rematerialization_partition = partitioned_without_probe(original, partitions, plain)
    try:
        yield
    finally:
        cfx.min_cut_rematerialization_partition = original
