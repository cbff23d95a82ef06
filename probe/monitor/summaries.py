"""Statistics of one step as device tensors, fetched to the host in one transfer.

Parameter statistics are one ``torch._foreach_norm`` per family (weights, gradients,
exp_avg, exp_avg_sq, updates). An activation is summarised by ``probe.dump.stats``'
``reductions``: on the CPU a compiled one-pass summary returns host numbers at once (no
transfer to wait for); on CUDA/NPU its 0-d reductions stay on the device. ``fetch`` stacks
everything left on a device and calls ``.tolist()`` once: no sync per module or parameter.
"""
import math

import torch

from probe.dump import stats

ACT_METRICS = ("norm", "max", "mean", "nonfinite")


class StepBuffer:
    """Statistics of the step being logged: blocks of (keys, order keys, values)."""

    def __init__(self):
        self.keys = []
        self.order = []
        self.parts = []      # per key: a float, or (tensor block, index) resolved at fetch
        self.blocks = []     # device tensors, concatenated at fetch

    def clear(self):
        self.keys, self.order, self.parts, self.blocks = [], [], [], []

    def add_block(self, keys, order, values):
        """``values``: a 1-D tensor (or list of 0-d tensors) with one value per key."""
        if isinstance(values, (list, tuple)):
            if not values:
                return
            values = torch.stack([v.float() for v in values])
        b = len(self.blocks)
        if values.dtype != torch.float32:
            values = values.float()
        self.blocks.append(values.detach().reshape(-1))
        self.keys.extend(keys)
        self.order.extend(order)
        self.parts.extend((b, i) for i in range(len(keys)))

    def add_host(self, key, order, value):
        self.keys.append(key)
        self.order.append(order)
        self.parts.append(float(value))

    def add_tensor_summary(self, prefix_keys, order, t, cache=None):
        """norm, max|x|, mean and NaN/Inf count of ``t`` under ``prefix_keys`` (4 keys)."""
        hit = cache.lookup(t) if cache is not None else None
        if hit is None:
            hit = summarize(t)
            if cache is not None and hit is not None:
                cache.store(t, hit)
        if hit is None:
            return
        if type(hit) is tuple:
            self.keys.extend(prefix_keys)
            self.order.extend((order,) * len(prefix_keys))
            self.parts.extend(float(v) for v in hit)
        else:
            self.add_block(prefix_keys, [order] * len(prefix_keys), hit)

    def fetch(self):
        """(keys, host values, order) with one host transfer for everything on a device."""
        host = []
        if self.blocks:
            devices = {}
            for b, block in enumerate(self.blocks):
                devices.setdefault(block.device, []).append(b)
            flat = {}
            for idx in devices.values():
                joined = torch.cat([self.blocks[b] for b in idx]).tolist() if len(idx) > 1 else \
                    self.blocks[idx[0]].tolist()
                pos = 0
                for b in idx:
                    n = self.blocks[b].numel()
                    flat[b] = joined[pos:pos + n]
                    pos += n
            host = [p if type(p) is float else flat[p[0]][p[1]] for p in self.parts]
        else:
            host = list(self.parts)
        return self.keys, host, self.order


def summarize(t):
    """(norm, max|x|, mean, nonfinite count): a host tuple on the CPU, a 4-vector on a device."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return None
    r = stats.reductions(t)
    if r is None:
        return None
    if type(r) is tuple:   # summarised on the spot (CPU)
        mx, mn, mean, norm = r
        if math.isfinite(norm):
            bad = 0
        else:
            bad = int((~torch.isfinite(t.detach())).sum())
        return (norm, max(abs(mx), abs(mn)), mean, bad)
    mx, mn, s, norm = r.parts
    bad = (~torch.isfinite(t.detach())).sum()
    return torch.stack([norm.float(), torch.maximum(mx.abs(), mn.abs()).float(), (s / r.numel).float(),
                        bad.float()])


def norms(tensors):
    """1-D float tensor of the 2-norms of ``tensors`` (one foreach call per dtype/device group)."""
    if not tensors:
        return None
    with torch.no_grad():
        out = torch._foreach_norm(tensors)
        try:
            return torch.stack(out).float()
        except RuntimeError:    # mixed dtypes or devices
            return torch.stack([n.float().to(out[0].device) for n in out])
