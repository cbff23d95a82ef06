"""One interceptor handler for every forensics feature, and the one place that touches the debugger.

The interceptor calls ``handler(name, func, args, kwargs)`` for each registered call.
:class:`ForensicsHandler` wraps the debugger's handler (the dump collector) and gives
each enabled feature three moments: ``before`` the call, ``after`` it with the result,
``failed`` with the API's exception. A feature failing is logged once and ignored; the
API's exception is re-raised as the same object; the result is returned untouched.

Custom ops (``torch.library``, torch_npu's ``torch.ops.npu.*``, vLLM's kernels) are where
kernels crash and meta functions disagree. Those the registry's ``custom`` section selects
(every namespace torch does not ship, by default) are registered APIs, dumped as
``Custom.{namespace}.{op}[.{overload}]``. The others still reach the features under that
name, while a feature is on, as a :class:`WatchedOnly` name: they are not handed to the
collector, so dump.json is the same as without forensics.

Composition: ``PrecisionDebugger`` builds its chain once, at construction: the
interceptor (registered APIs, and custom ops through :func:`with_custom_ops`) calls
``debugger.forensics`` (a :class:`ForensicsHandler`), which calls the dump collector
(filter and entries). Features join ``debugger.forensics`` through their ``enable``;
nothing is swapped or patched later.
"""
import threading

from probe.forensics.evidence import capture, log_once
from probe.hook_module.custom_ops import custom_op_name
from probe.hook_module.registry import FuncNames
from probe.hook_module.torch_function_off import no_function_mode


class WatchedOnly(str):
    """The name of a custom op the registry does not dump: features see it, the
    collector never does."""
    __slots__ = ()


class WithCustomOps(FuncNames):
    """The registry's ``by_func`` that also names the custom ops it does not dump (looked
    up on first sight), as :class:`WatchedOnly` names."""

    def name_unknown(self, func):
        name = super().name_unknown(func)
        if name is None:
            name = custom_op_name(func)
            return None if name is None else WatchedOnly(name)
        return name

    def get(self, func, default=None):
        """What is dumped (compiled graphs look names up here): no watched-only op."""
        name = super().get(func, default)
        return default if type(name) is WatchedOnly else name


class Call:
    """One intercepted call as features see it; ``entry`` is named on first use."""
    __slots__ = ("name", "func", "args", "kwargs", "_entry", "_namer", "_site")

    def __init__(self, name, func, args, kwargs, namer):
        self.name, self.func, self.args, self.kwargs = name, func, args, kwargs
        self._entry = None
        self._namer = namer
        self._site = None

    @property
    def entry(self):
        """'Functional.linear.3' — valid once the inner handler has run (it counts)."""
        if self._entry is None:
            self._entry = self._namer(self.name)
        return self._entry

    def site(self):
        """(frames, modules) of the user's call, captured once per call."""
        if self._site is None:
            self._site = capture(2)
        return self._site


class Namer:
    """Entry names as the dump names them.

    Registered APIs: the counter of the wrapped handler (the dump collector, or whatever
    handler the debugger uses at its level, as long as it keeps ``counters``), so a crash
    dump or report names the same entry as dump.json. Custom ops, or a handler without
    counters: a counter here, restarted when the debugger's step changes.
    """

    def __init__(self, debugger=None):
        self._debugger = debugger
        self.source = None         # the wrapped handler, if it counts calls
        self._counts = {}
        self._step = None
        self._lock = threading.Lock()

    def count(self, name):
        """Called once per call the wrapped handler does not count."""
        step = getattr(self._debugger, "current_step", None)
        with self._lock:
            if step != self._step:
                self._step = step
                self._counts.clear()
            n = self._counts.get(name, 0)
            self._counts[name] = n + 1
        return n

    def last(self, name):
        with self._lock:
            return self._counts.get(name, 1) - 1

    def collector_counts(self, name):
        """True when the wrapped handler counts ``name``."""
        return type(name) is not WatchedOnly and isinstance(getattr(self.source, "counters", None), dict)

    def __call__(self, name):
        if self.collector_counts(name):
            n = self.source.counters.get(name)
            if n:
                return f"{name}.{n - 1}"
        return f"{name}.{self.last(name)}"


class ForensicsHandler:
    """Interceptor handler: runs the wrapped handler and lets features watch the call."""
    _probe_forensics = True

    def __init__(self, inner, namer=None, features=()):
        self.inner = inner
        self.namer = namer or Namer()
        self.namer.source = inner
        self.features = list(features)
        self._inner_counts = self.namer.collector_counts("")   # counts registered APIs itself

    def add(self, feature):
        for f in self.features:
            if type(f) is type(feature):
                return f
        self.features.append(feature)
        return feature

    def remove(self, cls):
        self.features = [f for f in self.features if not isinstance(f, cls)]

    def get(self, cls):
        return next((f for f in self.features if isinstance(f, cls)), None)

    def __call__(self, name, func, args, kwargs):
        features = self.features
        custom = type(name) is WatchedOnly
        if not features:
            return func(*args, **kwargs) if custom else self.inner(name, func, args, kwargs)
        if custom or not self._inner_counts:
            self.namer.count(name)
        if len(features) == 1 and features[0].failure_only:
            # The common case (crash dumps alone) runs on every call: no Call object and no
            # feature loop unless the API raises.
            feature = features[0]
            try:
                with no_function_mode():     # unseen by the user's own modes
                    state = feature.before_fast(args)
            except Exception:
                state = None
            try:
                return func(*args, **kwargs) if custom else self.inner(name, func, args, kwargs)
            except Exception as exc:
                self._report_failure(feature, state, name, func, args, kwargs, exc)
                raise
        call = Call(name, func, args, kwargs, self.namer)
        states = []
        for f in features:
            try:
                states.append((f, f.before(call)))
            except Exception as exc:
                log_once((type(f), "before"), "probe: %s failed before %s (%s: %s); the call is unaffected",
                         type(f).__name__, name, type(exc).__name__, exc)
        try:
            out = func(*args, **kwargs) if custom else self.inner(name, func, args, kwargs)
        except Exception as exc:
            for f, s in states:
                try:
                    f.failed(call, s, exc)
                except Exception as err:
                    log_once((type(f), "failed"), "probe: %s could not record %s's exception (%s: %s)",
                             type(f).__name__, name, type(err).__name__, err)
            raise
        for f, s in states:
            try:
                f.after(call, s, out)
            except Exception as exc:
                log_once((type(f), "after"), "probe: %s failed after %s (%s: %s); the result is unaffected",
                         type(f).__name__, name, type(exc).__name__, exc)
        return out

    def _report_failure(self, feature, state, name, func, args, kwargs, exc):
        try:
            feature.failed(Call(name, func, args, kwargs, self.namer), state, exc)
        except Exception as err:
            log_once((type(feature), "failed"), "probe: %s could not record %s's exception (%s: %s)",
                     type(feature).__name__, name, type(err).__name__, err)


class Feature:
    """Base of the forensics features: every moment is optional."""
    failure_only = False   # True: acts only when the API raises; provides ``before_fast(args)``

    def before(self, call):
        return None

    def after(self, call, state, out):
        pass

    def failed(self, call, state, exc):
        pass


# ---- composition ---------------------------------------------------------------------
def with_custom_ops(resolved):
    """``resolved`` (a registry from ``registry.resolve``) whose ``by_func`` also names
    custom ops; done before an Interceptor is made from it, so its mode sees the table."""
    if not isinstance(resolved.by_func, WithCustomOps):
        names = WithCustomOps(resolved.by_func)
        names.custom = resolved.custom
        resolved.by_func = names
    return resolved


def hub(debugger):
    """The debugger's :class:`ForensicsHandler` (``debugger.forensics``), built with the
    debugger: features are added to it with ``add``, before or after ``start()``."""
    return debugger.forensics
