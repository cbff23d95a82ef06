"""The one per-dtype tolerance table: compare's verdicts and the toolbox's API checks.

rtol: a few roundings of the dtype (spacing at 1.0: bf16 2^-7, fp16 2^-10, fp32 2^-23),
widened for fp32 because reductions summed in a different order differ by ~sqrt(K)
roundings. The relative part is taken against max(|bench|, RMS(bench), floor): an element
small through cancellation carries the absolute error of the tensor's scale.

* ``floor``: below this |bench| a relative error is meaningless (compare).
* ``atol``: the absolute part of the toolbox's ``atol + rtol * |golden|`` check, whose
  golden is computed from the same inputs (the API's own error, so tighter than floor).
* ``cos_warn`` / ``cos_err``: cosine similarity below them is a warning / an error.

No torch here: compare and the CLI's help import this without it. Dtypes are named as
``str(dtype)`` without ``torch.`` ("bfloat16").
"""
from dataclasses import dataclass
from typing import Dict, Optional


@dataclass(frozen=True)
class Tolerance:
    name: str
    rtol: float
    floor: float
    cos_warn: float
    cos_err: float
    atol: float = 0.0


TOLERANCES: Dict[str, Tolerance] = {
    "bfloat16": Tolerance("bfloat16", rtol=1.6e-2, floor=1e-3, cos_warn=0.999, cos_err=0.99, atol=1e-5),
    "float16": Tolerance("float16", rtol=2e-3, floor=1e-3, cos_warn=0.9999, cos_err=0.999, atol=1e-5),
    "float32": Tolerance("float32", rtol=1e-4, floor=1e-6, cos_warn=0.99999, cos_err=0.9999, atol=1e-6),
    "float64": Tolerance("float64", rtol=1e-9, floor=1e-12, cos_warn=0.9999999, cos_err=0.99999, atol=1e-12),
}
DEFAULT = "float32"     # the tolerance of whatever has none of its own (ints, unknown dtypes)


def tolerance_for(name: Optional[str]) -> Tolerance:
    """The tolerance of a dtype named as in ``TOLERANCES`` ("bfloat16"); float32's otherwise."""
    return TOLERANCES.get(name or "") or TOLERANCES[DEFAULT]
