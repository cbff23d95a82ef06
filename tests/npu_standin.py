"""A stand-in for ``torch_npu``, so that probe's NPU code paths run in tests where torch_npu
is absent (everywhere but an Ascend machine).

What it provides, as module objects built afresh by each :class:`StandIn`:

- ``torch_npu`` with a few functions of the registry's ``torch_npu`` section (``npu_fast_gelu``,
  ``fast_gelu``, ``npu_rms_norm``, ``npu_swiglu``) and one that the registry does not list
  (``get_npu_format``), computed with plain torch ops. Their argument lists are torch_npu's
  leading ones, not all of them; they only have to be real Python callables of tensors;
- ``torch_npu.atb`` with ``_npu_flash_attention_v2`` (a dotted registry name, patched on
  the submodule): softmax attention of (query, key, value);
- ``torch_npu.npu``, also set as ``torch.npu`` as importing torch_npu does: ``is_available()``
  (``StandIn.available``), ``device_count()``, ``current_device()``, ``synchronize(device=None)``,
  ``Event``, ``manual_seed`` / ``manual_seed_all``, and ``matmul.allow_hf32`` /
  ``conv.allow_hf32`` (torch_npu's defaults: False / True). Calls are recorded on the
  ``StandIn`` (``synchronized``, ``seeds``, ``events``) for the tests to assert on.

Limits: torch on the CPU knows no device type ``npu`` (``torch.device("npu")`` raises; torch_npu
renames the PrivateUse1 backend to it, which cannot be undone in a process), so the stand-in's
functions compute on CPU tensors, and a path that would move tensors with ``.to("npu")`` is
tested through its checks (device kind, ``is_available()``, the import of torch_npu) or with
an object whose ``.type`` is ``"npu"``, not with real device moves.

Two ways in, both undone by ``monkeypatch`` at the end of the test:
:meth:`StandIn.install` (as after ``import torch_npu`` in a training script) and
:meth:`StandIn.make_importable` (torch_npu installed but not imported yet: ``torch.npu``
appears only once something imports it).
"""
import importlib.abc
import importlib.util
import sys
import time
import types

import torch
import torch.nn.functional as F

# The names of the registry's torch_npu section the stand-in has (the dotted one on ``atb``).
PROVIDED = ("npu_fast_gelu", "fast_gelu", "npu_rms_norm", "npu_swiglu", "atb._npu_flash_attention_v2")


def npu_fast_gelu(input):
    """torch_npu's fast GELU: x * sigmoid(1.702 x)."""
    return input * torch.sigmoid(1.702 * input)


def fast_gelu(input):
    return npu_fast_gelu(input)


def npu_rms_norm(input, gamma, epsilon=1e-6):
    """(normalised input * gamma, rstd), as torch_npu returns both. rstd is computed twice so
    that the two outputs are independent, as in torch_npu's fused kernel: an output that
    also fed the other would carry that internal gradient in its dumped backward input."""
    def rstd():
        return torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + epsilon)
    return input * rstd() * gamma, rstd()


def npu_swiglu(input, dim=-1):
    a, b = input.chunk(2, dim=dim)
    return F.silu(a) * b


def get_npu_format(input):
    """Not in the registry: must never be patched."""
    return 2


def _npu_flash_attention_v2(query, key, value, scale=1.0):
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    return torch.matmul(torch.softmax(scores, dim=-1), value)


class StandIn:
    """One fake torch_npu and the record of what was asked of its ``torch.npu``."""

    def __init__(self):
        self.available = True
        self.synchronized = []   # the device argument of each torch.npu.synchronize call
        self.seeds = []          # ("manual_seed" | "manual_seed_all", seed)
        self.events = []         # every torch.npu.Event made
        self.torch_npu = types.ModuleType("torch_npu")
        self.atb = types.ModuleType("torch_npu.atb")
        self.npu = types.ModuleType("torch_npu.npu")
        for func in (npu_fast_gelu, fast_gelu, npu_rms_norm, npu_swiglu, get_npu_format):
            setattr(self.torch_npu, func.__name__, func)
        self.atb._npu_flash_attention_v2 = _npu_flash_attention_v2
        self.torch_npu.atb = self.atb
        self.torch_npu.npu = self.npu
        self._fill_device_module()
        # what the tests compare against after probe's patches are gone
        self.originals = {name: self.lookup(name) for name in PROVIDED}

    @property
    def modules(self):
        return {"torch_npu": self.torch_npu, "torch_npu.atb": self.atb, "torch_npu.npu": self.npu}

    def lookup(self, dotted):
        """``torch_npu.<dotted>`` as it is now (patched or not)."""
        obj = self.torch_npu
        for part in dotted.split("."):
            obj = getattr(obj, part)
        return obj

    def _fill_device_module(self):
        standin = self
        npu = self.npu

        class Event:
            """torch.npu.Event: ``elapsed_time`` needs both events recorded, timing enabled
            and the end event synchronised, as on the device (else it would read an
            unfinished event)."""

            def __init__(self, enable_timing=False, blocking=False, interprocess=False):
                self.enable_timing = enable_timing
                self.recorded_at = None
                self.synchronized = False
                standin.events.append(self)

            def record(self, stream=None):
                self.recorded_at = time.perf_counter()

            def synchronize(self):
                if self.recorded_at is None:
                    raise RuntimeError("Event.synchronize before record()")
                self.synchronized = True

            def elapsed_time(self, end):
                if not (self.enable_timing and end.enable_timing):
                    raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
                if self.recorded_at is None or end.recorded_at is None:
                    raise RuntimeError("Both events must be recorded before calculating elapsed time")
                if not end.synchronized:
                    raise RuntimeError("end event not completed: synchronize it first")
                return (end.recorded_at - self.recorded_at) * 1e3

        def synchronize(device=None):
            standin.synchronized.append(device)

        def manual_seed(seed):
            standin.seeds.append(("manual_seed", seed))

        def manual_seed_all(seed):
            standin.seeds.append(("manual_seed_all", seed))

        npu.Event = Event
        npu.is_available = lambda: standin.available
        npu.device_count = lambda: 1 if standin.available else 0
        npu.current_device = lambda: 0
        npu.synchronize = synchronize
        npu.manual_seed = manual_seed
        npu.manual_seed_all = manual_seed_all
        npu.matmul = types.SimpleNamespace(allow_hf32=False)
        npu.conv = types.SimpleNamespace(allow_hf32=True)

    # ---- installing ------------------------------------------------------------------
    def install(self, monkeypatch):
        """As after ``import torch_npu``: the modules in ``sys.modules``, ``torch.npu`` set."""
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        self._register_device(monkeypatch)
        return self

    def make_importable(self, monkeypatch):
        """As with torch_npu installed but not imported: ``import torch_npu`` finds the
        stand-in and sets ``torch.npu``; until then torch has no ``npu``."""
        for name in (*self.modules, "torch.npu"):   # a real torch_npu already imported
            monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.delattr(torch, "npu", raising=False)
        monkeypatch.setattr(sys, "meta_path", [_Finder(self, monkeypatch)] + sys.meta_path)
        return self

    def _register_device(self, monkeypatch):
        monkeypatch.setattr(torch, "npu", self.npu, raising=False)
        monkeypatch.setitem(sys.modules, "torch.npu", self.npu)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the stand-in's modules for ``import``; what it adds to sys.modules and torch
    goes through ``monkeypatch``, so the end of the test removes it."""

    def __init__(self, standin, monkeypatch):
        self.standin = standin
        self.monkeypatch = monkeypatch

    def find_spec(self, name, path=None, target=None):
        if name not in self.standin.modules:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=name == "torch_npu")

    def create_module(self, spec):
        module = self.standin.modules[spec.name]
        self.monkeypatch.setitem(sys.modules, spec.name, module)   # recorded as absent before
        return module

    def exec_module(self, module):
        if module.__name__ == "torch_npu":   # torch_npu's __init__ imports its submodules
            for name, sub in self.standin.modules.items():
                if name != "torch_npu" and name not in sys.modules:
                    self.monkeypatch.setitem(sys.modules, name, sub)
            self.standin._register_device(self.monkeypatch)
