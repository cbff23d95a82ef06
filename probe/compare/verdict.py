"""pass / warning / error for one row, with the reason in words.

Tolerance follows the coarser dtype of the pair, and of everything computed before it:
once a run has gone through bf16, the fp32 tensors downstream carry bf16-sized error,
so judging them at fp32 tolerance would flag every row after the first bf16 op.
An element is within tolerance when |npu - bench| <= rtol * max(|bench|, RMS(bench), floor):
small values (cancellation) are judged by absolute error against the tensor's scale.
"""
from __future__ import annotations

import functools
import math

from probe.tolerances import TOLERANCES, Tolerance  # noqa: F401  (the one table; re-exported)
from probe.vocabulary import PASS, RESULTS

ERROR_FACTOR = 10.0     # beyond 10x the tolerance is an error, between 1x and 10x a warning
# Tensors: a few isolated elements far off are normal where an op is discontinuous (relu's
# gradient at 0, argmax, masks) and its input moved by one rounding; an error needs more
# than GROSS_FRACTION of the elements beyond ERROR_FACTOR x tolerance (or a low cosine).
GROSS_FRACTION = 0.01
RANK = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}     # coarsest first
_FLOAT_ALIASES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
                  "fp16": "float16", "float32": "float32", "float": "float32", "fp32": "float32",
                  "float64": "float64", "double": "float64", "fp64": "float64"}
_EXACT = {"bool", "uint8", "int8", "int16", "int32", "int64", "long", "int", "short"}


@functools.lru_cache(maxsize=256)
def dtype_class(dtype: str | None) -> str | None:
    """'bfloat16'/'float16'/'float32'/'float64', 'exact' for ints and bools, else None."""
    if not dtype:
        return None
    base = dtype.rsplit(".", 1)[-1]
    if base in _FLOAT_ALIASES:
        return _FLOAT_ALIASES[base]
    if base in _EXACT:
        return "exact"
    return None


def comparable(npu_dtype: str | None, bench_dtype: str | None) -> bool:
    """fp16/bf16/fp32/fp64 compare with each other; ints/bools only with ints/bools."""
    ca, cb = dtype_class(npu_dtype), dtype_class(bench_dtype)
    if ca in RANK and cb in RANK:
        return True
    if ca == "exact" and cb == "exact":      # both named, so both strings
        return str(npu_dtype).endswith("bool") == str(bench_dtype).endswith("bool")
    return npu_dtype == bench_dtype


class Verdict:
    """Collects failed criteria for one row; the worst level wins."""
    __slots__ = ("level", "messages")
    _ORDER = {level: k for k, level in enumerate(RESULTS)}     # pass < warning < error

    def __init__(self):
        self.level, self.messages = PASS, []

    def add(self, level: str, message: str):
        if self._ORDER[level] > self._ORDER[self.level]:
            self.level = level
        self.messages.append(f"{level}: {message}" if level != PASS else message)

    def text(self) -> str:
        return "; ".join(self.messages)


def judge_ratio(v: Verdict, ratio: float, tol: Tolerance, what: str):
    """Apply the tolerance-ratio criterion (worst |err| / tolerance)."""
    if ratio is None or math.isnan(ratio) or ratio <= 1.0:
        return
    v.add(*ratio_finding(ratio, tol, what))


def ratio_finding(ratio: float, tol: Tolerance, what: str) -> tuple[str, str]:
    """(level, message) for a ratio beyond 1 (what judge_ratio adds)."""
    warn, err = ratio_tails(tol, what)
    if ratio > ERROR_FACTOR:
        return "error", what + " " + format(ratio, ".3g") + err
    return "warning", what + " " + format(ratio, ".3g") + warn


@functools.lru_cache(maxsize=64)
def ratio_tails(tol: Tolerance, what: str) -> tuple[str, str]:
    """The constant ends of ratio_finding's messages (hundreds of thousands of rows)."""
    warn = f"x the {tol.name} tolerance (rtol {tol.rtol:g})"
    return warn, f"{warn}, more than {ERROR_FACTOR:g}x"


def judge_cosine(v: Verdict, cosine: float, tol: Tolerance):
    if math.isnan(cosine):
        return
    if cosine < tol.cos_err:
        v.add("error", f"cosine {cosine:.6f} < {tol.cos_err} ({tol.name} error threshold)")
    elif cosine < tol.cos_warn:
        v.add("warning", f"cosine {cosine:.6f} < {tol.cos_warn} ({tol.name} warning threshold)")


def judge_elements(v: Verdict, ratio: float, beyond: float, gross: float, tol: Tolerance):
    """Tensor criterion: how many elements are outside tolerance, and how far the worst is."""
    if ratio is None or math.isnan(ratio) or ratio <= 1.0:
        return
    detail = (f"{beyond:.2%} of elements beyond the {tol.name} tolerance (rtol {tol.rtol:g}), "
              f"worst {ratio:.3g}x")
    if gross > GROSS_FRACTION:
        v.add("error", f"{detail}; {gross:.2%} beyond {ERROR_FACTOR:g}x (limit {GROSS_FRACTION:.0%})")
    else:
        v.add("warning", detail)
