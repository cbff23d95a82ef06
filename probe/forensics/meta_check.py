"""Meta check: does the meta (fake-tensor) function infer what the kernel returns?

Graph mode (torch.compile, Ascend graph mode) trusts an op's meta function for output
dtype, shape and stride; a custom op whose meta says bf16 while its kernel writes fp32
fails later as "Check output size failed", far from the op. Here each registered API
call, and each custom op (``torch.library`` / ``torch.ops.<ns>``), is run a second time
on FakeTensor copies of its inputs, and the inferred outputs are compared with the real
ones. Mismatches go to the console and ``meta_check.json`` with the op, both results
and the user's stack.

The fake run does no real work and leaves the RNG alone; fakes are made before the
call (an in-place op would otherwise be checked on its own result), in a fresh
FakeTensorMode each time (a reused one caches metadata a later ``resize_`` makes stale).
A call seen before with the same input metadata is not rerun: its fake result is
reused, so a training loop pays for the fake run once per distinct call.

    from probe.forensics import meta_check
    meta_check.enable(debugger)                     # or: probe meta-check train.py args
"""
import os
import threading

import torch

from probe.forensics import hub as _hub
from probe.forensics.evidence import format_frames, log, module_path, user_line, write_json
from probe.tensor_tree import flat_tensors, map_tensors

_SKIP_REASONS = (
    ("DynamicOutputShapeException", "output shape depends on the data"),
    ("DataDependentOutputException", "output depends on the data"),
    ("UnsupportedOperatorException", "no meta/fake implementation"),
)
MAX_RECORDS = 200


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=False)


def _meta(t):
    return {"dtype": str(t.dtype), "shape": list(t.shape), "stride": _stride(t)}


def _stride(t):
    try:
        return list(t.stride())
    except (RuntimeError, NotImplementedError):
        return None


def _strides_differ(real, fake):
    """Strides that matter: dims of size 1 (or empty tensors) have no meaningful stride."""
    rs, fs = _stride(real), _stride(fake)
    if rs is None or fs is None or real.numel() <= 1:
        return False
    return any(a != b for a, b, n in zip(rs, fs, real.shape) if n > 1)


class _Key:
    """Hashable metadata of a call's inputs (values never matter to a meta function)."""

    @staticmethod
    def of(func, args, kwargs):
        try:
            key = (func, _Key._v(args), _Key._v(kwargs), _autocast_state())
            hash(key)
            return key
        except TypeError:
            return None

    @staticmethod
    def _v(v):
        if isinstance(v, torch.Tensor):
            return ("T", v.dtype, tuple(v.shape), _stride(v) and tuple(v.stride()), v.device,
                    v.requires_grad, v.layout, v.storage_offset() if v.layout == torch.strided else 0)
        if isinstance(v, (list, tuple)):
            return (type(v).__name__,) + tuple(_Key._v(x) for x in v)
        if isinstance(v, dict):
            return ("d",) + tuple((k, _Key._v(x)) for k, x in v.items())
        if isinstance(v, float) and v != v:
            return ("nan",)
        return v


def _autocast_state():
    out = []
    for dev in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(dev):
                out.append((dev, torch.get_autocast_dtype(dev)))
        except (RuntimeError, TypeError, AttributeError):
            pass
    return tuple(out)


class MetaCheck(_hub.Feature):
    """The meta-check feature of a :class:`~probe.forensics.hub.ForensicsHandler`."""

    def __init__(self, out_path_fn, check_stride=True, console=True):
        self.out_path_fn = out_path_fn
        self.check_stride = check_stride
        self.console = console
        self.checked = 0
        self.mismatches = {}     # signature -> record
        self.errors = {}         # (api, message) -> record
        self.skipped = {}        # reason -> {api: count}
        self._cache = {}         # input key -> fake outputs' metadata, or ("skip", reason)
        self._lock = threading.Lock()

    # ---- the handler moments ---------------------------------------------------
    def before(self, call):
        key = _Key.of(call.func, call.args, call.kwargs)
        hit = self._cache.get(key) if key is not None else None
        if hit is not None:
            return key, hit, None
        mode = _fake_mode()
        conv = lambda t: mode.from_tensor(t)
        try:
            fargs = map_tensors(conv, call.args)
            fkwargs = map_tensors(conv, call.kwargs)
        except Exception as exc:
            return key, ("skip", f"inputs cannot be faked ({type(exc).__name__})"), None
        return key, None, (mode, fargs, fkwargs)

    def after(self, call, state, out):
        if state is None:
            return
        real = flat_tensors(out)
        if not real:
            return
        key, hit, fakes = state
        if hit is None:
            hit = self._fake_run(call, fakes)
            if key is not None:
                with self._lock:
                    if len(self._cache) < 100_000:
                        self._cache[key] = hit
        with self._lock:
            self.checked += 1
        if hit[0] == "skip":
            with self._lock:
                per = self.skipped.setdefault(hit[1], {})
                per[call.name] = per.get(call.name, 0) + 1
            return
        if hit[0] == "error":
            self._error(call, hit[1])
            return
        self._compare(call, real, hit[1])

    # ---- the fake run --------------------------------------------------------
    def _fake_run(self, call, fakes):
        mode, fargs, fkwargs = fakes
        try:
            with torch.no_grad(), mode:
                fout = call.func(*fargs, **fkwargs)
        except Exception as exc:
            name = type(exc).__name__
            for cls, reason in _SKIP_REASONS:
                if name == cls:
                    return ("skip", reason)
            return ("error", f"{name}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}")
        return ("ok", [_meta(x) for x in flat_tensors(fout)])

    def _compare(self, call, real, fake):
        diffs = []
        if len(fake) != len(real):
            diffs.append({"index": None, "kernel": f"{len(real)} tensor outputs",
                          "meta": f"{len(fake)} tensor outputs", "differs": ["count"]})
        for i, (r, f) in enumerate(zip(real, fake)):
            kinds = []
            if str(r.dtype) != f["dtype"]:
                kinds.append("dtype")
            if list(r.shape) != f["shape"]:
                kinds.append("shape")
            elif self.check_stride and f["stride"] is not None and _stride(r) is not None and r.numel() > 1 and any(
                    a != b for a, b, n in zip(_stride(r), f["stride"], r.shape) if n > 1):
                kinds.append("stride")
            if kinds:
                diffs.append({"index": i, "kernel": _meta(r), "meta": f, "differs": kinds})
        if diffs:
            self._mismatch(call, diffs)

    # ---- reporting ---------------------------------------------------------------
    def _signature(self, call, diffs):
        return (call.name, tuple((d["index"], tuple(d["differs"]), str(d["kernel"]), str(d["meta"])) for d in diffs))

    def _mismatch(self, call, diffs):
        sig = self._signature(call, diffs)
        with self._lock:
            rec = self.mismatches.get(sig)
            if rec is not None:
                rec["count"] += 1
                return
            if len(self.mismatches) >= MAX_RECORDS:
                return
        frames, modules = call.site()
        inputs = [_meta(t) for t in flat_tensors((call.args, call.kwargs))]
        rec = {"entry": call.entry + ".forward", "api": call.name, "op": _op_name(call.func),
               "outputs": diffs, "inputs": inputs, "count": 1,
               "stack": format_frames(frames), **module_path(modules)}
        with self._lock:
            self.mismatches[sig] = rec
        if self.console:
            for d in diffs:
                what = "/".join(d["differs"])
                log.warning("probe meta check: %s (%s): output %s %s differs: kernel %s, meta %s; called at %s",
                            rec["entry"], rec["op"], d["index"], what, _short(d["kernel"]), _short(d["meta"]),
                            user_line(frames))
        self.flush()

    def _error(self, call, message):
        key = (call.name, message)
        with self._lock:
            rec = self.errors.get(key)
            if rec is not None:
                rec["count"] += 1
                return
            if len(self.errors) >= MAX_RECORDS:
                return
            frames, _ = call.site()
            self.errors[key] = {"entry": call.entry + ".forward", "api": call.name, "op": _op_name(call.func),
                                "message": message, "count": 1, "stack": format_frames(frames)}

    def report(self):
        with self._lock:
            return {"checked_calls": self.checked,
                    "mismatches": list(self.mismatches.values()),
                    "meta_errors": list(self.errors.values()),
                    "skipped": {k: dict(v) for k, v in self.skipped.items()}}

    def flush(self):
        """Write meta_check.json (also done at each new mismatch)."""
        path = self.out_path_fn()
        write_json(path, self.report())
        return path


def _short(m):
    if isinstance(m, dict):
        return f"{m['dtype'].replace('torch.', '')}{m['shape']} stride {m['stride']}"
    return str(m)


def _op_name(func):
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    mod = getattr(func, "__module__", None)
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(func)
    return f"{mod}.{name}" if mod and name else str(func)


class MetaChecker(_hub.ForensicsHandler):
    """A handler wrapper with the meta check only: ``MetaChecker(handler, lambda: "meta_check.json")``."""

    def __init__(self, handler, out_path_fn, namer=None, **options):
        super().__init__(handler, namer, [MetaCheck(out_path_fn, **options)])

    @property
    def check(self):
        return self.features[0]


def enable(debugger, check_stride=True):
    """Meta-check every registered call (and custom op) of a debugger; report to
    ``{dump_path}/meta_check.json``. Returns the :class:`MetaCheck`."""
    h = _hub.hub(debugger)
    feature = h.get(MetaCheck)
    if feature is None:
        feature = h.add(MetaCheck(lambda: os.path.join(debugger.config.dump_path, "meta_check.json"),
                                  check_stride=check_stride))
        _at_exit(feature)
    return feature


def disable(debugger):
    h = _hub.hub(debugger)
    feature = h.get(MetaCheck)
    if feature is not None:
        feature.flush()
    h.remove(MetaCheck)


def _at_exit(feature):
    import atexit
    import weakref
    ref = weakref.ref(feature)

    def flush():
        f = ref()
        if f is not None and f.checked:
            try:
                f.flush()
            except Exception as exc:
                log.warning("probe: writing meta_check.json failed: %s", exc)
    atexit.register(flush)


def run_script(path, argv=(), out="meta_check.json", wrap_ops_yaml=None, check_stride=True):
    """Run a Python script under the meta checker (``probe meta-check``); returns the MetaCheck.

    The script's own exception propagates after meta_check.json is written.
    """
    import runpy
    import sys

    from probe.hook_module.interceptor import Interceptor
    from probe.hook_module.registry import load_registry, resolve

    checker = MetaChecker(_passthrough, lambda: out, check_stride=check_stride)
    interceptor = Interceptor(_hub.with_custom_ops(resolve(load_registry(wrap_ops_yaml))), checker)
    old_argv = sys.argv
    sys.argv = [path] + list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    interceptor.start()
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finally:
        interceptor.stop()
        sys.argv = old_argv
        if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(path)):
            sys.path.pop(0)
        checker.check.flush()
    return checker.check


def _passthrough(name, func, args, kwargs):
    return func(*args, **kwargs)
