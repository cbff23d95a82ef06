"""OpFallback: chosen APIs run on the CPU; results come back to the device, autograd intact.

Inputs are copied with ``x.to("cpu", copy=True)`` (differentiable), the API runs on the
copies, and its outputs return with ``.to(device)`` (differentiable): gradients flow through
the CPU computation back into the user's graph. In-place and ``out=`` APIs keep their
semantics: any input copy the API modified (its version counter moved) is written back
into the user's real tensor with ``real.copy_(...)`` in the caller's grad mode, so the
tensor is updated, its version bumps and its autograd history continues; where the API
returned that copy, the real tensor itself is returned (``y = x.add_(1)``: ``y is x``).
Views and metadata-changing in-place APIs (``view``, ``squeeze_``) cannot live on another
device without breaking aliasing: those run on the device, and the call is reported.

Use: bisect a faulty kernel by watching the loss while narrowing ``OP_FALLBACK_LIST``.
"""
import logging

import torch

from probe.toolbox import base

log = logging.getLogger(__name__)


class OpFallback(base.ToolBase):
    """Run chosen APIs on ``target`` (default CPU), results back on the calling device.

    ``ops`` / ``disable_ops`` (``OP_FALLBACK_LIST`` / ``OP_FALLBACK_DISABLE_LIST``);
    ``target``: where to run (the fallback path runs even when the call is already there,
    which is how it is tested on a CPU-only machine). ``calls`` lists what happened.
    """
    feature = "fallback"
    env_list = "OP_FALLBACK_LIST"
    env_disable_list = "OP_FALLBACK_DISABLE_LIST"

    def __init__(self, ops=None, disable_ops=None, condition_func=None, target="cpu",
                 yaml_path=None, verbose=None, output_dir=None):
        super().__init__(ops, disable_ops, condition_func, yaml_path, output_dir, verbose)
        self.target = torch.device(target)
        self.calls = []   # (name, call_id, "fallback" | "on device: <why>")

    def handle(self, name, call_id, func, args, kwargs):
        device = base.call_device(args, kwargs)
        memo = {}
        real_of = {}

        def to_target(t):
            c = memo.get(id(t))
            if c is None:
                c = memo[id(t)] = t.to(self.target, copy=True)
                real_of[id(c)] = t
            return c

        cargs = base.map_tensors(to_target, args)
        ckwargs = base.map_tensors(to_target, kwargs)
        cargs, ckwargs = base.swap_devices(cargs, ckwargs, self.target)
        copies = list(memo.values())
        versions = [c._version for c in copies]
        try:
            cout = func(*cargs, **ckwargs)
        except Exception as exc:
            # Not runnable there (a device-only dtype or op): run where it was called; an
            # error of the call itself is then raised by the device as it would be anyway.
            self.fail(name, exc, f"ran on {device} instead")
            self._log(name, call_id, f"on device: {type(exc).__name__} on {self.target}")
            return func(*args, **kwargs)

        why = _aliasing(cout, copies, real_of)
        if why:
            self._log(name, call_id, f"on device: {why}")
            return func(*args, **kwargs)
        for c, v0 in zip(copies, versions):
            if c._version != v0:
                real = real_of[id(c)]
                real.copy_(c)  # differentiable, casts device and dtype, bumps the version

        def back(o):
            real = real_of.get(id(o))
            if real is not None:
                return real
            return o.to(device)

        self._log(name, call_id, "fallback")
        return base.map_tensors(back, cout)

    def _log(self, name, call_id, what):
        self.calls.append((name, call_id, what))
        if self.verbose:
            log.info("probe fallback: %s.%s %s (%s)", name, call_id, what, self.target)

    def on_stop(self):
        if self.verbose and self.calls:
            n = sum(1 for c in self.calls if c[2] == "fallback")
            log.info("probe fallback: %d calls ran on %s, %d stayed on the device", n, self.target,
                     len(self.calls) - n)


def _aliasing(cout, copies, real_of):
    """Why the result cannot be brought back as a copy, or None."""
    storages = {}
    for c in copies:
        try:
            storages[c.untyped_storage().data_ptr()] = c
        except Exception:
            pass
    for o in base.flat_tensors(cout):
        src = real_of.get(id(o))
        if src is not None:
            if o.shape != src.shape or o.stride() != src.stride():
                return "metadata changed in place"
            continue
        try:
            ptr = o.untyped_storage().data_ptr()
        except Exception:
            continue
        if ptr in storages and o.numel() > 0:
            return "the result is a view of an input"
    return None
