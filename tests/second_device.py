"""A second device, simulated on the CPU: what makes a correct accelerator's results differ
from the CPU's without any kernel being wrong.

``Device`` is a ``TorchDispatchMode`` under which the model trains as on another chip:

- ``tf32``: matrix products and convolutions round their fp32 inputs to 10 mantissa bits
  first (TF32 on CUDA's matrix units, HF32 on Ascend's), ~5e-4 relative per product;
  ``tf32="truncate"`` cuts the low bits off instead (biased toward zero, ~1e-3 a product,
  as an H200 did), and declares it as a CUDA user does (``torch.backends.cuda.matmul.allow_tf32``
  on while the device runs: dump.json's math_modes record it);
- ``split_k``: matrix products sum their K terms in two halves (a blocked or split-K
  kernel: another reduction order, ~sqrt(K) x 6e-8 relative);
- its own random stream: ``Device(seed=...)`` reseeds torch's generator when it starts,
  so dropout draws other masks than the bench's (CUDA's and Ascend's generators are not the
  CPU's), while the weights, built before, are the same.

Nothing here knows about probe: the dump sees the API calls and their outputs, as on a
device. Faults (``real_runs.KernelFault``) stack on top of it.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
_CONVS = {aten.convolution.default}


def round_tf32(t: torch.Tensor, truncate: bool = False) -> torch.Tensor:
    """fp32 ``t`` with its mantissa cut to 10 bits, as TF32 keeps: to nearest (ties away),
    or ``truncate``d (toward zero: the low bits dropped, as a matrix unit reading fp32
    registers as TF32 does without a rounding conversion first)."""
    if t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    rounded = (bits if truncate else bits + 0x1000) & ~0x1FFF
    return rounded.view(torch.float32).view(t.shape)


class Device(TorchDispatchMode):
    def __init__(self, tf32=False, split_k=False, seed=None):
        super().__init__()
        self.tf32, self.split_k, self.seed = tf32, split_k, seed

    def __enter__(self):
        if self.seed is not None:
            torch.manual_seed(self.seed)
        self._tf32_was = torch.backends.cuda.matmul.allow_tf32
        if self.tf32 == "truncate":
            torch.backends.cuda.matmul.allow_tf32 = True
        return super().__enter__()

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._tf32_was
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.tf32 and (func in _MATMULS or func in _CONVS):
            cut = self.tf32 == "truncate"
            args = tuple(round_tf32(a, cut) if isinstance(a, torch.Tensor) and a.dim() >= 2 else a for a in args)
        if self.split_k and func in (aten.mm.default, aten.addmm.default):
            return self._split_k(func, args, kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _split_k(func, args, kwargs):
        if func is aten.mm.default:
            bias, a, b = None, args[0], args[1]
            beta, alpha = 1, 1
        else:
            bias, a, b = args[0], args[1], args[2]
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        k = a.shape[-1]
        if k < 4 or a.dtype != torch.float32:
            return func(*args, **kwargs)
        h = k // 2
        out = aten.mm.default(a[:, :h], b[:h]) + aten.mm.default(a[:, h:], b[h:])
        if alpha != 1:
            out = out * alpha
        if bias is not None:
            out = out + (bias * beta if beta != 1 else bias)
        return out
