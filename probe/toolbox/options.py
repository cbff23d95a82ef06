"""Configuration of the live tools: ditorch's environment variables, keyword arguments win.

Lists are comma-separated (``OP_AUTOCOMPARE_LIST="linear,softmax"``); each item is a
regular expression searched in the API's names (``Functional.linear``,
``torch.nn.functional.linear``, ``F.linear``), so a plain word is a substring and
``^Tensor.add$`` is exact. Tolerances are ``"atol,rtol"``; the most specific wins:
``LINEAR_AUTOCOMPARE_ERROR_TOLERANCE_BFLOAT16`` > ``AUTOCOMPARE_ERROR_TOLERANCE_BFLOAT16`` >
``AUTOCOMPARE_ERROR_TOLERANCE`` > built-in default.
"""
import os
import re

import torch

from probe.errors import ConfigError
from probe.tolerances import TOLERANCES

# Per-dtype defaults (atol, rtol), from the one table (``probe.tolerances``). Errors are
# measured against a float64/float32 golden computed from the *same* inputs, so they are
# this API's own error; the relative part is taken against max(|golden|, RMS(golden)).
DEFAULT_TOLERANCE = {
    getattr(torch, name): (tol.atol, tol.rtol) for name, tol in TOLERANCES.items()
}
_DTYPE_ENV = {torch.bfloat16: "BFLOAT16", torch.float16: "FLOAT16",
              torch.float32: "FLOAT32", torch.float64: "FLOAT64"}

_DTYPE_NAMES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
}


def parse_list(value):
    """A comma-separated string, a list or None -> list of non-empty stripped strings or None."""
    if value is None:
        return None
    if isinstance(value, str):
        items = value.split(",")
    else:
        items = list(value)
    return [str(i).strip() for i in items if str(i).strip()]


def env_list(var):
    return parse_list(os.environ.get(var))


def pick(kwarg, env_var, parse=parse_list):
    """Keyword argument when given, else the parsed environment variable, else None."""
    if kwarg is not None:
        return parse(kwarg) if isinstance(kwarg, str) else kwarg
    raw = os.environ.get(env_var)
    return None if raw is None or not raw.strip() else parse(raw)


def parse_dtype(value):
    if isinstance(value, torch.dtype):
        return value
    key = str(value).strip().lower()
    if key.startswith("torch."):
        key = key[6:]
    if key not in _DTYPE_NAMES:
        raise ConfigError(f"unknown dtype {value!r}; use e.g. torch.bfloat16, bf16, fp32")
    return _DTYPE_NAMES[key]


def parse_dtype_map(value):
    """``"torch.float16->torch.float32,bf16->fp32"`` or a dict -> {torch.dtype: torch.dtype}."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {parse_dtype(k): parse_dtype(v) for k, v in value.items()}
    out = {}
    for item in parse_list(value):
        if "->" not in item:
            raise ConfigError(f"dtype cast item {item!r}: expected FROM->TO, e.g. torch.bfloat16->torch.float32")
        src, dst = item.split("->", 1)
        out[parse_dtype(src)] = parse_dtype(dst)
    return out


def parse_tolerance(value):
    """``"atol,rtol"`` or a pair -> (atol, rtol) floats."""
    if isinstance(value, str):
        parts = [p for p in value.replace(" ", "").split(",") if p]
    else:
        parts = list(value)
    if len(parts) != 2:
        raise ConfigError(f"tolerance {value!r}: expected 'atol,rtol'")
    atol, rtol = float(parts[0]), float(parts[1])
    if atol < 0 or rtol < 0:
        raise ConfigError(f"tolerance {value!r}: atol and rtol must be >= 0")
    return atol, rtol


def short_name(name):
    """``Functional.linear`` -> ``linear`` (the part ditorch's per-API variables use)."""
    return name.rsplit(".", 1)[-1].strip("_") or name


class Tolerances:
    """(atol, rtol) for an API name and an output dtype.

    ``tolerance``: one pair for every dtype; ``tolerances``: {dtype: pair};
    ``op_tolerances``: {api name or short name: pair or {dtype: pair}}. Keyword arguments
    win over the environment, and within each source the most specific entry wins.
    """

    def __init__(self, tolerance=None, tolerances=None, op_tolerances=None):
        self.all = parse_tolerance(tolerance) if tolerance is not None else None
        self.by_dtype = {parse_dtype(k): parse_tolerance(v) for k, v in (tolerances or {}).items()}
        self.by_op = {}
        for op, v in (op_tolerances or {}).items():
            if isinstance(v, dict):
                self.by_op[op] = {parse_dtype(k): parse_tolerance(t) for k, t in v.items()}
            else:
                self.by_op[op] = parse_tolerance(v)
        self._cache = {}

    def get(self, name, dtype):
        key = (name, dtype)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lookup(name, dtype)
        return hit

    def _lookup(self, name, dtype):
        short = short_name(name)
        for op in (name, short):
            v = self.by_op.get(op)
            if isinstance(v, dict) and dtype in v:
                return v[dtype]
            if isinstance(v, tuple):
                return v
        if dtype in self.by_dtype:
            return self.by_dtype[dtype]
        if self.all is not None:
            return self.all
        suffix = _DTYPE_ENV.get(dtype)
        candidates = []
        if suffix:
            candidates.append(f"{short.upper()}_AUTOCOMPARE_ERROR_TOLERANCE_{suffix}")
        candidates.append(f"{short.upper()}_AUTOCOMPARE_ERROR_TOLERANCE")
        if suffix:
            candidates.append(f"AUTOCOMPARE_ERROR_TOLERANCE_{suffix}")
        candidates.append("AUTOCOMPARE_ERROR_TOLERANCE")
        for var in candidates:
            raw = os.environ.get(var)
            if raw:
                return parse_tolerance(raw)
        return DEFAULT_TOLERANCE.get(dtype, DEFAULT_TOLERANCE[torch.float32])


def op_dtype_map(name, default_map, per_op=None):
    """The cast mapping for one API: ``per_op`` kwarg, then ``{SHORT}_OP_DTYPE_CAST_DICT``, then default."""
    short = short_name(name)
    for op in (name, short):
        if per_op and op in per_op:
            return parse_dtype_map(per_op[op])
    raw = os.environ.get(f"{short.upper()}_OP_DTYPE_CAST_DICT")
    if raw:
        return parse_dtype_map(raw)
    return default_map


def compile_patterns(items):
    """List items -> compiled regexes (an invalid regex is taken literally)."""
    out = []
    for item in items or ():
        try:
            out.append(re.compile(item))
        except re.error:
            out.append(re.compile(re.escape(item)))
    return out
