"""Align two API call sequences that differ, so rows pair with their true counterpart.

Exact-name matching (msprobe's) pairs ``Tensor.__add__.5`` with ``Tensor.__add__.5`` even
when one side made an extra add earlier, i.e. it compares unrelated tensors from there on.
Here calls are aligned as sequences:

1. anchors: calls whose signature (API without counter, input shapes, output shapes)
   occurs equally often on both sides pair k-th with k-th; a longest increasing
   subsequence keeps the anchors that agree in order (patience diff);
2. each stretch between anchors is aligned again with the counts of that stretch (what
   is ambiguous globally is often unique locally), then by an edit-distance DP whose
   cost uses API name, shapes, dtypes, statistics and module path; large stretches get a
   band around their diagonal, so work stays near-linear in the dump length;
3. an unpaired run on one side facing an unpaired run on the other, with the same
   output shapes at its end or input shapes at its start, is a group (one fused NPU API
   vs several bench APIs); its tensors pair by shape and statistics.

Calls in, ops out: ``("pair", i, j, how)``, ``("npu", i)``, ``("bench", j)``,
``("group", [i...], [j...])``; ``rows_from_ops`` turns them into row pairs.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from dataclasses import dataclass

from .rows import Row
from probe.python_compat import SLOTS
from probe.vocabulary import direction, entry_key, parse_entry_name

INDEL = 1.0                 # cost of leaving one call unpaired
NO_PAIR = math.inf          # different APIs never pair one-to-one
FULL_DP_CELLS = 250_000     # a stretch up to this many cells gets the full DP
BAND = 48                   # otherwise: |n - m| + BAND cells on each side of the diagonal
MAX_BAND_CELLS = 4_000_000  # beyond that the stretch pairs calls of each API in order
GROUP_LINK = 0.2            # statistics distance below which tensors of a group pair up


@dataclass(**SLOTS)
class Call:
    """One dump.json entry of one side, summarised for alignment."""
    entry: str
    key: str                 # API with the counter removed: Functional.linear.forward
    base: str                # bare API name, prefix-free: linear, add (from __add__ / add_)
    direction: str
    start: int               # rows[start:stop] belong to this call
    stop: int
    in_shapes: tuple
    out_shapes: tuple
    dtypes: tuple
    stats: tuple             # Max/Min/Mean/Norm of every tensor row, flattened
    module: str | None = None

    @property
    def sig(self) -> tuple:
        return (self.key, self.in_shapes, self.out_shapes)


def call_key(entry: str) -> str:
    """The entry name without its call counter (shared with fuzzy matching)."""
    return entry_key(entry)


def _base(entry: str) -> str:
    """``Tensor.__add__.0.forward`` -> ``add``; a module's entry -> its class name."""
    n = parse_entry_name(entry)
    if n is None:
        parts = entry.split(".")
        name = parts[-2] if len(parts) >= 2 else entry
    else:
        name = n.leaf
    return name.strip("_") or name


def build_calls(rows: list[Row], modules: dict | None = None) -> list[Call]:
    """Group consecutive rows of one entry into calls (rows are flattened entry by entry)."""
    calls: list[Call] = []
    n = len(rows)
    i = 0
    modules = modules or {}
    while i < n:
        entry = rows[i].entry
        j = i
        ins: list = []
        outs: list = []
        dts: list = []
        st: list = []
        while j < n and rows[j].entry == entry:
            r = rows[j]
            shape = r.shape if r.kind == "tensor" else None
            if r.io == "output" or r.io == "parameters_grad":
                outs.append(shape)
            else:
                ins.append(shape)
            if r.kind == "tensor":
                dts.append(r.dtype)
                st.extend(r.stats)
            j += 1
        key = call_key(entry)
        calls.append(Call(entry, key, _base(entry), direction(entry), i, j, tuple(ins), tuple(outs),
                          tuple(dts), tuple(st), modules.get(entry)))
        i = j
    return calls


# ---------------------------------------------------------------- anchors

def _lis(pairs: list[tuple]) -> list[tuple]:
    """Longest subsequence of (i, j) pairs (sorted by i) with increasing j."""
    tails: list[int] = []          # smallest j ending an increasing run of each length
    tail_idx: list[int] = []
    prev = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[pos] = j
            tail_idx[pos] = k
        prev[k] = tail_idx[pos - 1] if pos else -1
    out = []
    k = tail_idx[-1] if tail_idx else -1
    while k >= 0:
        out.append(pairs[k])
        k = prev[k]
    out.reverse()
    return out


def _anchors(sa: list, sb: list) -> list[tuple]:
    """(i, j) pairs of calls whose signature occurs equally often on both sides, in order."""
    ca, cb = Counter(sa), Counter(sb)
    good = {s for s, c in ca.items() if cb.get(s) == c}
    if not good:
        return []
    occ = defaultdict(list)
    for j, s in enumerate(sb):
        if s in good:
            occ[s].append(j)
    seen: Counter = Counter()
    cand = []
    for i, s in enumerate(sa):
        if s in good:
            cand.append((i, occ[s][seen[s]]))
            seen[s] += 1
    return _lis(cand)


# ---------------------------------------------------------------- DP inside a stretch

def _stat_distance(a: tuple, b: tuple) -> float:
    """0 (same statistics) .. 1 (unrelated); 0.5 when not comparable."""
    if not a or len(a) != len(b):
        return 0.5
    tot, k = 0.0, 0
    for x, y in zip(a, b):
        if x != x or y != y:
            tot += 0.0 if (x != x and y != y) else 1.0
        else:
            d = abs(x - y)
            tot += 0.0 if d == 0 else min(1.0, d / (abs(x) + abs(y) + 1e-12) * 4)
        k += 1
    return tot / k


def pair_cost(a: Call, b: Call) -> float:
    """Cost of pairing NPU call ``a`` with bench call ``b``; 2 * INDEL = leave both unpaired."""
    if a.key != b.key:
        if a.base != b.base or a.direction != b.direction:
            return NO_PAIR
        c = 0.5                                   # Tensor.add vs Torch.add, add vs __add__
    else:
        c = 0.0
    if a.in_shapes != b.in_shapes:
        c += 0.3
    if a.out_shapes != b.out_shapes:
        c += 0.4
    if a.dtypes != b.dtypes:
        c += 0.1
    c += 0.3 * _stat_distance(a.stats, b.stats)
    if a.module and b.module and a.module != b.module:
        c += 0.2
    return c


def _dp(A: list[Call], B: list[Call], band: int | None):
    """Edit-distance alignment of two short call lists; ops with indices local to A/B."""
    n, m = len(A), len(B)
    INF = math.inf
    # band: cells with |i*m/n - j| small; full when band is None
    if band is None:
        lo = [0] * (n + 1)
        hi = [m] * (n + 1)
    else:
        lo, hi = [], []
        for i in range(n + 1):
            c = i * m / n if n else 0
            lo.append(max(0, int(c) - band))
            hi.append(min(m, int(c) + band + 1))
    cost: list = [{} for _ in range(n + 1)]     # a row is None once it is no longer needed
    back: list = [{} for _ in range(n + 1)]
    cost[0] = {j: j * INDEL for j in range(lo[0], hi[0] + 1)}
    back[0] = {j: 2 for j in range(1, hi[0] + 1)}
    for i in range(1, n + 1):
        a = A[i - 1]
        prev, bk = cost[i - 1], back[i]
        cur: dict = {}
        for j in range(lo[i], hi[i] + 1):
            best, how = prev.get(j, INF) + INDEL, 1            # NPU call unpaired
            if j > 0:
                left = cur.get(j - 1, INF) + INDEL              # bench call unpaired
                if left < best:
                    best, how = left, 2
                diag = prev.get(j - 1, INF)
                if diag < INF:
                    d = diag + pair_cost(a, B[j - 1])
                    if d < best:        # ties: unpaired calls go last, as zip would
                        best, how = d, 0
            cur[j] = best
            bk[j] = how
        cost[i] = cur
        if i >= 2:
            cost[i - 2] = None                                  # keep memory at two rows
    ops: list = []
    i, j = n, m
    if m not in back[n] and n:          # band did not reach the corner: widen to full
        return _dp(A, B, None)
    while i > 0 or j > 0:
        how = back[i].get(j, 1 if i > 0 else 2) if i > 0 else 2
        if how == 0:
            ops.append(("pair", i - 1, j - 1))
            i, j = i - 1, j - 1
        elif how == 1:
            ops.append(("npu", i - 1))
            i -= 1
        else:
            ops.append(("bench", j - 1))
            j -= 1
    ops.reverse()
    return ops


def _by_order(A: list[Call], B: list[Call]):
    """Last resort for huge ambiguous stretches: k-th call of each API with the k-th."""
    occ = defaultdict(list)
    for j, b in enumerate(B):
        occ[b.sig].append(j)
    seen: Counter = Counter()
    cand = []
    for i, a in enumerate(A):
        lst = occ.get(a.sig)
        if lst and seen[a.sig] < len(lst):
            cand.append((i, lst[seen[a.sig]]))
            seen[a.sig] += 1
    kept = _lis(cand)
    return _merge_ops(kept, 0, len(A), 0, len(B), "order")


def _merge_ops(pairs, i0, i1, j0, j1, how):
    ops, i, j = [], i0, j0
    for pi, pj in pairs:
        ops.extend(("npu", k) for k in range(i, pi))
        ops.extend(("bench", k) for k in range(j, pj))
        ops.append(("pair", pi, pj, how))
        i, j = pi + 1, pj + 1
    ops.extend(("npu", k) for k in range(i, i1))
    ops.extend(("bench", k) for k in range(j, j1))
    return ops


def align_calls(A: list[Call], B: list[Call], notes: list | None = None) -> list[tuple]:
    """Alignment ops for two call lists (see the module docstring)."""
    ops: list[tuple] = []
    _stretch(A, B, 0, len(A), 0, len(B), ops, notes, 0)
    return _groups(ops, A, B)


def _stretch(A, B, i0, i1, j0, j1, ops, notes, depth):
    """Align A[i0:i1] with B[j0:j1]: anchors with this stretch's counts, else the DP."""
    if i0 == i1 or j0 == j1:
        ops.extend(("npu", k) for k in range(i0, i1))
        ops.extend(("bench", k) for k in range(j0, j1))
        return
    anch = _anchors([A[i].sig for i in range(i0, i1)], [B[j].sig for j in range(j0, j1)]) \
        if depth < 64 else []
    if anch:
        pi, pj = i0, j0
        for ai, aj in anch:
            ai, aj = ai + i0, aj + j0
            _stretch(A, B, pi, ai, pj, aj, ops, notes, depth + 1)
            ops.append(("pair", ai, aj, "anchor"))
            pi, pj = ai + 1, aj + 1
        _stretch(A, B, pi, i1, pj, j1, ops, notes, depth + 1)
        return
    n, m = i1 - i0, j1 - j0
    if n * m <= FULL_DP_CELLS:
        local = _dp(A[i0:i1], B[j0:j1], None)
    else:
        band = abs(n - m) + BAND
        if (n + 1) * (2 * band + 1) <= MAX_BAND_CELLS:
            local = _dp(A[i0:i1], B[j0:j1], band)
        else:
            if notes is not None:
                notes.append(f"alignment: a stretch of {n} NPU x {m} bench calls with no "
                             f"anchor was paired by order of each API")
            local = _by_order(A[i0:i1], B[j0:j1])
    for op in local:
        if op[0] == "pair":
            ops.append(("pair", op[1] + i0, op[2] + j0, op[3] if len(op) > 3 else "aligned"))
        elif op[0] == "npu":
            ops.append(("npu", op[1] + i0))
        else:
            ops.append(("bench", op[1] + j0))


def _groups(ops, A, B):
    """Unpaired runs facing each other, ending in the same output shapes, become groups."""
    out, k, n = [], 0, len(ops)
    while k < n:
        if ops[k][0] == "pair":
            out.append(ops[k])
            k += 1
            continue
        run_end = k
        while run_end < n and ops[run_end][0] != "pair":
            run_end += 1
        npu = [op[1] for op in ops[k:run_end] if op[0] == "npu"]
        bench = [op[1] for op in ops[k:run_end] if op[0] == "bench"]
        if npu and bench:
            out.extend(_split_groups(npu, bench, A, B))
        else:
            out.extend(ops[k:run_end])
        k = run_end
    return out


def _split_groups(npu, bench, A, B):
    """Within one unpaired run, form groups per direction whose boundary agrees: the last
    calls produce the same output shapes, or the first calls take the same input shapes."""
    out = []
    for d in dict.fromkeys([A[i].direction for i in npu] + [B[j].direction for j in bench]):
        ni = [i for i in npu if A[i].direction == d]
        bj = [j for j in bench if B[j].direction == d]
        if ni and bj and len(ni) + len(bj) <= 64 and (
                A[ni[-1]].out_shapes == B[bj[-1]].out_shapes or A[ni[0]].in_shapes == B[bj[0]].in_shapes):
            out.append(("group", ni, bj))
        else:
            out.extend(("npu", i) for i in ni)
            out.extend(("bench", j) for j in bj)
    return out


# ---------------------------------------------------------------- rows

def _suffix(row: Row) -> str:
    return row.name[len(row.entry):]


def rows_from_ops(ops, A: list[Call], B: list[Call], npu_rows: list[Row], bench_rows: list[Row],
                  pair_cls):
    """Row pairs in alignment order; ``pair_cls(npu, bench, align)`` builds each."""
    pairs: list = []
    for g, op in enumerate(ops):
        kind = op[0]
        if kind == "pair":
            a, b = A[op[1]], B[op[2]]
            _pair_rows(npu_rows[a.start:a.stop], bench_rows[b.start:b.stop], op[3], pairs, pair_cls)
        elif kind == "npu":
            c = A[op[1]]
            pairs.extend(pair_cls(r, None, "unmatched") for r in npu_rows[c.start:c.stop])
        elif kind == "bench":
            c = B[op[1]]
            pairs.extend(pair_cls(None, r, "unmatched") for r in bench_rows[c.start:c.stop])
        else:
            _group_rows(op[1], op[2], A, B, npu_rows, bench_rows, g, pairs, pair_cls)
    return pairs


def _pair_rows(ra, rb, how, pairs, pair_cls):
    by_suffix = {}
    for r in rb:
        by_suffix.setdefault(_suffix(r), r)
    used = set()
    for r in ra:
        b = by_suffix.get(_suffix(r))
        if b is not None and id(b) not in used:
            used.add(id(b))
            pairs.append(pair_cls(r, b, how))
        else:
            pairs.append(pair_cls(r, None, "unmatched"))
    for r in rb:
        if id(r) not in used:
            pairs.append(pair_cls(None, r, "unmatched"))


def _group_rows(ni, bj, A, B, npu_rows, bench_rows, g, pairs, pair_cls):
    """Group: each NPU tensor pairs with the bench tensor of the group on the same side of
    the calls (inputs / outputs) with its shape and the closest statistics, if close."""
    tag = f"group {g}: {len(ni)} NPU / {len(bj)} bench calls"
    cand = [r for j in bj for r in bench_rows[B[j].start:B[j].stop] if r.kind == "tensor"]
    link, taken = {}, set()
    for i in ni:
        for r in npu_rows[A[i].start:A[i].stop]:
            if r.kind != "tensor":
                continue
            best, best_d = None, GROUP_LINK
            for y in cand:
                if id(y) in taken or y.shape != r.shape or (y.io == "output") != (r.io == "output"):
                    continue
                d = _stat_distance(r.stats, y.stats)
                if d < best_d:
                    best, best_d = y, d
            if best is not None:
                link[id(r)] = best
                taken.add(id(best))
    for i in ni:
        c = A[i]
        for r in npu_rows[c.start:c.stop]:
            pairs.append(pair_cls(r, link.get(id(r)), tag))
    for j in bj:
        c = B[j]
        for r in bench_rows[c.start:c.stop]:
            if id(r) not in taken:
                pairs.append(pair_cls(None, r, tag))
