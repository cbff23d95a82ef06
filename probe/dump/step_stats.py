"""An accelerator's tensor statistics written into one device buffer, fetched in one transfer.

On an accelerator a dumped step is bound by kernel launches: today's reductions of one
tensor (``stats.device_reductions``) are an ``aminmax``, a ``sum``, a ``vector_norm``, a
``stack`` and, for half types, two conversions, several hundred tensors a step. Here each
tensor takes one row ``[Max, Min, Sum, Norm]`` (float64) of a device buffer:

- where Triton imports and the tensor is a floating CUDA tensor, one fused kernel reads it
  once (max, min, sum and sum of squares together, accumulated in float32 for half types
  and float32, float64 for float64, as ``device_reductions`` accumulates) and writes the row:
  one launch for a tensor of up to ``triton_stats.ONE_PROGRAM`` elements, two above (partials of a
  grid of programs, then their combination: the order is fixed, so a dump is reproducible);
- a list argument (a foreach op's 24 or more tensors) takes its rows together: two launches
  and one table copied to the device for the list (``prefetch``), once a self-test of that
  kernel against the torch ops has passed for the dtype on the device in this process;
- elsewhere on CUDA (no Triton, integers and bools, non-contiguous tensors) the row is
  written by ``device_reductions``' own torch ops, its ``stack`` writing into the row, so
  its numbers are bitwise those of the path before this buffer (half types are widened to
  float64 there, exactly, instead of float32 then float64).

Other accelerators (NPU, XPU, MPS) keep ``device_reductions``: one vector per tensor,
joined and fetched in one transfer at the flush, as before (``wants``).

The rows of one flush are fetched with one host transfer per device (``fetch``); the next
flush starts a fresh buffer, so a row is never written twice while a ``Pending`` reading it
may still wait (a backward entry's gradients fetched after the flush).

NaN and Inf as ``device_reductions`` has them: a NaN anywhere makes Max, Min, Sum and Norm
NaN, an infinity is kept. On a device the Triton rows equal torch's within the rounding of
the summation order (``bench/cuda_check.py`` checks it when a GPU is lent).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch

from probe.dump import stats
from probe.torch_compat import aminmax

logger = logging.getLogger(__name__)
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_kernels: Optional[object] = None   # probe.dump.triton_stats once imported; False where it cannot be
# the list kernel (``prefetch``), per (device, dtype): whether its self-test agreed with the
# torch ops in this process (it has not run on every GPU and Triton); absent: not run yet
lists_verified: Dict[tuple, bool] = {}
ROWS = 1024                 # rows a buffer holds before the next one is started


def triton_kernels():
    """``probe.dump.triton_stats`` where Triton imports (looked up at the first CUDA tensor,
    not at probe's import: importing Triton takes a while), else None."""
    global _kernels
    if _kernels is None:
        try:
            from probe.dump import triton_stats
            _kernels = triton_stats
        except ImportError:   # CPU-only and NPU lines of torch, or an old Triton
            _kernels = False
    return _kernels or None


def fused_available(t) -> bool:
    """Whether ``t``'s row is written by the fused Triton kernel."""
    return (t.is_cuda and t.dtype in _TRITON_DTYPES and t.is_contiguous() and t.numel() > 0
            and triton_kernels() is not None)


def _torch_row(t, row) -> None:
    """``device_reductions``' ops, the stack written into ``row``: its numbers bitwise."""
    t = t.detach()
    dt = t.dtype
    if dt.is_floating_point:
        mn, mx = aminmax(t)   # widened to float64 by the stack: exact
        acc = stats.accumulator(t)
        s = torch.sum(t, dtype=acc)
        n = torch.linalg.vector_norm(t, dtype=acc)
    else:
        w = t.to(torch.float64)
        mn, mx = torch.aminmax(w)
        s = torch.sum(w)
        n = torch.linalg.vector_norm(w)
    torch.stack((mx, mn, s, n), out=row)


def list_kernel_agrees(device, dtype) -> bool:
    """The list kernel's self-test for ``dtype`` on ``device``, run once per process: a list of
    tensors of its own (sizes about its chunk, a view into another, a NaN, an infinity, from
    a generator of its own: the user's random state is untouched) reduced by it and by the
    torch ops, one host transfer. Where it fails or disagrees, said once, and that dtype's
    lists go one tensor at a time."""
    key = (device, dtype)
    known = lists_verified.get(key)
    if known is not None:
        return known
    try:
        kernels = triton_kernels()
        gen = torch.Generator(device=device).manual_seed(0)
        chunk = getattr(kernels, "CHUNK", 16384)
        base = torch.randn(4 * chunk + 9, generator=gen, device=device)
        tests = [(base[:n] * (k + 1) + k).to(dtype) for k, n in enumerate((1, 7, chunk, chunk + 1, 3 * chunk + 5))]
        whole = (base * 2).to(dtype)
        nan, inf = tests[2].clone(), tests[3].clone()
        nan[5] = float("nan")
        inf[0] = float("inf")
        tests += [whole[13:1013], nan, inf]
        got = torch.full((len(tests) + 1, 4), -1.0, dtype=torch.float64, device=device)
        kernels.fused_rows(tests, got, 1)   # type: ignore[union-attr]
        want = torch.empty((len(tests), 4), dtype=torch.float64, device=device)
        for k, t in enumerate(tests):
            _torch_row(t, want[k])
        if not _rows_agree(got[1:].tolist(), want.tolist(), tests) or got[0].tolist() != [-1.0] * 4:
            raise ValueError("its rows differ from the torch ops' beyond the summation order")
        lists_verified[key] = True
    except Exception as exc:
        _lists_fail(device, dtype, exc)
    return lists_verified[key]


def _lists_fail(device, dtype, exc) -> None:
    lists_verified[(device, dtype)] = False
    logger.warning("probe: the Triton statistics kernel for lists failed on %s for %s (%s: %s); a foreach "
                   "op's tensors are reduced one at a time", device, dtype, type(exc).__name__, exc)


def _rows_agree(got: list, want: list, tensors: list) -> bool:
    """Rows [Max, Min, Sum, Norm] equal but for the summation order: extremes exact (NaN
    where the other is), Sum within 1e-3 of the Norm times sqrt(n), Norm within 1e-3."""
    for (mx, mn, s, n), (wmx, wmn, ws, wn), t in zip(got, want, tensors):
        if wmx != wmx:   # a NaN in the tensor: all four NaN
            if not all(v != v for v in (mx, mn, s, n)):
                return False
            continue
        if (mx, mn) != (wmx, wmn):
            return False
        if not (abs(n - wn) <= 1e-3 * abs(wn) and abs(s - ws) <= 1e-3 * (abs(wn) * t.numel() ** 0.5 + 1e-30)) \
                and not (s == ws and n == wn):   # infinities
            return False
    return True


class StepStats:
    """The rows of one flush's accelerator tensors, one buffer (or a few) per device.

    ``add`` starts a tensor's reductions into its row and returns the ``stats.Pending``
    whose ``parts`` is that row; ``fetch`` turns pending results into numbers with one
    host transfer per device (its buffers' used rows, joined on the device first) and
    starts fresh buffers for the next flush. ``on_cpu`` (tests) routes CPU tensors here
    too, through the torch ops.
    """

    on_cpu = False   # tests: CPU tensors take this path too (with SummaryCache.defer_on_cpu)

    def __init__(self, rows: int = ROWS):
        self.rows = rows
        self._open: Dict[torch.device, list] = {}   # device -> [buffer, rows used]
        self._ready: Dict[int, tuple] = {}          # id -> (tensor, version, buffer, row): prefetched rows
        self.transfers = 0                          # host transfers made by fetch (tests, bench)
        self.launches_fused = 0                     # rows written by the Triton kernel
        self.lists_fused = 0                        # lists written by the list kernel (prefetch)

    def wants(self, t) -> bool:
        """A plain CUDA tensor (or, for tests, a CPU one). Other devices keep
        ``device_reductions``' vectors, joined at the flush (one transfer there too): NPU,
        MPS and XPU lines differ in what float64 ops they have, and the buffer is float64.
        A subclass (a compile's FakeTensor, a functional collective's wrapper) as well."""
        if type(t) not in _PLAIN:
            return False
        return t.is_cuda or (self.on_cpu and t.is_cpu)

    def add(self, t) -> Optional[stats.Pending]:
        if self._ready:
            ready = self._ready.pop(id(t), None)
            if ready is not None and ready[0] is t and ready[1] == t._version:
                buf, row = ready[2], ready[3]
                return stats.Pending(t.dtype, t.numel(), buf[row], (buf, row))
        if t.numel() == 0 or t.is_complex() or t.is_meta:
            return None
        slot = self._open.get(t.device)
        if slot is None or slot[1] == self.rows:
            slot = self._open[t.device] = [torch.empty((self.rows, 4), dtype=torch.float64, device=t.device), 0]
        buf, used = slot
        row = buf[used]
        slot[1] = used + 1
        if fused_available(t) and self._fused(t, row):
            self.launches_fused += 1
        else:
            _torch_row(t, row)
        return stats.Pending(t.dtype, t.numel(), row, (buf, used))

    @staticmethod
    def _fused(t, row) -> bool:
        """The Triton kernel writes ``row``; where it fails (a Triton or driver it does not
        compile for), said once and the torch ops take over for the rest of the process."""
        global _kernels
        try:
            triton_kernels().fused_row(t, row)   # type: ignore[union-attr]
            return True
        except Exception as exc:
            _kernels = False
            logger.warning("probe: the fused Triton statistics kernel failed (%s: %s); "
                           "statistics are computed with torch ops from here on", type(exc).__name__, exc)
            return False

    def prefetch(self, values) -> bool:
        """Start the rows of the tensors in ``values`` (an argument that is a list: a foreach
        op's) together, two launches per dtype and device (``triton_stats.fused_rows``)
        where one or three per tensor would be; ``add`` then hands out the row of each. Called
        where the list is described, so the rows read what the call sees; ``forget_prefetched``
        after it. The list kernel is used for a dtype on a device only once its self-test
        there agreed with the torch ops (``list_kernel_agrees``). Returns whether any row was
        started (then ``forget_prefetched`` is due)."""
        if triton_kernels() is None:
            return False
        groups: Dict[tuple, list] = {}
        for t in values:
            # an inference tensor has no version to check at ``add``: it goes alone
            if type(t) in _PLAIN and fused_available(t) and not t.is_inference():
                groups.setdefault((t.device, t.dtype), []).append(t)
        for (device, dtype), ts in groups.items():
            if len(ts) < 2 or not list_kernel_agrees(device, dtype):
                continue
            for at in range(0, len(ts), self.rows):
                part = ts[at:at + self.rows]
                slot = self._open.get(device)
                if slot is None or slot[1] + len(part) > self.rows:
                    slot = self._open[device] = [torch.empty((self.rows, 4), dtype=torch.float64, device=device), 0]
                buf, first = slot
                try:
                    triton_kernels().fused_rows(part, buf, first)   # type: ignore[union-attr]
                except Exception as exc:
                    _lists_fail(device, dtype, exc)
                    break
                slot[1] = first + len(part)
                self.lists_fused += 1
                for k, t in enumerate(part):
                    self._ready[id(t)] = (t, t._version, buf, first + k)
        return bool(self._ready)

    def forget_prefetched(self) -> None:
        """Drop rows prefetched and not taken (a tensor the summary cache already had)."""
        self._ready.clear()

    def restart(self) -> None:
        """Fresh buffers from here on: rows already handed out keep theirs alive."""
        self._open = {}

    def fetch(self, pending: List) -> List[tuple]:
        """(Max, Min, Mean, Norm) per item of ``pending`` (results of ``stats.reductions``):
        the rows of this buffer's Pendings in one transfer per device, anything else as
        ``stats.fetch`` does it; then fresh buffers."""
        mine = [p for p in pending if type(p) is stats.Pending and p.slot is not None]
        buffers: Dict[int, tuple] = {}
        for p in mine:   # buffer -> the highest row used
            assert p.slot is not None
            buf, i = p.slot
            have = buffers.get(id(buf))
            if have is None or have[1] < i:
                buffers[id(buf)] = (buf, i)
        by_device: Dict[torch.device, list] = {}
        for buf, last in buffers.values():
            by_device.setdefault(buf.device, []).append((buf, last))
        host: Dict[int, list] = {}
        for parts in by_device.values():
            if len(parts) == 1:
                buf, last = parts[0]
                rows = buf[:last + 1].tolist()
            else:
                rows = torch.cat([buf[:last + 1] for buf, last in parts]).tolist()
            self.transfers += 1
            at = 0
            for buf, last in parts:
                host[id(buf)] = rows[at:at + last + 1]
                at += last + 1
        others = iter(stats.fetch([p for p in pending if not (type(p) is stats.Pending and p.slot is not None)]))
        out = []
        for p in pending:
            if type(p) is stats.Pending and p.slot is not None:
                out.append(stats.numbers(p, *host[id(p.slot[0])][p.slot[1]]))
            else:
                out.append(next(others))
        self.restart()
        return out
