"""What every live tool shares: start()/stop() and ``with``, the YAML registry, list filters,
``condition_func``, per-API call ids, failures logged once, and tensor-tree helpers.

A tool is the handler of an :class:`~probe.hook_module.interceptor.Interceptor` of its own,
so it sees exactly the calls a dump sees (same registry, outermost call only). Its own
torch work runs under ``guard()`` and is never intercepted.
"""
import csv
import logging
import os
import time
from typing import Optional

import torch

from probe import console_log
from probe.hook_module import grad_capture
from probe.hook_module.interceptor import Interceptor, guard
from probe.hook_module.operators import unpatched
from probe.hook_module.registry import load_registry, resolve
from probe.log_once import LogOnce
from probe.tensor_tree import flat_tensors, map_tensors  # noqa: F401  (the tools' names)
from probe.toolbox import options

log = logging.getLogger(__name__)

_RESOLVED: dict = {}  # yaml path -> ResolvedRegistry (resolving walks ~1,500 names: once per process)

_ALIAS_PREFIX = {
    "Functional": ("torch.nn.functional.", "F."),
    "Tensor": ("torch.Tensor.",),
    "Torch": ("torch.",),
    "NPU": ("torch_npu.",),
    "Distributed": ("torch.distributed.", "dist."),
    "VF": ("torch._VF.",),
    "Aten": ("torch.ops.aten.",),
}

# Calls with no numbers to check, change or time; never handled unless listed explicitly.
NON_NUMERIC = frozenset({"to", "type_as", "contiguous", "__getitem__", "view", "view_as",
                         "reshape", "expand", "expand_as", "flatten", "unflatten", "squeeze",
                         "unsqueeze", "permute", "transpose", "t", "narrow", "split", "chunk",
                         "unbind", "select", "as_strided", "resize_", "resize_as_", "squeeze_",
                         "unsqueeze_", "t_", "transpose_", "swapdims_", "swapaxes_",
                         "as_strided_", "set_", "record_stream", "requires_grad_"})


def resolved_registry(yaml_path=None):
    key = os.path.abspath(yaml_path) if yaml_path else None
    reg = _RESOLVED.get(key)
    if reg is None:
        reg = _RESOLVED[key] = resolve(load_registry(yaml_path))
    return reg


def aliases(name):
    """``Functional.linear`` -> every spelling users write for it."""
    prefix, _, attr = name.partition(".")
    return (name, attr) + tuple(p + attr for p in _ALIAS_PREFIX.get(prefix, ()))


def func_table(resolved):
    """API name -> the callable to run it (for replay)."""
    table = {}
    for func, name in resolved.by_func.named():
        table.setdefault(name, func)
    for attr, name in resolved.dunders.items():
        table.setdefault(name, unpatched(attr))   # past a debugger's patch
    for owner, attr, name in resolved.patched:
        f = getattr(owner, attr, None)
        if f is not None:
            table.setdefault(name, getattr(f, "__probe_original__", f))
    return table


class NameFilter:
    """Include / exclude lists decided once per API name and cached."""

    def __init__(self, include=None, exclude=None, default_exclude=NON_NUMERIC):
        self.include = options.compile_patterns(include)
        self.exclude = options.compile_patterns(exclude)
        self.default_exclude = default_exclude
        self.explicit = include is not None
        self._cache = {}

    def wants(self, name):
        hit = self._cache.get(name)
        if hit is None:
            hit = self._cache[name] = self._decide(name)
        return hit

    def _decide(self, name):
        names = aliases(name)
        if any(p.search(n) for p in self.exclude for n in names):
            return False
        if self.include:
            return any(p.search(n) for p in self.include for n in names)
        return name.rsplit(".", 1)[-1] not in self.default_exclude


class ToolBase:
    """start()/stop(), ``with``, filters and call ids; subclasses implement :meth:`handle`.

    ``ops`` / ``disable_ops``: lists (or comma-separated strings) of names; when not given,
    the tool's ``OP_<X>_LIST`` / ``OP_<X>_DISABLE_LIST`` environment variables apply.
    ``condition_func(*args, **kwargs)`` sees each selected call's real arguments and
    returns whether to handle it. ``yaml_path``: the API registry (default: packaged).
    """
    feature = "tool"
    env_list: Optional[str] = None          # e.g. "OP_AUTOCOMPARE_LIST"
    env_disable_list: Optional[str] = None

    def __init__(self, ops=None, disable_ops=None, condition_func=None, yaml_path=None,
                 output_dir=None, verbose=None):
        include = options.pick(ops, self.env_list) if self.env_list else options.parse_list(ops)
        exclude = options.pick(disable_ops, self.env_disable_list) if self.env_disable_list \
            else options.parse_list(disable_ops)
        self.filter = NameFilter(include, exclude)
        self.condition_func = condition_func
        self.yaml_path = yaml_path
        self.verbose = verbose if verbose is not None else os.environ.get("PROBE_TOOLBOX_VERBOSE", "1") != "0"
        self.output_dir = output_dir or os.path.join(
            "probe_toolbox_results", f"{self.feature}_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}")
        self.counters = {}
        self._interceptor = None
        self._failed = LogOnce(log)
        if self.verbose:         # the tools' reports are log lines: shown without logging set up
            console_log.show_info()

    # ---- lifecycle -------------------------------------------------------------
    @property
    def active(self):
        return self._interceptor is not None

    def start(self):
        if self._interceptor is None:
            self._interceptor = Interceptor(resolved_registry(self.yaml_path), self._dispatch)
            self.on_start()
            self._interceptor.start()
        return self

    def stop(self):
        if self._interceptor is not None:
            self._interceptor.stop()
            self._interceptor = None
            with guard():
                try:
                    self.on_stop()
                except Exception as exc:  # reporting must not break the training script
                    self.fail("report", exc)
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def on_start(self):
        pass

    def on_stop(self):
        pass

    # ---- per call --------------------------------------------------------------
    def _dispatch(self, name, func, args, kwargs):
        if not self.filter.wants(name):
            return func(*args, **kwargs)
        if self.condition_func is not None:
            try:
                with guard():
                    chosen = bool(self.condition_func(*args, **kwargs))
            except Exception as exc:
                self.fail(name, exc, "condition_func raised; call not handled")
                chosen = False
            if not chosen:
                return func(*args, **kwargs)
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        return self.handle(name, n, func, args, kwargs)

    def handle(self, name, call_id, func, args, kwargs):
        raise NotImplementedError

    def fail(self, name, exc, what=None):
        """Log a tool failure once per API; the caller carries on with the real result."""
        self._failed.warning(name, "probe %s: %s failed (%s: %s)%s", self.feature, name, type(exc).__name__,
                        exc, f"; {what}" if what else "; the API's result is unaffected")

    def path(self, *parts):
        p = os.path.join(self.output_dir, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p


# ---- tensor trees --------------------------------------------------------------------
flat_outputs = grad_capture.output_slots   # outputs as grad_capture numbers them


_DEVICE_TYPES = {"cuda", "npu", "xpu", "mps", "meta", "hpu", "privateuseone"}


def is_device(v):
    if isinstance(v, torch.device):
        return True
    return isinstance(v, str) and v.split(":", 1)[0] in _DEVICE_TYPES | {"cpu"}


def swap_devices(args, kwargs, device):
    """Device arguments (``device="cuda"``, ``x.to("npu")``) pointed at ``device``."""
    def swap(v):
        if is_device(v):
            return torch.device(device)
        if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
            return type(v)(swap(x) for x in v) if not hasattr(v, "_fields") else v
        return v
    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}


def call_device(args, kwargs):
    """The device a call runs on: its first tensor's, else its ``device=`` argument, else CPU."""
    for t in flat_tensors((args, kwargs)):
        return t.device
    d = kwargs.get("device")
    return torch.device(d) if d is not None else torch.device("cpu")


def synchronize(device):
    """Wait for ``device``'s queued kernels (CUDA / NPU); no-op on the CPU."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif kind == "npu" and hasattr(torch, "npu") and torch.npu.is_available():
        torch.npu.synchronize(device)


def describe(tensors, attr):
    return ";".join("x".join(map(str, t.shape)) if attr == "shape" else str(t.dtype).replace("torch.", "")
                    for t in tensors)


class CsvSink:
    """Rows appended to a CSV file as they come (a crash keeps what was written)."""

    def __init__(self, path, columns):
        self.path = path
        self.columns = columns
        self.rows = []
        self._written = False

    def add(self, row):
        self.rows.append(row)
        self._append([row])

    def _append(self, rows):
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        new = not self._written
        with open(self.path, "w" if new else "a", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerows(rows)
        self._written = True

    def rewrite(self):
        self._written = False
        self._append(self.rows)
