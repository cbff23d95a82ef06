"""The fused statistics kernel: Max, Min, Sum and Norm of a CUDA tensor in one pass.

Imported only where Triton is (``step_stats.triton_kernels``); raises ImportError elsewhere.
``fused_row(t, row)`` writes ``[Max, Min, Sum, Norm]`` of contiguous floating tensor ``t``
into ``row``, a float64 4-vector on its device (a row of ``step_stats.StepStats``' buffer):

- accumulated as ``stats.device_reductions`` accumulates (float32 for half types and
  float32, float64 for float64), cast to float64 when stored (exact);
- a tensor of up to ``ONE_PROGRAM`` elements is read by one program: one launch; a larger
  one by a grid of at most ``MAX_PROGRAMS`` programs writing partials, then one program
  combining them: two launches, in a fixed order (the same dump on a rerun);
- a NaN anywhere makes all four NaN (Sum and Norm are NaN by arithmetic, Max and Min by a
  count of NaNs, as ``tl.maximum`` does not propagate them); an infinity is kept.

The numbers equal torch's within the rounding of the summation order; the check is
``tests/test_step_stats.py``'s fused test, which runs where a CUDA device and Triton are.
"""
import torch
import triton
import triton.language as tl

BLOCK = 1024               # elements a program reads at a time
ONE_PROGRAM = 1 << 16      # up to this many elements, one program reads the tensor whole
MAX_PROGRAMS = 1024        # above it, a grid of at most this many programs
_ACC = {torch.float64: tl.float64}   # any other floating dtype accumulates in float32


@triton.jit
def _partial_stats(x_ptr, n, out_ptr, BLOCK: tl.constexpr, ACC: tl.constexpr, FINAL: tl.constexpr):
    """Program ``pid`` reads blocks pid, pid + programs, ... of ``x``. FINAL (one program):
    the row [Max, Min, Sum, Norm] as float64 at ``out_ptr``; else the partial
    [Max, Min, Sum, Sum of squares, NaN count] at row ``pid`` of ``out_ptr`` (float64)."""
    pid = tl.program_id(0)
    stride = tl.num_programs(0) * BLOCK
    hi = tl.full([BLOCK], float("-inf"), ACC)
    lo = tl.full([BLOCK], float("inf"), ACC)
    s = tl.zeros([BLOCK], ACC)
    q = tl.zeros([BLOCK], ACC)
    nan = tl.zeros([BLOCK], tl.int32)
    for start in range(pid * BLOCK, n, stride):
        offs = start + tl.arange(0, BLOCK)
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside, other=0.0).to(ACC)
        nan += (x != x).to(tl.int32)
        hi = tl.where(inside, tl.maximum(hi, x), hi)
        lo = tl.where(inside, tl.minimum(lo, x), lo)
        s += x
        q += x * x
    hi_all = tl.max(hi, 0)
    lo_all = tl.min(lo, 0)
    s_all = tl.sum(s, 0)
    q_all = tl.sum(q, 0)
    nan_all = tl.sum(nan, 0)
    if FINAL:
        bad = nan_all > 0
        tl.store(out_ptr + 0, tl.where(bad, float("nan"), hi_all).to(tl.float64))
        tl.store(out_ptr + 1, tl.where(bad, float("nan"), lo_all).to(tl.float64))
        tl.store(out_ptr + 2, s_all.to(tl.float64))
        tl.store(out_ptr + 3, tl.sqrt(q_all).to(tl.float64))
    else:
        row = out_ptr + pid * 5
        tl.store(row + 0, hi_all.to(tl.float64))
        tl.store(row + 1, lo_all.to(tl.float64))
        tl.store(row + 2, s_all.to(tl.float64))
        tl.store(row + 3, q_all.to(tl.float64))
        tl.store(row + 4, nan_all.to(tl.float64))


@triton.jit
def _combine_stats(part_ptr, programs, out_ptr, ACC: tl.constexpr, P: tl.constexpr):
    """The row [Max, Min, Sum, Norm] of ``programs`` partials, combined in the accumulation
    dtype they were made in (their float64 copies are exact)."""
    i = tl.arange(0, P)
    inside = i < programs
    hi = tl.load(part_ptr + i * 5 + 0, mask=inside, other=float("-inf")).to(ACC)
    lo = tl.load(part_ptr + i * 5 + 1, mask=inside, other=float("inf")).to(ACC)
    s = tl.load(part_ptr + i * 5 + 2, mask=inside, other=0.0).to(ACC)
    q = tl.load(part_ptr + i * 5 + 3, mask=inside, other=0.0).to(ACC)
    nan = tl.load(part_ptr + i * 5 + 4, mask=inside, other=0.0)
    bad = tl.sum(nan, 0) > 0
    tl.store(out_ptr + 0, tl.where(bad, float("nan"), tl.max(hi, 0)).to(tl.float64))
    tl.store(out_ptr + 1, tl.where(bad, float("nan"), tl.min(lo, 0)).to(tl.float64))
    tl.store(out_ptr + 2, tl.sum(s, 0).to(tl.float64))
    tl.store(out_ptr + 3, tl.sqrt(tl.sum(q, 0)).to(tl.float64))


def fused_row(t, row) -> None:
    """[Max, Min, Sum, Norm] of contiguous floating CUDA tensor ``t`` into ``row``."""
    x = t.detach().reshape(-1)
    n = x.numel()
    acc = _ACC.get(t.dtype, tl.float32)
    if n <= ONE_PROGRAM:
        _partial_stats[(1,)](x, n, row, BLOCK=BLOCK, ACC=acc, FINAL=True)
        return
    programs = min(MAX_PROGRAMS, triton.cdiv(n, BLOCK))
    partials = torch.empty((programs, 5), dtype=torch.float64, device=t.device)
    _partial_stats[(programs,)](x, n, partials, BLOCK=BLOCK, ACC=acc, FINAL=False)
    _combine_stats[(1,)](partials, programs, row, ACC=acc, P=triton.next_power_of_2(programs))


CHUNK = 16384              # elements one program of the list kernel reads (16 blocks)
SPAN_BLOCK = 128           # partials the list combination reads at a time


@triton.jit
def _chunk_stats(x_ptr, table_ptr, part_ptr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, ACC: tl.constexpr):
    """Program ``i`` reads item ``i`` of ``table`` (int64 triples: the tensor's offset from
    ``x_ptr`` in elements, then its elements [start, end)) and writes the partial
    [Max, Min, Sum, Sum of squares, NaN count] at row ``i`` of ``part_ptr`` (float64)."""
    i = tl.program_id(0)
    base = tl.load(table_ptr + i * 3)
    start = tl.load(table_ptr + i * 3 + 1)
    end = tl.load(table_ptr + i * 3 + 2)
    hi = tl.full([BLOCK], float("-inf"), ACC)
    lo = tl.full([BLOCK], float("inf"), ACC)
    s = tl.zeros([BLOCK], ACC)
    q = tl.zeros([BLOCK], ACC)
    nan = tl.zeros([BLOCK], tl.int32)
    for off in range(0, CHUNK, BLOCK):
        offs = start + off + tl.arange(0, BLOCK)
        inside = offs < end
        x = tl.load(x_ptr + base + offs, mask=inside, other=0.0).to(ACC)
        nan += (x != x).to(tl.int32)
        hi = tl.where(inside, tl.maximum(hi, x), hi)
        lo = tl.where(inside, tl.minimum(lo, x), lo)
        s += x
        q += x * x
    row = part_ptr + i * 5
    tl.store(row + 0, tl.max(hi, 0).to(tl.float64))
    tl.store(row + 1, tl.min(lo, 0).to(tl.float64))
    tl.store(row + 2, tl.sum(s, 0).to(tl.float64))
    tl.store(row + 3, tl.sum(q, 0).to(tl.float64))
    tl.store(row + 4, tl.sum(nan, 0).to(tl.float64))


@triton.jit
def _combine_spans(part_ptr, span_ptr, out_ptr, ACC: tl.constexpr, P: tl.constexpr):
    """Program ``j`` combines partials [lo, hi) of span ``j`` (int64 triples lo, hi, row) into
    row ``row`` [Max, Min, Sum, Norm] of ``out_ptr``, in a fixed order (reproducible)."""
    j = tl.program_id(0)
    first = tl.load(span_ptr + j * 3)
    last = tl.load(span_ptr + j * 3 + 1)
    row = tl.load(span_ptr + j * 3 + 2)
    hi = tl.full([P], float("-inf"), ACC)
    lo = tl.full([P], float("inf"), ACC)
    s = tl.zeros([P], ACC)
    q = tl.zeros([P], ACC)
    nan = tl.zeros([P], tl.float64)
    for b in range(first, last, P):
        k = b + tl.arange(0, P)
        inside = k < last
        hi = tl.maximum(hi, tl.load(part_ptr + k * 5 + 0, mask=inside, other=float("-inf")).to(ACC))
        lo = tl.minimum(lo, tl.load(part_ptr + k * 5 + 1, mask=inside, other=float("inf")).to(ACC))
        s += tl.load(part_ptr + k * 5 + 2, mask=inside, other=0.0).to(ACC)
        q += tl.load(part_ptr + k * 5 + 3, mask=inside, other=0.0).to(ACC)
        nan += tl.load(part_ptr + k * 5 + 4, mask=inside, other=0.0)
    bad = tl.sum(nan, 0) > 0
    out = out_ptr + row * 4
    tl.store(out + 0, tl.where(bad, float("nan"), tl.max(hi, 0)).to(tl.float64))
    tl.store(out + 1, tl.where(bad, float("nan"), tl.min(lo, 0)).to(tl.float64))
    tl.store(out + 2, tl.sum(s, 0).to(tl.float64))
    tl.store(out + 3, tl.sqrt(tl.sum(q, 0)).to(tl.float64))


def fused_rows(tensors, buf, first: int) -> None:
    """[Max, Min, Sum, Norm] of each of ``tensors`` (contiguous, one floating dtype, one CUDA
    device) into rows ``first``, ``first + 1``, ... of ``buf``: two launches for the whole
    list, and one host-to-device copy of its table (a foreach op's lists hold most of a
    training step's tensors: one launch or three each was most of a dumped step's time on an
    H200). The tensors are read through the first one's pointer, at their distance from it
    in elements (same dtype: a whole number of them)."""
    x0 = tensors[0].detach().reshape(-1)
    origin, size = x0.data_ptr(), x0.element_size()
    table: list = []
    spans: list = []
    for k, t in enumerate(tensors):
        n = t.numel()
        base = (t.data_ptr() - origin) // size
        lo = len(table) // 3
        for start in range(0, n, CHUNK):
            table += (base, start, min(n, start + CHUNK))
        spans += (lo, len(table) // 3, first + k)
    items = len(table) // 3
    # from pageable memory, non_blocking: staged at once, no wait for the device
    index = torch.tensor(table + spans, dtype=torch.int64).to(x0.device, non_blocking=True)
    partials = torch.empty((items, 5), dtype=torch.float64, device=x0.device)
    acc = _ACC.get(x0.dtype, tl.float32)
    _chunk_stats[(items,)](x0, index, partials, BLOCK=BLOCK, CHUNK=CHUNK, ACC=acc)
    _combine_spans[(len(tensors),)](partials, index[3 * items:], buf, ACC=acc, P=SPAN_BLOCK)
