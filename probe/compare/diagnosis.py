"""Local vs inherited error per API call, and the first call where error is introduced.

Error propagates: one faulty API turns every row after it red. What a reviewer needs is
the call whose *output* error jumps above the error already in its *inputs*. The inputs
of a call are compared like everything else (NPU input vs bench input), so

    input error  = worst error over the call's input (and parameter) rows,
    output error = worst error over its output rows,

with error on one scale for every row: the relative L2 error ||npu - bench|| / ||bench||
in tensor mode (it sees a 1.01 scaling that cosine cannot), the worst statistic's
difference relative to the tensor's magnitude in statistics mode (Err/Tolerance x rtol).
A call *introduces* error when its output error is beyond the dtype's tolerance (and
beyond the run-to-run noise of that call, when a second bench dump measured it) and more
than JUMP times its input error; beyond tolerance but not jumping it *inherits*.
Backward calls are read the same way in backward order: their inputs are the grads w.r.t.
the forward outputs, their outputs the grads w.r.t. the forward inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import verdict as vd
from .rows import direction

JUMP = 4.0           # output error above JUMP x input error: the call made it, not its inputs
NOISE_FACTOR = 4.0   # with a noise floor, error must also exceed NOISE_FACTOR x the noise
N_SUSPECTS = 5
_TINY = 1e-300


@dataclass
class CallDiag:
    """One call (or one group of calls) with its input and output error."""
    index: int                       # position in the aligned sequence
    direction: str
    npu_entry: str | None
    bench_entry: str | None
    match: str
    rows: list = field(default_factory=list)       # row indices in the result table
    input_error: float | None = None
    output_error: float | None = None
    tolerance: float = 1e-4
    noise: float | None = None                     # run-to-run output error (bench vs bench2)
    noise_in: float | None = None                  # ... and input error
    worst_row: int | None = None                    # the output row with the largest error
    status: str = "clean"          # clean / introduces / inherits / unmatched / not compared
    module: str | None = None
    one_minus_cos: float | None = None
    max_rel: float | None = None

    @property
    def name(self) -> str:
        return self.npu_entry or self.bench_entry or ""

    @property
    def jump(self) -> float | None:
        if self.output_error is None:
            return None
        return self.output_error / max(self.input_error or 0.0, _TINY)

    @property
    def threshold(self) -> float:
        return max(self.tolerance, NOISE_FACTOR * (self.noise or 0.0))

    @property
    def input_threshold(self) -> float:
        return max(self.tolerance, NOISE_FACTOR * (self.noise_in or 0.0))

    @property
    def score(self) -> float:
        """How far the output error exceeds what came in (and the threshold): for ranking."""
        if self.output_error is None:
            return 0.0
        return self.output_error / max(self.input_error or 0.0, self.threshold)


@dataclass
class Divergence:
    """Where error starts in one direction: the call, or the first call whose inputs differ."""
    kind: str                         # "introduced" or "inputs_differ"
    call: CallDiag
    candidates: list = field(default_factory=list)  # unmatched calls just before, for inputs_differ


@dataclass
class Diagnosis:
    calls: list
    forward: Divergence | None
    backward: Divergence | None
    suspects: list
    error_measure: str


def _f(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def row_errors(result) -> list:
    """Per row: relative error on one scale (None where nothing was compared)."""
    cols, mode = result.columns, result.mode
    n = result.n_rows
    out: list = [None] * n
    tol_dtype, verdicts = cols["Tolerance Dtype"], cols["Result"]
    ratio = cols["Err/Tolerance"]
    for i, p in enumerate(result.pairs):
        a, b = p.npu, p.bench
        if a is None or b is None or a.kind != "tensor" or b.kind != "tensor":
            continue
        if tol_dtype[i] == "exact":
            out[i] = 0.0 if verdicts[i] == "pass" else 1.0
            continue
        if mode == "tensor":
            euc, norm = _f(cols["EucDist"][i]), _f(cols["Bench l2norm"][i])
            if euc is not None and norm is not None and not math.isnan(euc):
                out[i] = euc / norm if norm > 0 else (0.0 if euc == 0 else math.inf)
                continue
        else:
            r = _f(ratio[i])
            if r is not None and not math.isnan(r):
                tol = vd.TOLERANCES.get(tol_dtype[i]) or vd.TOLERANCES["float32"]
                out[i] = r * tol.rtol
                continue
            if mode == "md5" and cols["NPU MD5"][i] is not None and cols["NPU MD5"][i] == cols["BENCH MD5"][i]:
                out[i] = 0.0
                continue
        if verdicts[i] == "error":          # shape / dtype / NaN placement: nothing to measure
            out[i] = math.inf
    return out


def _units(result, errors):
    """Rows grouped into calls, in table order (the aligned call sequence)."""
    units: dict = {}
    cols = result.columns
    npu_mod = result.npu.modules if result.npu else {}
    bench_mod = result.bench.modules if result.bench else {}
    for i, p in enumerate(result.pairs):
        a, b = p.npu, p.bench
        if p.align.startswith("group"):
            key = p.align
        elif a is not None:
            key = ("npu", a.entry)
        else:
            key = ("bench", b.entry)
        u = units.get(key)
        if u is None:
            entry = (a or b).entry
            u = units[key] = CallDiag(len(units), direction(entry), a.entry if a else None,
                                      b.entry if b else None, p.align or "exact")
            u.module = npu_mod.get(u.npu_entry) or bench_mod.get(u.bench_entry)
        if u.npu_entry is None and a is not None:
            u.npu_entry = a.entry
        if u.bench_entry is None and b is not None:
            u.bench_entry = b.entry
        u.rows.append(i)
    calls = list(units.values())
    pairs, tol_dtype = result.pairs, cols["Tolerance Dtype"]
    max_rel_col = cols.get("MaxRelativeErr")              # md5 mode has none
    cos_col = cols["Cosine"] if result.mode == "tensor" else None
    f32 = vd.TOLERANCES["float32"].rtol
    for u in calls:
        ins, outs, paired = [], [], False
        for i in u.rows:
            p = pairs[i]
            if p.npu is None or p.bench is None:
                continue
            paired = True
            e, io = errors[i], p.npu.io
            if e is None:
                continue
            if io == "input" or io == "parameters":
                ins.append(e)
            elif io == "output" or io == "parameters_grad":
                outs.append((e, i))
        if not paired:
            u.status = "unmatched"
            continue
        u.input_error = max(ins) if ins else 0.0
        if not outs:
            u.status = "not compared"
            continue
        u.output_error, u.worst_row = max(outs)
        tols = [t.rtol for t in (vd.TOLERANCES.get(tol_dtype[i]) for _, i in outs) if t]
        u.tolerance = max(tols) if tols else f32
        cos = []
        if cos_col is not None:
            cos = [1 - c for c in (_f(cos_col[i]) for _, i in outs) if c is not None and not math.isnan(c)]
        rel = []
        if max_rel_col is not None:
            rel = [m for m in (_f(max_rel_col[i]) for _, i in outs) if m is not None and math.isfinite(m)]
        u.one_minus_cos = max(cos) if cos else None
        u.max_rel = max(rel) if rel else None
    return calls


def _judge(u: CallDiag):
    if u.status in ("unmatched", "not compared"):
        return
    if u.output_error is None or not (u.output_error > u.threshold):
        u.status = "clean"
    elif u.output_error > JUMP * (u.input_error or 0.0):
        u.status = "introduces"
    else:
        u.status = "inherits"


def _eligible(calls):
    """API calls when the dump has them (module entries wrap them and would repeat the
    verdict one level up); modules for an L0 dump; never parameter-gradient entries."""
    def is_module(u):
        return u.name.startswith("Module.")
    has_api = any(not is_module(u) for u in calls)
    return [u for u in calls if u.direction in ("forward", "backward")
            and (not has_api or not is_module(u))]


def _first(calls, direction):
    last_clean = -1
    seq = [u for u in calls if u.direction == direction]
    for k, u in enumerate(seq):
        if u.status == "introduces":
            return Divergence("introduced", u)
        if u.status in ("inherits", "clean") and (u.input_error or 0.0) > u.input_threshold:
            cands = [c for c in seq[last_clean + 1:k] if c.status == "unmatched"]
            return Divergence("inputs_differ", u, cands)
        if u.status == "clean":
            last_clean = k
    return None


def diagnose(result, noise: dict | None = None) -> Diagnosis:
    """Per-call local/inherited verdicts, first divergence forward and backward, suspects.

    ``noise``: bench entry -> run-to-run (input, output) error of that call (noise_floor)."""
    errors = row_errors(result)
    calls = _units(result, errors)
    for u in calls:
        if noise and u.bench_entry in noise:
            u.noise_in, u.noise = noise[u.bench_entry]
        _judge(u)
    eligible = _eligible(calls)
    fwd, bwd = _first(eligible, "forward"), _first(eligible, "backward")
    intro = [u for u in eligible if u.status == "introduces"]
    intro.sort(key=lambda u: -u.score)
    measure = ("relative L2 error ||npu-bench||/||bench||" if result.mode == "tensor"
               else "worst statistic difference relative to the tensor's magnitude")
    return Diagnosis(calls, fwd, bwd, intro[:N_SUSPECTS], measure)


def noise_floor(bench_json: str, bench2_json: str, **kw) -> dict:
    """bench entry -> (input, output) error between two bench runs of the same program:
    what nondeterminism alone produces at that call."""
    from .engine import compare_dumps
    r = compare_dumps(bench2_json, bench_json, progress=False, **kw)
    out = {}
    for u in _units(r, row_errors(r)):
        if u.bench_entry and u.output_error is not None:
            out[u.bench_entry] = (u.input_error or 0.0, u.output_error)
    return out
