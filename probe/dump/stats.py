"""Tensor summaries: Max/Min/Mean/Norm (and the CRC32 "md5") of every dumped tensor.

Reductions run in float32 or wider, so bf16/fp16 summaries are not rounded to the
tensor's own precision. A CPU tensor is summarised in one pass by the compiled
``_cstats`` extension (float64 accumulators) when it was built, else through numpy and
torch (a few calls per tensor), whose sums accumulate in float64 too: the two paths give
the same statistics (a float32 sum of HF's additive attention mask, 0 or float32's min,
overflowed to a Mean of -inf on a machine without a compiler, and a bf16 GPT-2 compare
named the mask's add with an infinite error). For a plain contiguous CPU tensor the
extension builds the whole summary dict, checks included. A tensor met again unchanged (the output of one API is
the input of the next) is summarised once, recognised by identity and its version counter.

On CUDA/NPU the scalars of one call are stacked on the device and fetched with a single
host transfer (``fetch``), never one ``.item()`` per scalar.
"""
import math
import weakref
import zlib
from typing import NamedTuple, Optional

import numpy as np
import torch

from probe.torch_compat import aminmax

FLOAT_WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}   # the accumulation dtype of half types


def accumulator(t):
    """The dtype a floating tensor's Sum and Norm accumulate in: float64 on the CPU, as
    ``_cstats`` does (a float32 attention mask of -3.4e38 overflows a float32 sum); on a
    device the dtype's own width, float32 at least."""
    return torch.float64 if t.is_cpu else FLOAT_WIDE.get(t.dtype, t.dtype)


_NUMPY_FAST = (torch.float32, torch.float64)
_DOT_SAFE = {torch.float32: 1e38, torch.float64: 1e307}
_maximum = np.maximum.reduce
_minimum = np.minimum.reduce
_add = np.add.reduce
_NO_STATS = (None, None, None, None)

try:
    from probe.dump import _cstats
except ImportError:   # built without a C compiler: the numpy/torch path below
    _cstats = None  # type: ignore[assignment]

_KINDS = {} if _cstats is None else {
    torch.float32: _cstats.KIND_F32, torch.float64: _cstats.KIND_F64,
    torch.bfloat16: _cstats.KIND_BF16, torch.float16: _cstats.KIND_F16,
    torch.int64: _cstats.KIND_I64, torch.int32: _cstats.KIND_I32, torch.int16: _cstats.KIND_I16,
    torch.int8: _cstats.KIND_I8, torch.uint8: _cstats.KIND_U8, torch.bool: _cstats.KIND_BOOL}
# Only tensors whose data_ptr() is their own memory: subclasses may wrap other storage.
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_STRIDED = torch.strided
# an extension built before summarize_rows existed (not rebuilt since): torch's row reductions
_summarize_rows = getattr(_cstats, "summarize_rows", None)
# ... or before summary() took a token_shape: the rows come from token_stats.py
_with_rows = None if _cstats is None or "token_shape" not in (_cstats.summary.__doc__ or "") else _cstats.summary
if _cstats is not None:   # what its summary() needs: the common case's whole dict in C
    _cstats.setup(tuple(_PLAIN_TYPES), _KINDS, {dt: str(dt) for dt in _KINDS}, _STRIDED)


def reductions(t, rows=None):
    """Start the reductions of ``t`` on its device; ``fetch`` turns them into numbers.

    A CPU float32/float64 tensor is summarised on the spot: the (Max, Min, Mean, Norm)
    tuple itself is returned. Returns None for tensors with nothing to reduce (empty,
    complex, meta), else a ``Pending``. ``rows``: a ``step_stats.StepStats`` whose device
    buffer takes an accelerator tensor's results (one fused kernel where Triton runs).
    """
    if rows is not None and rows.wants(t):
        return rows.add(t)
    dt = t.dtype
    kind = _KINDS.get(dt)
    if kind is not None and type(t) in _PLAIN_TYPES and t.is_cpu and t.layout is _STRIDED and not t.is_neg():
        n = t.numel()
        if not n:
            return None
        if not t.is_contiguous():
            t = t.detach().contiguous()   # detached: no autograd node for probe's copy
        return _cstats.summarize(t.data_ptr(), n, kind)
    if dt in _NUMPY_FAST and t.is_cpu:
        try:
            flat = numpy_of(t).reshape(-1)   # refuses neg/conj views: slow path
        except (RuntimeError, TypeError):
            flat = None
        if flat is not None and flat.size:
            return _cpu_float_summary(t, flat)
    return device_reductions(t)


def row_summaries(t, rows):
    """One [Max, Min, Mean, Norm] per row of ``t`` seen as ``[rows, -1]``, reduced in one
    compiled pass exactly as ``reductions`` reduces a whole tensor, for a plain CPU tensor
    of a floating dtype ``_cstats`` reads; None for every other tensor (the caller reduces
    it with torch)."""
    kind = _KINDS.get(t.dtype)
    if (kind is None or _summarize_rows is None or not t.dtype.is_floating_point or type(t) not in _PLAIN_TYPES or not t.is_cpu
            or t.layout is not _STRIDED or t.is_neg() or not t.numel()):
        return None
    if not t.is_contiguous():
        t = t.detach().contiguous()
    return _summarize_rows(t.data_ptr(), rows, t.numel() // rows, kind)


def device_reductions(t):
    """The reductions of ``t`` started where it lives, as 0-d tensors (a ``Pending``):
    no host sync until ``fetch``. The path of every accelerator tensor."""
    dt = t.dtype
    if t.numel() == 0 or t.is_complex() or t.is_meta:
        return None
    t = t.detach()
    if dt.is_floating_point:
        acc = accumulator(t)
        mn, mx = aminmax(t)   # widened by the stack below (type promotion): exact, no conversion each
        s = torch.sum(t, dtype=acc)
        n = torch.linalg.vector_norm(t, dtype=acc)
    else:  # ints and bools: exact in float64
        w = t.to(torch.float64)
        mn, mx = torch.aminmax(w)
        s = torch.sum(w)
        n = torch.linalg.vector_norm(w)
    # one vector per tensor: the flush concatenates them and converts once (bench/cuda_profile.py:
    # four conversions per tensor took a quarter of a dumped step on an H200)
    return Pending(dt, t.numel(), torch.stack((mx, mn, s, n)))


class Pending(NamedTuple):
    """Reductions started on the device, waiting for ``fetch``."""
    dtype: torch.dtype
    numel: int
    parts: torch.Tensor   # Max, Min, Sum, Norm, one vector in the accumulation's dtype
    slot: Optional[tuple] = None   # (buffer, row) where ``parts`` is a row of a StepStats buffer


def _cpu_float_summary(t, flat):
    """(Max, Min, Mean, Norm) of a CPU float32/float64 tensor through numpy, 1.5-2x faster
    than torch here (torch.aminmax alone costs more than numpy's max and min). The sum
    accumulates in float64, as ``_cstats`` does: a float32 one overflows where the values
    are near float32's limits (an additive mask) and loses digits on large tensors."""
    mx = float(_maximum(flat))
    mn = float(_minimum(flat))
    size = flat.size
    big = max(mx, -mn)
    if big * big * size < _DOT_SAFE[t.dtype]:  # finite, and x*x cannot overflow
        # numpy's float64 pairwise sum: 5x cheaper than torch's float64 one on large tensors
        s = float(_add(flat, dtype=np.float64))
        n = math.sqrt(float(flat.dot(flat)))
    else:  # NaN, Inf or huge values: torch, which neither warns nor overflows
        t = t.detach()
        s = torch.sum(t, dtype=torch.float64).item()
        n = torch.linalg.vector_norm(t, dtype=torch.float64).item()
    return mx, mn, s / size, n


def fetch(pending):
    """(Max, Min, Mean, Norm) for each result of ``reductions``, in one host transfer."""
    pending = [None if type(p) is Pending and _fake(p.parts) else p for p in pending]
    vectors = [p.parts for p in pending if type(p) is Pending]
    values = iter(())
    if vectors:
        if vectors[0].device.type == "cpu":
            values = iter([x for v in vectors for x in v.tolist()])  # no device sync on the CPU
        else:
            # cat promotes float32 vectors beside float64 ones exactly; one conversion after
            values = iter(torch.cat(vectors).to(torch.float64).tolist())
    out = []
    for p in pending:
        if p is None:
            out.append(_NO_STATS)
            continue
        if type(p) is not Pending:   # summarised on the spot
            out.append(p)
            continue
        out.append(numbers(p, next(values), next(values), next(values), next(values)))
    return out


def numbers(p, mx, mn, s, n):
    """(Max, Min, Mean, Norm) of ``Pending`` ``p`` from its fetched parts."""
    dtype = p.dtype
    if dtype == torch.bool:
        mx, mn = bool(mx), bool(mn)
    elif not dtype.is_floating_point:
        mx, mn = int(mx), int(mn)
    return (mx, mn, s / p.numel, n)


def _fake(t):
    """A compile's fake tensor (a call recorded while inductor compiled, on a thread probe's
    guard did not cover): it has no numbers, and fetching it would fail the whole flush."""
    return type(t) is not torch.Tensor and type(t).__name__ == "FakeTensor"


def torch_copy(t):
    """A detached CPU torch copy with its own storage, keeping dtype (bf16 too) and, for a
    dense tensor, its strides: what ``torch.save`` writes for file_format "pt" (a saved view
    would carry its whole base) and what the toolbox's captures replay."""
    return t.detach().to("cpu", copy=True)


def numpy_of(t):
    """A numpy array over a CPU tensor's memory (no copy), leaving the tensor as it was:
    ``Tensor.numpy()`` marks the tensor's storage non-resizable for good, and FSDP2 frees
    each unsharded parameter after its forward by resizing its storage to 0 (a tensor dump
    failed it: "Trying to resize storage that is not resizable"). DLPack shares the memory
    without that mark; a tensor it cannot export is copied first.

    A functional collective's result (``AsyncCollectiveTensor``, a DTensor's local shard
    after a redistribution) is waited for first: DLPack reads its buffer as it is, before
    the collective has written it (a TP run's tensor dump held the memory's previous
    contents, now and then); its own ``numpy()`` waits, DLPack does not."""
    if getattr(type(t), "trigger_wait", None) is not None:
        t = t.trigger_wait()
    t = t.detach()
    if not (t.is_neg() or t.is_conj()):      # DLPack would share the memory without the bit
        try:
            return np.from_dlpack(t)
        except (BufferError, RuntimeError, TypeError, AttributeError):
            pass
    return t.to("cpu", copy=True).resolve_conj().resolve_neg().numpy()


def host_copy(t):
    """A CPU numpy copy for a tensor file (numpy has no bfloat16: stored as float32)."""
    t = t.detach()
    if t.is_cpu and t.dtype != torch.bfloat16:
        try:
            return numpy_of(t).copy()   # cheaper than a torch copy for small tensors
        except (RuntimeError, TypeError):   # neg/conj views, dtypes numpy lacks
            pass
    if t.dtype == torch.bfloat16:
        t = t.to("cpu", torch.float32)
    else:
        t = t.to("cpu", copy=True)
    return t.resolve_conj().resolve_neg().numpy()


def crc32(t):
    """8-hex CRC32 of the tensor's bytes (msprobe's summary_mode "md5")."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    arr = numpy_of(t.cpu().contiguous())
    return f"{zlib.crc32(arr) & 0xFFFFFFFF:08x}"


class SummaryCache:
    """Summaries of tensors already seen this step, keyed by identity and version.

    Cleared at each step, so memory stays flat; a weakref proves the id was not reused.
    An inference tensor (made under ``torch.inference_mode``) has no version counter: it is
    never cached, since nothing would tell that it changed. Per-token statistics
    (``probe.inference.token_stats``) are kept beside the summaries by the same rule.
    """

    deferred = None        # async_dump: a list of summaries whose numbers are fetched at flush
    step_stats = None      # async_dump: the device buffer accelerator tensors' results go into
    defer_on_cpu = False   # tests: CPU tensors wait for fetch too, as an accelerator's do

    def __init__(self):
        self._entries = {}
        self._rows = {}    # id -> (weakref, version, token_stats.TokenRows)

    def clear(self):
        self._entries.clear()
        self._rows.clear()

    def summary(self, t, token_shape=None):
        """dump.json's summary dict of ``t`` (type, dtype, shape, Max, Min, Mean, Norm,
        requires_grad) in one compiled call, for a plain contiguous CPU tensor of a dtype
        ``_cstats`` reads; None for every other tensor, which takes ``reductions``' path.
        With ``token_shape`` (an inference step's), an inference tensor of a floating dtype
        whose leading dims are it gets its ``token_stats`` in the same call, from the rows
        ``token_stats.row_reductions`` would reduce (its other tensors' rows are cached
        beside their summaries there)."""
        if _cstats is None or self.defer_on_cpu:
            return None
        if token_shape is None or _with_rows is None:
            return _cstats.summary(t, self._entries)
        return _with_rows(t, self._entries, token_shape)

    def lookup(self, t):
        return _valid(self._entries.get(id(t)), t)

    def lookup_rows(self, t):
        return _valid(self._rows.get(id(t)), t)

    def forget(self, value):
        """Drop the summaries of ``value`` (a tensor or a list of them), which an in-place
        API just wrote: a write below autograd (a dispatch mode, some foreach kernels under
        one) leaves the version counter as it was, so the version alone cannot say so."""
        for t in value if isinstance(value, (list, tuple)) else (value,):
            self._entries.pop(id(t), None)
            self._rows.pop(id(t), None)
            local = getattr(t, "_local_tensor", None)   # a DTensor: its shard is what was summarised
            if local is not None:
                self._entries.pop(id(local), None)

    def store(self, t, value):
        _store(self._entries, t, value)

    def store_rows(self, t, rows):
        _store(self._rows, t, rows)


def _valid(hit, t):
    if hit is not None and hit[0]() is t and hit[1] == t._version:
        return hit[2]
    return None


def _store(entries, t, value):
    if torch.is_inference(t):   # no version counter: a later in-place write could not be seen
        return
    try:
        entries[id(t)] = (weakref.ref(t), t._version, value)
    except TypeError:  # not weak-referenceable: just don't cache
        pass
