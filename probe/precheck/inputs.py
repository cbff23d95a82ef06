"""Dumped argument descriptions turned back into values an API can be called with.

A tensor comes from its file in ``dump_tensor_data`` (loaded without unpickling, the
name confined to that folder) or, in a statistics dump, is synthesised from the recorded
shape, dtype and range; every tensor remembers which, so a verdict on synthetic data is
never mistaken for one on the real inputs.
"""
from __future__ import annotations

import os
import zlib

import numpy as np
import torch

from probe.compare import tensors as tensor_files
from probe.hook_module import grad_capture
from probe.vocabulary import MAX, MEAN, MIN

_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16,
                               torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                               torch.bool, torch.complex64, torch.complex128)}
_DTYPES.update({"torch.float": torch.float32, "torch.half": torch.float16, "torch.double": torch.float64,
                "torch.long": torch.int64, "torch.int": torch.int32})


class Unrebuildable(ValueError):
    """An argument whose value the dump does not hold (an object, a missing file)."""


def torch_dtype(name: str):
    dt = _DTYPES.get(name) or getattr(torch, str(name).replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise Unrebuildable(f"unknown dtype {name!r}")
    return dt


def is_tensor_desc(d) -> bool:
    return isinstance(d, dict) and d.get("type") == "torch.Tensor"


class Loader:
    """Builds the arguments of dump entries from one dump folder."""

    def __init__(self, data_dir: str | None, device: str = "cpu"):
        self.data_dir = data_dir
        self.device = device
        self.synthetic = False      # set once any tensor of the current call was synthesised

    # ---- one call's arguments ---------------------------------------------------
    def build(self, desc, seed_name: str):
        """The value ``desc`` describes (nested lists/dicts kept), tensors on the CPU."""
        self._seed = zlib.crc32(seed_name.encode())
        self._k = 0
        return self._value(desc)

    def _value(self, d):
        if d is None:
            return None
        if isinstance(d, list):
            return [self._value(x) for x in d]
        if not isinstance(d, dict):
            raise Unrebuildable(f"unexpected description {d!r:.80}")
        kind = d.get("type")
        if kind is None:                    # a dict argument
            return {k: self._value(v) for k, v in d.items()}
        if kind == "torch.Tensor":
            return self.tensor(d)
        value = d.get("value")
        if kind in ("int", "float", "bool", "str"):
            if kind == "float" and isinstance(value, str):   # "inf", "nan" written as text
                return float(value)
            return value
        if kind == "slice":
            return slice(*value)
        if kind == "torch.Size":
            return torch.Size(value)
        if kind == "torch.dtype":
            return torch_dtype(value)
        if kind == "torch.device":
            return torch.device(self.device)       # the dump's device is not this one
        if kind == "torch.memory_format":
            return getattr(torch, d.get("format", "contiguous_format"))
        if kind in ("ellipsis", "Ellipsis"):
            return Ellipsis
        if kind == "NoneType":
            return None
        raise Unrebuildable(f"argument of type {kind} is not recorded by value")

    def tensor(self, d) -> torch.Tensor:
        dtype = torch_dtype(d.get("dtype", "torch.float32"))
        name = d.get("data_name")
        if name and self.data_dir:
            try:
                path = tensor_files.resolve(self.data_dir, name)
            except ValueError as exc:
                raise Unrebuildable(str(exc)) from None
            if os.path.lexists(path):      # (a FIFO or a directory there: refused by load, not synthesised)
                try:
                    arr = tensor_files.load(path)
                except (ValueError, OSError, RuntimeError) as exc:
                    raise Unrebuildable(f"cannot load {name}: {exc}") from None
                t = torch.from_numpy(np.array(arr, copy=not arr.flags.c_contiguous)).to(dtype)
                shape = d.get("shape")
                if shape is not None and list(t.shape) != list(shape):
                    raise Unrebuildable(f"{name} holds shape {list(t.shape)}, dump.json says {shape}")
                return t
        return self._synthesise(d, dtype)

    def dumped(self, d):
        """A dumped tensor from its file; None for non-tensors and tensors without a file
        (statistics only: nothing real to compare with)."""
        if not is_tensor_desc(d) or not d.get("data_name"):
            return None
        saved = self.synthetic
        t = self.tensor(d)
        if self.synthetic and not saved:   # no file after all: not a dumped value
            self.synthetic = False
            return None
        return t

    def _synthesise(self, d, dtype) -> torch.Tensor:
        """A tensor with the recorded shape, dtype and range (Min..Max), seeded by entry name."""
        shape = d.get("shape")
        if shape is None:
            raise Unrebuildable("tensor without a recorded shape")
        self.synthetic = True
        self._k += 1
        gen = torch.Generator().manual_seed(self._seed * 7919 + self._k)
        numel = int(np.prod(shape)) if shape else 1
        lo, hi = _num(d.get(MIN)), _num(d.get(MAX))
        if dtype == torch.bool:
            mean = _num(d.get(MEAN))
            p = 0.5 if mean is None or not np.isfinite(mean) else min(max(mean, 0.0), 1.0)
            return (torch.rand(shape, generator=gen) < p)
        if not dtype.is_floating_point and not dtype.is_complex:
            lo = 0 if lo is None or not np.isfinite(lo) else int(lo)
            hi = lo if hi is None or not np.isfinite(hi) else int(hi)
            return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64).to(dtype)
        special = [v for v in (lo, hi) if v is not None and not np.isfinite(v)]
        lo = -1.0 if lo is None or not np.isfinite(lo) else lo
        hi = max(lo, 1.0) if hi is None or not np.isfinite(hi) else hi
        t = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
        flat = t.view(-1)
        if numel >= 2:                      # keep the recorded extremes exactly
            flat[0], flat[-1] = hi, lo
        for k, v in enumerate(special[:numel]):   # Inf/NaN recorded: put one in
            flat[k] = v
        return t.to(dtype)


def _num(v):
    if v is None or isinstance(v, bool):
        return None if v is None else float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


# One slot per argument, as the dump numbers backward outputs.
flat_tensors = grad_capture.input_slots


def flat_outputs(value):
    """Leaves of an output, in the dump's order (a tuple/list flattened depth-first)."""
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            out.extend(flat_outputs(v))
        return out
    return [value]
