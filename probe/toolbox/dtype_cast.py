"""OpDtypeCast: chosen APIs get their inputs cast per a mapping (bf16 -> fp32), outputs back.

Casting stays on the same device and is differentiable (``x.to(dtype)``), so gradients
reach the original tensors in their own dtype. In-place and ``out=`` APIs write their
result back into the real tensor (``real.copy_``, which casts back), as fallback does.
An output in a target dtype is cast back to the source dtype it came from. Every cast
call is reported (``calls``, logged at INFO when verbose, ``dtype_cast.csv``).

The mapping: ``dtype_map`` keyword, else ``OP_DTYPE_CAST_DICT``
(``"torch.float16->torch.float32,torch.bfloat16->torch.float32"``, the default);
per API: ``op_dtype_maps={"linear": {...}}`` or ``LINEAR_OP_DTYPE_CAST_DICT``.
"""
import logging
import os

import torch

from probe.toolbox import base, options

log = logging.getLogger(__name__)

DEFAULT_MAP = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class OpDtypeCast(base.ToolBase):
    feature = "cast_dtype"
    env_list = "OP_DTYPE_CAST_LIST"
    env_disable_list = "OP_DTYPE_CAST_DISABLE_LIST"

    def __init__(self, ops=None, disable_ops=None, condition_func=None, dtype_map=None,
                 op_dtype_maps=None, yaml_path=None, verbose=None, output_dir=None):
        super().__init__(ops, disable_ops, condition_func, yaml_path, output_dir, verbose)
        self.dtype_map = options.pick(dtype_map, "OP_DTYPE_CAST_DICT", options.parse_dtype_map) \
            if not isinstance(dtype_map, dict) else options.parse_dtype_map(dtype_map)
        if self.dtype_map is None:
            self.dtype_map = dict(DEFAULT_MAP)
        self.op_dtype_maps = op_dtype_maps or {}
        self._maps = {}
        self.calls = []   # rows: name, call_id, inputs, outputs
        self.csv = base.CsvSink(os.path.join(self.output_dir, "dtype_cast.csv"),
                                ["name", "call_id", "inputs", "outputs"])

    def _map_for(self, name):
        m = self._maps.get(name)
        if m is None:
            m = self._maps[name] = options.op_dtype_map(name, self.dtype_map, self.op_dtype_maps)
        return m

    def handle(self, name, call_id, func, args, kwargs):
        mapping = self._map_for(name)
        memo, real_of, casts = {}, {}, []
        back_to = {}  # target dtype -> source dtype seen in this call

        def cast(t):
            c = memo.get(id(t))
            if c is not None:
                return c
            dst = mapping.get(t.dtype)
            if dst is None or dst == t.dtype:
                memo[id(t)] = t
                return t
            c = memo[id(t)] = t.to(dst)
            real_of[id(c)] = t
            back_to.setdefault(dst, t.dtype)
            casts.append(f"{_d(t.dtype)}->{_d(dst)}")
            return c

        cargs = base.map_tensors(cast, args)
        ckwargs = base.map_tensors(cast, kwargs)
        if not casts:
            return func(*args, **kwargs)
        copies = [c for c in memo.values() if id(c) in real_of]
        versions = [c._version for c in copies]
        out = func(*cargs, **ckwargs)
        for c, v0 in zip(copies, versions):
            if c._version != v0:
                real_of[id(c)].copy_(c)
        out_casts = []

        def back(o):
            real = real_of.get(id(o))
            if real is not None:
                return real
            src = back_to.get(o.dtype)
            if src is not None and o.is_floating_point():
                out_casts.append(f"{_d(o.dtype)}->{_d(src)}")
                return o.to(src)
            return o

        result = base.map_tensors(back, out)
        row = {"name": name, "call_id": call_id, "inputs": ",".join(casts), "outputs": ",".join(out_casts)}
        self.calls.append(row)
        try:
            self.csv.add(row)
        except OSError as exc:
            self.fail(name, exc, "report not written")
        if self.verbose:
            log.info("probe cast_dtype: %s.%s inputs %s outputs %s", name, call_id, row["inputs"],
                     row["outputs"] or "-")
        return result


def _d(dtype):
    return str(dtype).replace("torch.", "")
