"""Gradients of one API call, w.r.t. its outputs and its inputs, caught without touching values.

Wrapping inputs in an identity ``autograd.Function`` (what module backward hooks and
msprobe do) changes the tensors the API receives: views of them can then no longer be
modified in place ("a view created inside a custom Function"), which is why msprobe users
delete ``transpose`` or ``__getitem__`` from its YAML. Here nothing is wrapped. After the
call, the autograd nodes the call created are found by walking back from its outputs'
``grad_fn`` until the edges that lead to its inputs; hooks on those nodes observe

* grads w.r.t. the outputs: pre-hooks on the output nodes,
* grads w.r.t. each input: post-hooks on the nodes with an edge into that input,
  reported in argument order (msprobe reports autograd-node order).

Hooks return None, so gradients are bitwise unchanged, and an error inside one is logged
once and swallowed: the user's ``backward()`` never sees it. A call's record is complete
when every hooked node has run, or at the end of the backward pass for nodes that never
run. An in-place API on a view reaches its input through the base (autograd rewrites the
graph with ``CopySlices``): the base's gradient is cut back to the view's geometry.
"""
import logging
import threading

import torch

from probe.hook_module.interceptor import state as _state
from probe.hook_module.torch_function_off import no_function_mode

log = logging.getLogger(__name__)
_MAX_NODES = 256          # a walk that goes further has left the call's own subgraph
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_reported: set = set()


class _quiet:
    """Inside a backward hook: probe's own tensor work is not intercepted (the function
    mode is still live there) and never raises into autograd. (``interceptor.guard``'s
    count, kept here directly: this runs several times per backward entry.)"""
    __slots__ = ("_mode",)

    def __enter__(self):
        self._mode = no_function_mode()
        self._mode.__enter__()
        _state.depth += 1

    def __exit__(self, kind, exc, tb):
        _state.depth -= 1
        self._mode.__exit__(None, None, None)
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            key = (kind, str(exc)[:80])
            if key not in _reported:
                _reported.add(key)
                log.warning("probe: recording a gradient failed (%s: %s); training is unaffected",
                            kind.__name__, exc)
            return True
        return False


class PendingGrads:
    """Grads gathered for one call while its backward runs."""
    __slots__ = ("out_grads", "in_raw", "waiting", "done", "seen_grad", "on_done", "lock")

    def __init__(self, n_out, n_in, waiting, seen_grad, on_done):
        self.out_grads = [None] * n_out
        self.in_raw = [None] * n_in   # summed over every edge into that input
        self.waiting = waiting
        self.done = False
        self.seen_grad = seen_grad
        self.on_done = on_done
        self.lock = threading.Lock()

    def add_input_grad(self, slots, grad):
        for i in slots:
            self.in_raw[i] = _add(self.in_raw[i], grad)

    def node_ran(self):
        with self.lock:
            self.waiting -= 1
            last = self.waiting == 0
        if last:
            self.finish()

    def finish(self):
        with self.lock:
            if self.done:
                return
            self.done = True
        with _quiet():
            seen = self.seen_grad
            in_grads = [None if g is None else seen(g) for g in self.in_raw]
            self.in_raw = None
            self.on_done(self.out_grads, in_grads)


def input_slots(args, kwargs):
    """The inputs of a call as backward entries number them: positional arguments then
    keyword tensors, a list/tuple argument giving one slot per element (None: no tensor)."""
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(x if isinstance(x, torch.Tensor) else None for x in a)
        else:
            out.append(a if isinstance(a, torch.Tensor) else None)
    for v in kwargs.values():
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


def output_slots(out):
    """One slot per top-level output (None: not a tensor)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o if isinstance(o, torch.Tensor) else None for o in out]
    return []


def _split_shared(links):
    """One tensor passed as several arguments (``x * x``) reaches a node through as many
    edges; give each argument its own edge, in order, when the counts agree."""
    for _, slots in links:
        if len(slots) > 1:
            break
    else:       # the common case: every edge leads to one argument
        return links
    groups = {}
    for k, slots in links:
        groups.setdefault(id(slots), []).append(k)
    out = []
    for k, slots in links:
        ks = groups[id(slots)]
        if len(slots) > 1 and len(ks) == len(slots):
            out.append((k, [slots[ks.index(k)]]))
        else:
            out.append((k, slots))
    return out


def _add(a, b):
    return b if a is None else a + b


class _SeqFloor(threading.local):
    # Highest autograd sequence number among nodes of earlier hooked calls: nodes at or
    # below it existed before the current call, so a walk never needs to enter them.
    value = -1


_seq_floor = _SeqFloor()


def edges_before(inputs):
    """Edges of the inputs that require grad, taken before the call (an in-place API
    rewrites them). Views also record their base's edge, with the view's geometry."""
    edges = {}
    leaves = {}
    bases = {}
    floor = _seq_floor.value
    for i, t in enumerate(inputs):
        if t is None or not t.requires_grad:
            continue
        fn = t.grad_fn
        if fn is None:
            leaves.setdefault(id(t), []).append(i)
            continue
        edges.setdefault((fn, t.output_nr), []).append(i)
        seq = fn._sequence_nr()
        if seq > floor:
            floor = seq
        if t._is_view():
            base = t._base
            if base.grad_fn is not None:
                bases.setdefault((base.grad_fn, base.output_nr), []).append((i, _geometry(t, base)))
    return edges, leaves, bases, floor


def _geometry(view, base):
    """Where ``view`` sits in ``base``: (size, stride, offset, the base's size and stride)."""
    return (tuple(view.shape), view.stride(), view.storage_offset() - base.storage_offset(),
            tuple(base.shape), base.stride())


def _cut(grad, geometry):
    """The view's part of a gradient w.r.t. its base (laid out as the base first, when
    autograd made it otherwise, so the view's strides find the right elements)."""
    size, stride, offset, base_size, base_stride = geometry
    if grad.stride() != base_stride:
        grad = torch.empty_strided(base_size, base_stride, dtype=grad.dtype,
                                   device=grad.device).copy_(grad)
    return grad.as_strided(size, stride, grad.storage_offset() + offset)


def _output_node(t, fn, floor):
    """(node, output_nr, view geometry) whose gradient is the gradient w.r.t. output ``t``.

    Usually t's own node.  A view that the call changed in place (``h[:, 1:3].mul_(2)``)
    made its base's node a new ``CopySlices``; the view's own node only runs if the view
    itself is used later, while the base's node always does: the output's gradient is
    that node's, cut to the view."""
    if t._is_view():
        base = t._base
        bfn = base.grad_fn
        if (bfn is not None and type(bfn).__name__ == "CopySlices"
                and floor < bfn._sequence_nr() < (1 << 63)):
            return bfn, base.output_nr, _geometry(t, base)
    return fn, t.output_nr, None


def hook_call(before, outputs, n_inputs, seen_grad, on_done, max_nodes=_MAX_NODES):
    """Hook the nodes one call created. ``before`` comes from :func:`edges_before`.

    ``seen_grad(grad)`` turns a gradient into what is kept (a summary, a CPU copy);
    ``on_done(out_grads, in_grads)`` gets the kept values in output / argument order,
    None where no gradient flowed. Returns the PendingGrads, or None when no output of
    the call requires grad.
    """
    edges, leaves, bases, floor = before
    out_nodes, passthrough = _output_nodes(outputs, edges, floor)
    if not out_nodes:
        return None
    walked = _boundary(out_nodes, edges, leaves, bases, floor, max_nodes)
    if walked is None:
        return None
    boundary, view_cuts = walked
    # With no node of its own to wait for (an output that is an input returned as is,
    # x.float() on a float tensor), the record completes when its output grads arrive.
    prehooked = [fn for fn in out_nodes if fn not in boundary]
    waiting = len(boundary) if boundary else len(prehooked)
    pending = PendingGrads(len(outputs), n_inputs, waiting, seen_grad, on_done)
    _register(pending, out_nodes, passthrough, boundary, view_cuts, seen_grad)
    return pending


def _output_nodes(outputs, edges, floor):
    """The nodes that made the call's outputs: {node: [(output_nr, output index, view
    geometry or None)]}, and (output index, [input indices]) for outputs that are an
    input unchanged. Raises the sequence floor past them."""
    out_nodes: dict = {}
    passthrough = []
    for j, t in enumerate(outputs):
        if t is not None and t.requires_grad:
            fn = t.grad_fn
            if fn is None:  # a leaf returned as is (e.g. x.float() on a float leaf)
                continue
            fn, nr, cut = _output_node(t, fn, floor)
            out_nodes.setdefault(fn, []).append((nr, j, cut))
            slots = edges.get((fn, nr)) if cut is None else None
            if slots is not None:
                passthrough.append((j, slots))
    for fn in out_nodes:
        seq = fn._sequence_nr()
        if _seq_floor.value < seq < (1 << 63):
            _seq_floor.value = seq
    return out_nodes, passthrough


def _boundary(out_nodes, edges, leaves, bases, floor, max_nodes):
    """The call's own nodes that lead to its inputs: ({node: [(position in
    next_functions, [input indices])]}, {node: [(position, [(input index, view geometry)])]}
    for inputs changed in place through a view); None past ``max_nodes`` nodes."""
    boundary = {}
    input_nodes = {node for node, _ in edges}
    views_links = []  # (node, position, [(input index, view geometry)]): in-place on a view
    stack = []
    seen = set()
    for fn in out_nodes:
        if fn not in input_nodes:
            stack.append(fn)
            seen.add(fn)
    while stack:
        node = stack.pop()
        links = []
        for k, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            slots = edges.get((nxt, nr))
            if slots is None and leaves:
                var = getattr(nxt, "variable", None)
                if var is not None:
                    slots = leaves.get(id(var))
            if slots is not None:
                links.append((k, slots))
                continue
            views = bases.get((nxt, nr)) if bases else None
            if views is not None:
                views_links.append((node, k, views))
                continue
            if nxt in seen or nxt._sequence_nr() <= floor or not hasattr(nxt, "next_functions"):
                continue
            if len(seen) >= max_nodes:
                return None
            seen.add(nxt)
            stack.append(nxt)
        if links:
            boundary[node] = _split_shared(links)
    view_cuts: dict = {}
    for node, k, views in views_links:
        boundary.setdefault(node, [])
        view_cuts.setdefault(node, []).append((k, views))
    return boundary, view_cuts


def _register(pending, out_nodes, passthrough, boundary, view_cuts, seen_grad):
    """The hooks that feed ``pending``: a pre-hook on each output node outside the
    boundary (its output gradients), a post-hook on each boundary node (input gradients,
    and its output gradients when it made an output too)."""
    queued = []

    def ensure_finish_queued():
        # Nodes that never run (no gradient reached them) must not hold the record back.
        if not queued:
            queued.append(True)
            try:
                _queue_callback(pending.finish)
            except RuntimeError:  # not inside a backward pass
                pass

    def take_outputs(grads, outs):
        for nr, j, cut in outs:
            g = grads[nr]
            if g is not None and cut is not None:      # a view changed in place: its
                g = _cut(g, cut)                        # part of the base's gradient
            if g is not None:
                pending.out_grads[j] = seen_grad(g)
                for jj, slots in passthrough:
                    if jj == j:
                        pending.add_input_grad(slots, g)

    for fn, outs in out_nodes.items():
        if fn in boundary:
            continue  # its post-hook sees the output grads too: one hook instead of two

        def pre_hook(grad_outputs, outs=outs):
            with _quiet():
                ensure_finish_queued()
                take_outputs(grad_outputs, outs)
            if not boundary:
                pending.node_ran()
        fn.register_prehook(pre_hook)

    for node, links in boundary.items():
        def post_hook(grad_inputs, grad_outputs, links=links, outs=out_nodes.get(node),  # noqa: B008
                      cuts=view_cuts.get(node, ())):  # noqa: B008  (bound once: the hook runs per gradient)
            with _quiet():
                ensure_finish_queued()
                if outs is not None:
                    take_outputs(grad_outputs, outs)
                for k, slots in links:
                    g = grad_inputs[k]
                    if g is not None:
                        pending.add_input_grad(slots, g)
                for k, views in cuts:
                    g = grad_inputs[k]
                    if g is not None:
                        for i, geometry in views:
                            pending.add_input_grad((i,), _cut(g, geometry))
            pending.node_ran()
        node.register_hook(post_hook)
