"""Backward-error origin: which forward API made the autograd node that failed?

When ``loss.backward()`` raises, or returns NaN/Inf gradients from a finite forward, the
error points into the autograd engine, not at the forward line that built the failing
node; the usual answer, ``torch.autograd.detect_anomaly()`` over the whole job, is slow
and needs a rerun. Here the forward side keeps a cheap map instead: after each
registered call (and custom op) that made autograd nodes, those nodes get the entry
name, the stack (code objects and line numbers, formatted only if reported) and the
module chain in ``node.metadata`` and two hooks:

* a pre-hook marks the node running, a post-hook marks it done: when backward raises,
  the node still running is the one that failed;
* the post-hook checks that the gradients it produced are finite; a node whose incoming
  gradients were finite and whose produced ones are not is where the NaN/Inf was born.
  The flags stay on the device until the end of the backward pass (one host fetch).

Reports go to the console and ``{dump_path}/backward_origin.json``: the entry
(``Torch.sqrt.0.forward``), the node (``SqrtBackward0``), the forward stack and module
path, the exception or which gradients are non-finite. The user's exception is not
touched. To see backward exceptions at all, ``torch.autograd.backward`` and
``torch.autograd.grad`` (which ``Tensor.backward`` calls) are wrapped while a tracker
is enabled; ``disable`` puts them back.

    from probe.forensics import backward_origin
    backward_origin.enable(debugger)
"""
import functools
import itertools
import os
import threading
import weakref

import torch

from probe.forensics import hub as _hub
from probe.forensics.evidence import format_frames, log, log_once, module_path, user_line, write_json
from probe.tensor_tree import flat_tensors

_MAX_NODES = 256           # a walk that goes further has left the call's own subgraph
_KEY = "probe_forward_entry"
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
MAX_REPORTS = 100


class _Origin:
    """What is kept per forward call that made nodes (no node references: no cycles)."""
    __slots__ = ("entry", "frames", "modules", "outputs")

    def __init__(self, entry, frames, modules, outputs):
        self.entry, self.frames, self.modules, self.outputs = entry, frames, modules, outputs


class _Tag:
    __slots__ = ("token", "node", "origin")

    def __init__(self, token, node_name, origin):
        self.token, self.node, self.origin = token, node_name, origin


class BackwardOrigin(_hub.Feature):
    """The backward-origin feature of a :class:`~probe.forensics.hub.ForensicsHandler`."""

    def __init__(self, report_path_fn, check_nonfinite=True, console=True):
        self.report_path_fn = report_path_fn
        self.check_nonfinite = check_nonfinite
        self.console = console
        self.reports = []
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._running = {}         # token -> _Tag: started, not finished
        self._last_done = None
        self._flags = []           # (tag, incoming-finite flags, produced-finite flags, produced slots)
        self._queued = False
        self._console_seen = set()

    # ---- forward side -----------------------------------------------------------
    def before(self, call):
        if not torch.is_grad_enabled():
            return None
        nodes = set()
        floor = -1
        for t in flat_tensors((call.args, call.kwargs)):
            if t.requires_grad and t.grad_fn is not None:
                nodes.add(t.grad_fn)
                seq = t.grad_fn._sequence_nr()
                if seq > floor:
                    floor = seq
        return nodes, floor

    def after(self, call, state, out):
        if state is None:
            return
        outs = [t for t in flat_tensors(out) if t.requires_grad and t.grad_fn is not None]
        if not outs:
            return
        input_nodes, floor = state
        new = _new_nodes(outs, input_nodes, floor)
        if not new:
            return
        frames, modules = call.site()
        origin = _Origin(call.entry + ".forward", frames, modules, [_weak(t) for t in outs])
        for node in new:
            md = node.metadata
            if _KEY in md:
                continue
            tag = _Tag(next(self._tokens), type(node).__name__, origin)
            md[_KEY] = origin.entry
            node.register_prehook(self._pre_hook(tag))
            node.register_hook(self._post_hook(tag))

    # ---- backward side ----------------------------------------------------------
    def _pre_hook(self, tag):
        running = self._running

        def pre(grad_outputs):
            running[tag.token] = tag
        return pre

    def _post_hook(self, tag):
        def post(grad_inputs, grad_outputs):
            self._running.pop(tag.token, None)
            self._last_done = tag
            if self.check_nonfinite:
                try:
                    self._check(tag, grad_inputs, grad_outputs)
                except Exception as exc:
                    log_once("origin-check", "probe: backward NaN check failed (%s: %s); gradients are unaffected",
                             type(exc).__name__, exc)
        return post

    def _check(self, tag, grad_inputs, grad_outputs):
        from probe.hook_module.interceptor import guard
        produced = [(i, g) for i, g in enumerate(grad_inputs) if isinstance(g, torch.Tensor) and g.numel()]
        if not produced:
            return
        incoming = [g for g in grad_outputs if isinstance(g, torch.Tensor) and g.numel()]
        with guard(), torch.no_grad():
            out_ok = torch.stack([torch.isfinite(g).all() for _, g in produced])
            in_ok = torch.stack([torch.isfinite(g).all() for g in incoming]).all() if incoming else None
        with self._lock:
            self._flags.append((tag, in_ok, out_ok, [i for i, _ in produced]))
            first = not self._queued
            self._queued = True
        if first:
            try:
                _queue_callback(self._backward_done)
            except RuntimeError:    # not inside a backward pass
                with self._lock:
                    self._queued = False

    def _backward_done(self):
        with self._lock:
            flags, self._flags, self._queued = self._flags, [], False
        try:
            self._judge(flags)
        except Exception as exc:
            log_once("origin-judge", "probe: backward NaN check failed (%s: %s); gradients are unaffected",
                     type(exc).__name__, exc)

    def _judge(self, flags):
        if not flags:
            return
        from probe.hook_module.interceptor import guard
        with guard():
            outs = _fetch([f[2].all() for f in flags])
        if all(outs):
            return
        seen = set()
        for (tag, in_ok, out_ok, slots), ok in zip(flags, outs):
            if ok:
                continue
            with guard():
                incoming_finite = True if in_ok is None else bool(in_ok.item())
            if not incoming_finite or tag.origin.entry in seen:
                continue
            seen.add(tag.origin.entry)
            with guard():
                bad = [s for s, v in zip(slots, out_ok.tolist()) if not v]
            self._report("nonfinite", tag, {
                "message": f"{tag.node} produced non-finite gradients (inputs {bad} of the node) "
                           "from finite incoming gradients",
                "forward_output_finite": _outputs_finite(tag.origin)})

    # ---- exceptions -------------------------------------------------------------------
    def backward_failed(self, exc):
        """Called by the autograd wrappers when backward raises."""
        with self._lock:
            running = list(self._running.values())
            self._running.clear()
            self._flags, self._queued = [], False
        detail = {"exception": {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                                "message": str(exc)[:4000]}}
        if running:
            tag = running[-1]
            if len(running) > 1:
                detail["also_running"] = [f"{t.origin.entry} ({t.node})" for t in running[:-1]]
            self._report("exception", tag, detail)
        else:
            last = self._last_done
            detail["note"] = ("the failing node was not made by a registered API call while probe watched"
                              + (f"; the last node that finished was {last.node} of {last.origin.entry}"
                                 if last is not None else ""))
            self._report("exception", None, detail)
        self._last_done = None

    def backward_started(self):
        with self._lock:
            self._running.clear()
        self._last_done = None

    # ---- reporting ---------------------------------------------------------------
    def _report(self, kind, tag, detail):
        rec = {"kind": kind}
        if tag is not None:
            o = tag.origin
            rec.update({"entry": o.entry, "node": tag.node, "forward_stack": format_frames(o.frames),
                        **module_path(o.modules)})
        rec.update(detail)
        self.reports.append(rec)
        if len(self.reports) > MAX_REPORTS:
            del self.reports[0]
        key = (kind, rec.get("entry", "").rsplit(".", 2)[0], rec.get("node"))
        if self.console and key not in self._console_seen:
            self._console_seen.add(key)
            if tag is None:
                log.warning("probe backward origin: backward raised %s; %s", detail["exception"]["type"], detail["note"])
            else:
                what = (f"raised {detail['exception']['type']}" if kind == "exception" else "produced NaN/Inf")
                mod = rec.get("module_path")
                log.warning("probe backward origin: %s %s; it was made by %s at %s%s", tag.node, what, rec["entry"],
                            user_line(tag.origin.frames),
                            f" in module {mod or '(root)'} ({'/'.join(rec['module_classes'])})" if mod is not None else "")
        try:
            write_json(self.report_path_fn(), self.reports)
        except Exception as exc:
            log_once("origin-write", "probe: writing backward_origin.json failed: %s", exc)


def _fetch(flags):
    """Bools of 0-d flag tensors, in one host transfer per device."""
    try:
        return torch.stack(flags).tolist()
    except RuntimeError:          # flags on several devices
        return [bool(f.item()) for f in flags]


def _weak(t):
    try:
        return weakref.ref(t)
    except TypeError:
        return None


def _outputs_finite(origin):
    """Whether the forward outputs, if still alive, were finite (None: unknown)."""
    from probe.hook_module.interceptor import guard
    alive = [r() for r in origin.outputs if r is not None]
    alive = [t for t in alive if t is not None]
    if not alive:
        return None
    with guard(), torch.no_grad():
        return all(bool(torch.isfinite(t.detach()).all()) for t in alive)


def _new_nodes(outs, input_nodes, floor):
    """Autograd nodes the call made: from its outputs back to its inputs' nodes."""
    found = []
    seen = set()
    stack = []
    for t in outs:
        fn = t.grad_fn
        if fn in input_nodes or fn in seen:
            continue
        seq = fn._sequence_nr()
        if seq <= floor or seq >= 1 << 63:
            continue
        seen.add(fn)
        stack.append(fn)
    while stack:
        node = stack.pop()
        found.append(node)
        for nxt, _ in node.next_functions:
            if nxt is None or nxt in seen or nxt in input_nodes:
                continue
            seq = nxt._sequence_nr()
            if seq <= floor or seq >= 1 << 63 or not nxt.next_functions and type(nxt).__name__ == "AccumulateGrad":
                continue
            if len(seen) >= _MAX_NODES:
                return found
            seen.add(nxt)
            stack.append(nxt)
    return found


# ---- the autograd entry points ----------------------------------------------------------
_trackers: list = []         # enabled BackwardOrigin features
_originals: dict = {}
_state = threading.local()


def _wrap(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getattr(_state, "depth", 0):
            return fn(*args, **kwargs)
        _state.depth = 1
        for t in list(_trackers):
            t.backward_started()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            for t in list(_trackers):
                try:
                    t.backward_failed(exc)
                except Exception as err:
                    log_once("origin-failed", "probe: backward origin report failed (%s: %s)", type(err).__name__, err)
            raise
        finally:
            _state.depth = 0
    wrapper._probe_original = fn
    return wrapper


def _patch():
    if _originals:
        return
    for name in ("backward", "grad"):
        fn = getattr(torch.autograd, name)
        _originals[name] = fn
        setattr(torch.autograd, name, _wrap(fn))


def _unpatch():
    for name, fn in _originals.items():
        current = getattr(torch.autograd, name)
        if getattr(current, "_probe_original", None) is fn:
            setattr(torch.autograd, name, fn)
    _originals.clear()


def track(feature):
    """Start receiving backward exceptions for ``feature``."""
    if feature not in _trackers:
        _trackers.append(feature)
    _patch()


def untrack(feature):
    if feature in _trackers:
        _trackers.remove(feature)
    if not _trackers:
        _unpatch()


class OriginTracker(_hub.ForensicsHandler):
    """A handler wrapper with the tracker only: ``OriginTracker(handler, lambda: "origin.json")``."""

    def __init__(self, handler, report_path_fn, namer=None, **options):
        super().__init__(handler, namer, [BackwardOrigin(report_path_fn, **options)])
        track(self.features[0])

    @property
    def tracker(self):
        return self.features[0]


def enable(debugger, check_nonfinite=True):
    """Track backward failures of a debugger's run; reports go to ``{dump_path}/backward_origin.json``."""
    h = _hub.hub(debugger)
    feature = h.get(BackwardOrigin)
    if feature is None:
        feature = h.add(BackwardOrigin(lambda: os.path.join(debugger.config.dump_path, "backward_origin.json"),
                                       check_nonfinite=check_nonfinite))
    feature.check_nonfinite = check_nonfinite
    track(feature)
    return feature


def disable(debugger):
    h = _hub.hub(debugger)
    feature = h.get(BackwardOrigin)
    if feature is not None:
        untrack(feature)
    h.remove(BackwardOrigin)
