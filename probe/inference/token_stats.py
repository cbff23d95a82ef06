"""Per-token statistics: one ``[Max, Min, Mean, Norm]`` per token row of a tensor.

An inference step mixes requests in its token dimension(s), so a whole-tensor summary
cannot say which request a difference belongs to. When the step has a token layout, every
floating tensor whose leading dims equal the layout's ``token_shape`` also gets
``"token_stats"`` in dump.json: its rows (the layout's rows, flattened in the same order),
each summarised over its remaining elements. The compare gathers one request's rows from
every step by it.

One batched reduction per tensor over the trailing dims, never a Python loop over rows: on
the CPU the whole-tensor statistics' compiled one-pass loop, run row by row
(``stats.row_summaries``: the same float64 accumulation and NaN/Inf rules, about the cost of
the whole-tensor summary); elsewhere ``amax``/``amin``/``sum``/``vector_norm`` with
``dim=1`` on a ``[rows, -1]`` view, accumulated as the whole-tensor statistics are there
(float32 for half types). A NaN makes the row's Max/Min/Mean/Norm NaN, an infinity is kept.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from probe.dump import stats

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


class TokenRows:
    """The row reductions of one tensor, started where it lives; ``values`` once fetched.

    A tensor met again unchanged (an API's output is the next one's input) shares one
    ``TokenRows``; on an accelerator with ``async_dump`` the numbers are fetched with the
    flush's other statistics (``fetch_all``), else at once."""
    __slots__ = ("parts", "per_row", "values")

    def __init__(self, parts: Optional[torch.Tensor], per_row: int):
        self.parts = parts          # [rows, 4]: Max, Min, Sum, Norm in the accumulation dtype
        self.per_row = per_row      # elements per row: Mean = Sum / per_row
        self.values: Optional[List[list]] = None

    @property
    def on_cpu(self) -> bool:
        return self.parts is None or self.parts.device.type == "cpu"

    def resolve(self) -> List[list]:
        if self.values is None:
            assert self.parts is not None   # parts go only when values come
            self.values = _as_rows(self.parts.tolist(), self.per_row)
            self.parts = None   # the numbers are all that is kept
        return self.values


def matches(t, token_shape: Tuple[int, ...]) -> bool:
    """Whether ``t`` is a plain floating tensor whose leading dims are ``token_shape``,
    with something to summarise."""
    if type(t) not in _PLAIN_TYPES or not t.dtype.is_floating_point or t.is_meta:
        return False
    # a torch.Size equals the tuple of its dims; one shorter than token_shape differs
    return t.shape[:len(token_shape)] == token_shape and t.numel() > 0


def row_reductions(t, token_shape: Tuple[int, ...]) -> TokenRows:
    """Start the per-row reductions of ``t`` (``matches`` said yes): a CPU tensor is
    summarised at once by the whole-tensor statistics' compiled loop, row by row."""
    rows = math.prod(token_shape)
    done = stats.row_summaries(t, rows)
    if done is not None:
        out = TokenRows(None, t.numel() // rows)
        out.values = done
        return out
    return device_row_reductions(t, rows)


def device_row_reductions(t, rows: int) -> TokenRows:
    """The per-row reductions of ``t`` seen as ``[rows, -1]``, started where it lives (no
    host sync until ``resolve``/``fetch_all``): every tensor but a plain CPU one."""
    x = t.detach().reshape(rows, -1)     # a view when the layout allows, else one copy
    acc = stats.accumulator(x)
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
    parts = [p.parts for p in todo if p.parts is not None]   # every one: values None
    flat = torch.cat([x.to(torch.float64).reshape(-1) for x in parts]).tolist()
    at = 0
    for p, x in zip(todo, parts):
        size = x.shape[0] * 4
        p.values = _as_rows([flat[i:i + 4] for i in range(at, at + size, 4)], p.per_row)
        p.parts = None
        at += size


def _as_rows(rows: List[list], per_row: int) -> List[list]:
    for r in rows:
        r[2] = r[2] / per_row
    return rows
