"""Per-token statistics: one ``[Max, Min, Mean, Norm]`` per token row of a tensor.

An inference step mixes requests in its token dimension(s), so a whole-tensor summary
cannot say which request a difference belongs to. When the step has a token layout, every
floating tensor whose leading dims equal the layout's ``token_shape`` also gets
``"token_stats"`` in dump.json: its rows (the layout's rows, flattened in the same order),
each summarised over its remaining elements. The compare gathers one request's rows from
every step by it.

One batched reduction per tensor over the trailing dims (``amax``/``amin``/``sum``/
``vector_norm`` with ``dim=1`` on a ``[rows, -1]`` view), never a Python loop over rows.
Accumulation is as the whole-tensor statistics' (``probe.dump.stats``): float64 on the CPU,
float32 for half types on a device; NaN makes the row's Max/Min/Mean/Norm NaN, an infinity
is kept, as torch's reductions and the whole-tensor statistics report them.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

_FLOAT_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


class TokenRows:
    """The row reductions of one tensor, started where it lives; ``values`` once fetched.

    A tensor met again unchanged (an API's output is the next one's input) shares one
    ``TokenRows``; on an accelerator with ``async_dump`` the numbers are fetched with the
    flush's other statistics (``fetch_all``), else at once."""
    __slots__ = ("parts", "per_row", "values")

    def __init__(self, parts: torch.Tensor, per_row: int):
        self.parts = parts          # [rows, 4]: Max, Min, Sum, Norm in the accumulation dtype
        self.per_row = per_row      # elements per row: Mean = Sum / per_row
        self.values: Optional[List[list]] = None

    @property
    def on_cpu(self) -> bool:
        return self.parts.device.type == "cpu"

    def resolve(self) -> List[list]:
        if self.values is None:
            self.values = _as_rows(self.parts.tolist(), self.per_row)
            self.parts = None   # type: ignore[assignment]   # the numbers are all that is kept
        return self.values


def matches(t, token_shape: Tuple[int, ...]) -> bool:
    """Whether ``t`` is a plain floating tensor whose leading dims are ``token_shape``,
    with something to summarise."""
    if type(t) not in _PLAIN_TYPES or not t.dtype.is_floating_point or t.is_meta:
        return False
    k = len(token_shape)
    return t.dim() >= k and tuple(t.shape[:k]) == token_shape and t.numel() > 0


def row_reductions(t, token_shape: Tuple[int, ...]) -> TokenRows:
    """Start the per-row reductions of ``t`` (``matches`` said yes)."""
    rows = math.prod(token_shape)
    x = t.detach().reshape(rows, -1)     # a view when the layout allows, else one copy
    acc = torch.float64 if x.device.type == "cpu" else _FLOAT_WIDE.get(x.dtype, x.dtype)
    mx = torch.amax(x, dim=1).to(acc)    # exact: a float's extremes are floats of a wider type
    mn = torch.amin(x, dim=1).to(acc)
    s = torch.sum(x, dim=1, dtype=acc)
    n = torch.linalg.vector_norm(x, dim=1, dtype=acc)
    return TokenRows(torch.stack((mx, mn, s, n), dim=1), x.shape[1])


def fetch_all(pending: List[TokenRows]) -> None:
    """Resolve every ``TokenRows`` of ``pending`` in one host transfer."""
    todo = list({id(p): p for p in pending if p.values is None}.values())   # a shared one once
    if not todo:
        return
    flat = torch.cat([p.parts.to(torch.float64).reshape(-1) for p in todo]).tolist()
    at = 0
    for p in todo:
        size = p.parts.shape[0] * 4
        p.values = _as_rows([flat[i:i + 4] for i in range(at, at + size, 4)], p.per_row)
        p.parts = None   # type: ignore[assignment]
        at += size


def _as_rows(rows: List[list], per_row: int) -> List[list]:
    for r in rows:
        r[2] = r[2] / per_row
    return rows
