"""Local vs inherited error per API call, and the first call where error is introduced.

Error propagates: one faulty API turns every row after it red. What a reviewer needs is
the call whose *output* error jumps above the error already in its *inputs*. The inputs
of a call are compared like everything else (NPU input vs bench input), so

    input error  = worst error over the call's input (and parameter) rows,
    output error = worst error over its output rows,

with error on one scale for every row: the relative L2 error ||npu - bench|| / ||bench||
in tensor mode (it sees a 1.01 scaling that cosine cannot), the worst statistic's
difference relative to the tensor's magnitude in statistics mode (Err/Tolerance x rtol).
In a tensor dump each call whose output differs is also re-run on the NPU side's own
inputs (``local_error``): its *local* error (what its kernel added, against a float64
golden of the same inputs) decides, whatever the op does to error that came in. A call
*introduces* error when its local error is beyond what a correct kernel of its dtype adds
(or is a scale that rounding does not make); otherwise it *inherits* when its output
differs beyond the dtype's tolerance, and is *clean* below. Calls that cannot be re-run
(statistics dumps, random APIs, arguments not recorded by value) are judged by the jump:
output error beyond the tolerance (and the run-to-run noise, when a second bench dump
measured it) and more than JUMP times the input error (STATS_JUMP in a low-precision
statistics dump, whose four numbers per tensor are noisier), except that two kinds of
call never introduce while their inputs differ: selections and copies (views, indexing,
embedding: they cannot add error, only pick the part that has most) and the optimizer's
calls (made after the step's last backward call: AdamW divides by sqrt(v) and turns
gradients that differ by rounding into weights that differ by up to 2 x lr).
Backward calls are read the same way in backward order: their inputs are the grads w.r.t.
the forward outputs, their outputs the grads w.r.t. the forward inputs.

Weights and optimizer state are inputs. At step N >= 1 they already differ (step N-1's
update); ``state`` reports the inputs read from outside the step (no earlier call of the
step produced them) that differ, and by how much.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from collections import deque
from itertools import compress, repeat

import msgspec
import numpy as np

from . import draws
from . import verdict as vd
from .codes import codes
from .coverage import Coverage, coverage
from .draws import DrawCheck
from .local_error import LocalError, Replays
from .normalized_norm import NormCheck, norm_check
from .rows import field_of, fields_of, numel_array, numels, stats_of
from probe.precheck.entries import DROPOUT_ARGS, ApiEntry, parse_name
from probe.python_compat import SLOTS
from probe.tolerances import tolerance_for
from probe.vocabulary import STATISTICS

JUMP = 4.0           # output error above JUMP x input error: the call made it, not its inputs
STATS_JUMP = 10.0    # the same from Max/Min/Mean/Norm alone in a bf16/fp16 run, or where the
                     # inputs differ at all (a matrix unit's own ~3e-4 on inputs 8e-5 apart)
AGREE = 1e-4        # inputs closer than this (fp32's tolerance) agree, for the rules above
NOISE_FACTOR = 4.0   # with a noise floor, error must also exceed NOISE_FACTOR x the noise
N_SUSPECTS = 5
N_STATE = 5          # differing outside inputs listed by name
# The NPU side's precision per API, measured on the run (see _device_precision):
MIN_POPULATION = 3   # calls of one API (or of the matrix-unit family) needed to measure it
MOST = 0.5           # more than this fraction of them beyond a correct CPU kernel: the device's
STAND_OUT = 4.0      # a call is blamed when its excess is this many times its API's typical one
# A typical error above this (or its output dtype's tolerance, if larger) is no device's
# precision but a fault in every call: TF32/HF32 keep 10 mantissa bits, ~5e-4 a product.
PLAUSIBLE = 2e-3
# APIs computed on a device's matrix units (TF32/HF32, split-K blocking): one population
MATRIX_UNIT = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "__matmul__",
                         "__rmatmul__", "einsum", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                         "conv_transpose2d", "conv_transpose3d", "scaled_dot_product_attention", "Conv1D"})
_LOW_PRECISION = ("bfloat16", "float16")
# A run that declares reduced-precision products (TF32/HF32: dump/math_modes.py) cuts each
# fp32 factor to 10 mantissa bits, toward zero on a matrix unit that reads fp32 registers
# as TF32 (an H200 did: bench/cuda_cross_device.py): up to 2^-10 per factor, 2^-9 a product,
# and a sum of same-signed products keeps that bias whole. A matrix-unit call of such a
# run is held to this on its own output, not to fp32's 1e-4.
REDUCED_PRODUCT = 2.0 ** -9
_MATMUL_SETTINGS = ("cuda.matmul.allow_tf32", "npu.matmul.allow_hf32", "float32_matmul_precision=")
_CONV_SETTINGS = ("npu.conv.allow_hf32",)   # cudnn.allow_tf32 is on by default, CPU runs too: it says nothing
_CONVS = frozenset(a for a in MATRIX_UNIT if a.startswith("conv"))


_UNPARSED = object()
UNJUDGED_TOLERANCE = 1e-4     # a call's tolerance until its outputs are compared


class CallDiag(msgspec.Struct, gc=False):
    """One call (or one group of calls) with its input and output error.

    A struct the cyclic garbage collector does not track (its fields are numbers, strings,
    a list of row numbers and records of them: no cycles): 100k calls and their parsed
    names were a 0.3 s collection after the 100k-entry compare (bench/compare.py)."""
    index: int                       # position in the aligned sequence
    direction: str
    npu_entry: str | None
    bench_entry: str | None
    match: str
    rows: list = []                                # row indices in the result table
    input_error: float | None = None
    output_error: float | None = None
    tolerance: float = UNJUDGED_TOLERANCE
    noise: float | None = None                     # run-to-run output error (bench vs bench2)
    noise_in: float | None = None                  # ... and input error
    worst_row: int | None = None                    # the output row with the largest error
    status: str = "clean"          # clean / introduces / inherits / unmatched / not compared
    module: str | None = None
    one_minus_cos: float | None = None
    max_rel: float | None = None
    phase: str = ""                # "optimizer" for calls after the step's last backward call
    local: LocalError | None = None    # the call re-run on the NPU's inputs (tensor dumps)
    exact_api: bool = False        # a selection, copy or conversion: adds no error of its own
    draw: DrawCheck | None = None  # a random call, judged by its law (draws.py)
    api_key: str = ""              # the API and direction ("Torch.addmm.forward"): its population
    device_excess: float | None = None   # the typical excess of this call's API on the NPU side
    device_error: float | None = None    # ... and its typical local error
    extremes_off: bool = False     # statistics: its output's Max/Min are not its function of its input's
    normalizes: bool = False       # divides by its input's spread: amplifies what came in
    declared: float = 0.0          # its own error allowed by the runs' declared math modes (REDUCED_PRODUCT)
    note: str = ""                 # why a "can't tell" comes from outside the numbers (a shard merge)
    nonfinite_out: str = ""        # its first output row with NaN/Inf on one side only ("" if none)
    nonfinite_side: str = ""       # ... the side that has them ("NPU" / "bench")
    nonfinite: bool = False        # ... while every input (and, backward, its forward's tensors)
                                   # is finite on both sides: it made them, whatever came before
    amplification: float | None = None   # statistics: how much its statistics let it amplify input error
    norm: NormCheck | None = None  # statistics, a normalizer: its output Norm against its weight and bias's
    _api: object = _UNPARSED

    @property
    def name(self) -> str:
        return self.npu_entry or self.bench_entry or ""

    @property
    def api(self):
        """The NPU entry's ``precheck.entries.ApiEntry`` (None for a module, a custom op, a
        bench-only call), parsed once: three checks ask for it (it was a third of the
        diagnosis on bench/compare.py's 100k-entry pair)."""
        if self._api is _UNPARSED:
            self._api = parse_name(self.name) if self.npu_entry else None
        return self._api

    @property
    def jump(self) -> float | None:
        if self.output_error is None:
            return None
        if not self.input_error:
            return math.inf if self.output_error > 0 else 0.0
        return self.output_error / self.input_error

    @property
    def threshold(self) -> float:
        return max(self.tolerance, self.declared, NOISE_FACTOR * (self.noise or 0.0))

    @property
    def input_threshold(self) -> float:
        return max(self.tolerance, NOISE_FACTOR * (self.noise_in or 0.0))

    @property
    def score(self) -> float:
        """How far the output error exceeds what came in (and the threshold): for ranking.
        With a replay: how far the local error exceeds what a correct kernel adds (and the
        NPU side's measured precision for its API, where one was measured)."""
        if self.nonfinite:
            return math.inf
        if self.draw is not None:
            return math.inf if self.draw.broken else 0.0
        if self.local is not None:
            if self.device_error:
                return max(self.local.local, abs(self.local.bias)) / self.device_error
            return self.local.ratio
        if self.output_error is None:
            return 0.0
        return self.output_error / max(self.input_error or 0.0, self.threshold)

    @property
    def reason(self) -> str:
        """One sentence: why this call is judged as it is."""
        if self.nonfinite:
            other = "bench" if self.nonfinite_side == "NPU" else "NPU"
            return (f"its output {self.nonfinite_out} has NaN/Inf on the {self.nonfinite_side} side only, while "
                    f"its inputs are finite on both sides: it made the non-finite values (an overflow, a "
                    f"division by zero, a log of 0) where the {other} side's kernel did not")
        if self.nonfinite_out and self.status == "inherits" and self.output_error == math.inf:
            return (f"its output {self.nonfinite_out} has NaN/Inf on the {self.nonfinite_side} side only, but "
                    f"its inputs (or what its forward call saved) are not finite on both sides: they came in")
        if self.draw is not None:
            return self.draw.reason
        if self.norm is not None and self.status == "introduces":
            return (f"its output's Norm is x{self.norm.ratio:.4g} the bench's where its weight and bias give "
                    f"x{self.norm.expected:.4g}: normalized values have a fixed norm, so its inputs' difference "
                    f"({self.input_error or 0.0:.3g}) and rounding move it by at most {self.norm.allowed:.2g}, "
                    f"not {self.norm.departure:.3g}: the kernel scaled its output")
        if self.extremes_off:
            return ("its output's Max and Min are not what its function gives for its own input's Max and "
                    f"Min: the kernel computes something else (its output differs by {self.output_error:.3g})")
        if self.status == "can't tell" and self.note:
            return self.note
        if self.status == "can't tell" and self.amplification is not None:
            return (f"its output statistics differ by {self.output_error:.3g} where its inputs' differ by "
                    f"{self.input_error or 0.0:.3g}: within what its normalization can amplify that by "
                    f"(x{self.amplification:.3g}, from its input's statistics), so Max/Min/Mean/Norm cannot "
                    f"tell (a tensor dump re-runs it on its inputs)")
        if self.status == "can't tell":
            return (f"its output statistics differ by {self.output_error:.3g} where its inputs' differ by "
                    f"{self.input_error or 0.0:.3g}: Max/Min/Mean/Norm cannot tell whether it amplified "
                    f"that difference or made its own (a tensor dump re-runs it on its inputs)")
        if self.local is not None:
            if self.device_excess and self.status != "introduces":
                return (f"re-run on its own inputs, its output is off by {self.local.local:.3g}, "
                        f"{self.local.ratio:.3g}x a correct CPU kernel's, as every call of {self.api_key} is "
                        f"on the NPU side (typically {self.device_excess:.3g}x): the device's precision")
            if self.device_excess and self.status == "introduces" and not self.local.biased:
                return (f"re-run on its own inputs, its output is off by {self.local.local:.3g}: "
                        f"{self.score:.3g}x the NPU side's typical error for its API "
                        f"({self.device_error:.2g}, {self.local.ratio:.3g}x a correct CPU kernel's)")
            return self.local.reason()
        if self.status == "introduces" and self.amplification is not None:
            return (f"its output differs by {self.output_error:.3g} where its inputs differ by "
                    f"{self.input_error or 0.0:.3g}: beyond what its normalization can amplify its inputs' "
                    f"difference (or their rounding) to (x{self.amplification:.3g}, from its input's statistics)")
        if self.status == "introduces":
            return (f"its output differs by {self.output_error:.3g} where its inputs differ by "
                    f"{self.input_error or 0.0:.3g} (more than the threshold {self.threshold:.3g})")
        if self.status == "inherits":
            return (f"its output differs by {self.output_error:.3g}, explained by its inputs "
                    f"(differing by {self.input_error or 0.0:.3g})")
        return ""


@dataclass
class Divergence:
    """Where error starts in one direction: the call, or the first call whose inputs differ."""
    kind: str                         # "introduced" or "inputs_differ"
    call: CallDiag
    candidates: list = field(default_factory=list)  # unmatched calls just before it


class OutsideInput(msgspec.Struct, gc=False):
    """An input row no earlier call of the step produced (a weight, optimizer state, data)."""
    row: str
    shape: tuple | None
    error: float
    module: str | None


class OutsideInputs(Sequence):
    """``State.differing``: a list of OutsideInput, each made when it is read (the summary
    reads a few and the count: 100k of them made at once were a tenth of the diagnosis on
    bench/compare.py's 100k-entry pair). ``rows``, ``errors``, ``calls``: per input, its
    table row, its error and its call; ``names``, ``shapes``: per table row; ``modules``:
    per call."""
    __slots__ = ("_rows", "_errors", "_calls", "_names", "_shapes", "_modules")

    def __init__(self, rows: np.ndarray, errors: np.ndarray, calls: np.ndarray, names: list, shapes: list,
                 modules: list):
        self._rows, self._errors, self._calls = rows, errors, calls
        self._names, self._shapes, self._modules = names, shapes, modules

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        i = int(self._rows[k])
        return OutsideInput(self._names[i], self._shapes[i], float(self._errors[k]),
                            self._modules[int(self._calls[k])])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class State:
    """Inputs read from outside the step that differ: the previous steps' updates."""
    differing: Sequence               # OutsideInput, largest error first (OutsideInputs)
    compared: int                     # outside inputs compared

    @property
    def max_error(self) -> float:
        return self.differing[0].error if self.differing else 0.0


@dataclass
class Drift:
    """How much error the step accumulates and where it grows fastest."""
    forward: float | None             # output error of the last forward call
    backward: float | None            # output error of the last backward call
    largest: CallDiag | None          # the call with the largest output error
    fastest: CallDiag | None          # the call whose output/input error ratio is largest


@dataclass
class Diagnosis:
    calls: list
    forward: Divergence | None
    backward: Divergence | None
    suspects: list
    error_measure: str
    inputs_differ: Divergence | None = None   # first call whose inputs differ, none introduced
    state: State | None = None
    drift: Drift | None = None
    replayed: int = 0                 # calls judged by their replay
    low_precision: str | None = None  # "bfloat16" when the NPU side computed in it
    draws: Draws | None = None        # random calls, and whether the two runs drew alike
    device: list = field(default_factory=list)   # DevicePrecision: what the NPU side's APIs add
    paths_differ: str | None = None  # statistics: the first call whose output shape differs per side
    coverage: Coverage | None = None   # what could be judged, and why not where it could not


@dataclass
class Draws:
    """The random calls of the step (draws.py), judged by their law."""
    calls: int                        # random calls
    differ: int                       # of them, whose output differs from the bench's
    first_differing: str | None       # the first of those
    unjudged: list = field(default_factory=list)   # draws no law is checked for (attention's)


@dataclass
class DevicePrecision:
    """What most calls of one API add on the NPU side beyond a correct CPU kernel."""
    api: str                          # "Torch.addmm.forward", or "matrix units" for the family
    calls: int                        # calls measured
    typical_error: float              # median local error (relative)
    typical_excess: float             # median of local error / a correct kernel's error
    settings: tuple = ()              # the NPU dump's reduced-precision math modes (dump/math_modes.py)

    @property
    def text(self) -> str:
        if self.settings:
            like = f" (the NPU dump ran with {', '.join(self.settings)})"
        elif self.api == "matrix units" and self.typical_excess > 100:
            like = " (TF32/HF32-like matrix units)"
        else:
            like = " (another reduction order)" if self.typical_excess < 100 else ""
        return (f"{self.api} on the NPU side: ~{self.typical_error:.2g} relative on {self.calls} calls, "
                f"{self.typical_excess:.3g}x a correct CPU kernel's error{like}: the device's precision, "
                f"not a fault at one call")


def _f(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def stat_errors(npu, bench, numel, floor):
    """Per row, the worst statistic's difference relative to the tensor's own magnitude
    (arrays: k x 4 statistics Max, Min, Mean, Norm of each side; k elements; k floors).

    Max, Min and Mean against max(|Max|, |Min|, RMS, floor), Norm against max(Norm,
    floor). Relative, so a call that only scales its input (a division by a constant, an
    optimizer's bias correction) does not look as if it made error; the floor keeps a
    tensor that is zero but for cancellation from counting its rounding noise as a
    relative error of 100%. NaN where a statistic is missing; non-finite statistics give
    0 when both sides hold the same, else infinity."""
    import numpy as np
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rms = np.abs(bench[:, 3]) / np.sqrt(np.maximum(numel, 1))
        scale = np.maximum.reduce([np.abs(bench[:, 0]), np.abs(bench[:, 1]), rms, floor])
        worst = np.abs(npu[:, :3] - bench[:, :3]).max(axis=1) / scale
        out = np.maximum(worst, np.abs(npu[:, 3] - bench[:, 3]) / np.maximum(np.abs(bench[:, 3]), floor))
        same = (npu == bench).all(axis=1)
        out[scale == 0] = np.where(same[scale == 0], 0.0, np.inf)
        odd = ~(np.isfinite(npu).all(axis=1) & np.isfinite(bench).all(axis=1))
        out[odd] = np.where(same[odd], 0.0, np.inf)
        out[np.isnan(npu).any(axis=1) | np.isnan(bench).any(axis=1)] = np.nan
    return out


def row_errors(result, facts: _RowFacts) -> np.ndarray:
    """Per row: relative error on one scale (NaN where nothing was compared). Statistics
    mode measures every row at once; the tensor and md5 modes read their own columns a
    row at a time."""
    cols, mode = result.columns, result.mode
    err = np.full(result.n_rows, np.nan)
    verdicts = cols["Result"]
    both = facts.npu_tensor & facts.bench_tensor
    exact = both & (facts.tol_code == facts.tol_names.index("exact")) if "exact" in facts.tol_names \
        else np.zeros(len(err), dtype=bool)
    if exact.any():
        err[exact] = np.where(np.array(verdicts, dtype=object)[exact] == "pass", 0.0, 1.0)
    rest = both & ~exact
    if mode == "statistics":
        by_stats = rest & facts.same_shape
    else:
        by_stats = np.zeros(len(err), dtype=bool)
        for i in np.flatnonzero(rest).tolist():
            if mode == "tensor":     # (an overflowing norm on both sides, inf / inf, is not
                euc, norm = _f(cols["EucDist"][i]), _f(cols["Bench l2norm"][i])   # a number: below)
                if euc is not None and norm is not None and not math.isnan(euc):
                    err[i] = euc / norm if norm > 0 else (0.0 if euc == 0 else math.inf)
            elif mode == "md5" and cols["NPU MD5"][i] is not None and cols["NPU MD5"][i] == cols["BENCH MD5"][i]:
                err[i] = 0.0
            elif facts.same_shape[i]:
                by_stats[i] = True
    rows = np.flatnonzero(by_stats)
    if len(rows):
        err[rows] = stat_errors(facts.npu_stats[rows], facts.bench_stats[rows], facts.bench_numel[rows],
                                facts.floor[rows])
    # NaN/Inf on one side only: an infinite error (a shape or dtype mismatch with finite
    # numbers is not measured, nor is a NaN both sides hold, nor an error of inf / inf
    # where both sides' norms overflow and their statistics are alike non-finite)
    left = np.flatnonzero(rest & np.isnan(err))
    if len(left):
        one_sided = (np.isfinite(facts.npu_stats[left]) != np.isfinite(facts.bench_stats[left])).any(axis=1)
        error = np.fromiter(map(operator.eq, map(verdicts.__getitem__, left.tolist()), repeat("error")),
                            bool, len(left))
        err[left[one_sided & error]] = math.inf
    return err


class _Errors:
    """The rows' errors as a list of them reads (``normalized_norm.norm_check``): a number,
    or None where nothing was compared (NaN in the array)."""
    __slots__ = ("err",)

    def __init__(self, err: np.ndarray):
        self.err = err

    def __getitem__(self, i: int) -> float | None:
        e = float(self.err[i])
        return None if e != e else e


_IN, _OUT = 1, 2        # a row's part as the diagnosis reads it: what a call takes, what it gives


_IO_CODE = {io: k for k, io in enumerate(("input", "parameters", "output", "parameters_grad"), 1)}


@dataclass
class _CallFacts:
    """Per call, as arrays: what the calls were made with (``_units``), for the steps that
    read it of every call at once."""
    input_error: np.ndarray          # NaN for None
    output_error: np.ndarray
    tolerance: np.ndarray
    api_keys: list = field(default_factory=list)
    directions: list = field(default_factory=list)
    modules: list = field(default_factory=list)
    exact: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))       # CallDiag.exact_api
    normalizes: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    optimizer: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))   # phase "optimizer"
    named: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))       # has an NPU entry
    key_names: list = field(default_factory=list)     # the distinct api_keys ...
    key_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # ... and each call's among them
    keyed: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))       # per key name: it is not ""
    compared: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))    # status neither unmatched nor
                                                                               # not compared (as made)
    touched: set = field(default_factory=set)     # calls a step after _units set a field of (draw, local, ...)
    threshold: np.ndarray = field(default_factory=lambda: np.zeros(0))           # CallDiag.threshold, once judged
    input_threshold: np.ndarray = field(default_factory=lambda: np.zeros(0))


# what the diagnosis reads of each side's rows (the bench side's names: none)
_SIDE_FIELDS = {"NPU": ("kind", "io", "shape", "dtype", "entry", "name"), "Bench": ("kind", "io", "shape", "dtype", "entry")}


@dataclass
class _RowFacts:
    """Per table row, as arrays: what measuring the rows and grouping them into calls
    read (one pass over the pairs, then numpy instead of Python per row: 300k rows of
    the 100k-entry pair). Made at the start of the diagnosis, after anything that
    rewrites a pair (a shard merge's "can't tell" rows)."""
    npu_tensor: np.ndarray   # the NPU row is a tensor
    bench_tensor: np.ndarray
    npu_io: np.ndarray       # the NPU row's part: _IO_CODE, 0 for none
    paired: np.ndarray       # both sides hold the row
    part: np.ndarray         # the paired NPU row's _IN / _OUT / 0
    bench_in: np.ndarray     # paired, the bench row a tensor taken by the call (input, parameters)
    out_same: np.ndarray     # a paired NPU output whose bench row is a tensor of the same shape
    same_shape: np.ndarray   # both rows there, with the same shape
    npu_stats: np.ndarray    # rows x STAT_KEYS, NaN where a side has none
    bench_stats: np.ndarray
    bench_norm: np.ndarray   # the paired bench tensor's Norm, else NaN
    bench_numel: np.ndarray  # the paired bench tensor's elements, else 0
    npu_rows: list           # per row the NPU side's Row (None where it has none)
    bench_rows: list
    has_npu: np.ndarray      # the NPU side holds the row
    has_bench: np.ndarray
    tol_names: list          # the tolerance classes (the "Tolerance Dtype" column's values) ...
    tol_code: np.ndarray     # ... and each row's, as its index in them
    floor: np.ndarray        # each row's tolerance class's floor (tolerances.tolerance_for)
    npu: dict                # per side, field name -> each row's (None where it has no row): the
                             # NPU side's shape, dtype, entry and name, the bench side's dtype and entry
    bench: dict
    bench_io: np.ndarray     # the bench row's part: _IO_CODE, 0 for none
    aligns: list             # each pair's ``Pair.align``
    unit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # the row's call (_units)
    err: np.ndarray = field(default_factory=lambda: np.zeros(0))   # the rows' errors as the calls read them
                                                                   # (NaN for None), once _units set them
    calls: _CallFacts = field(default_factory=lambda: _CallFacts(np.zeros(0), np.zeros(0), np.zeros(0)))
                                        # what _units made the calls with

    @classmethod
    def of(cls, result) -> _RowFacts:
        pairs = result.pairs
        n = len(pairs)
        tol_col = result.columns["Tolerance Dtype"]
        tol_names, tol_code = codes(tol_col if type(tol_col) is list else list(tol_col))
        floor = np.array([tolerance_for(t).floor for t in tol_names] or [0.0])[tol_code]
        A, B, aligns = fields_of(pairs, ("npu", "bench", "align"))
        read = result.table_rows or (None, None)
        # (the compare's own lists where the pairs still hold those rows: one copy, not two)
        A, B = (was if was is not None and rows == was else rows for rows, was in ((A, read[0]), (B, read[1])))
        fa, fb = (dict(zip(_SIDE_FIELDS[side], fields_of(rows, _SIDE_FIELDS[side])))
                  for side, rows in (("NPU", A), ("Bench", B)))
        npu_stats, bench_stats = (_stats(result.columns, side, rows, was)
                                  for side, rows, was in (("NPU", A, read[0]), ("Bench", B, read[1])))
        npu_io = np.fromiter(map(_IO_CODE.get, fa["io"], repeat(0)), np.int8, n)
        bench_io = np.fromiter(map(_IO_CODE.get, fb["io"], repeat(0)), np.int8, n)
        coded = result.table_codes if read[0] is A and read[1] is B else None     # the rows the table coded
        if coded is not None:
            ca, cb = coded
            npu_tensor, bench_tensor, has_npu, has_bench = ca.tensor, cb.tensor, ca.present, cb.present
        else:
            npu_tensor = np.fromiter(map(operator.eq, fa["kind"], repeat("tensor")), bool, n)
            bench_tensor = np.fromiter(map(operator.eq, fb["kind"], repeat("tensor")), bool, n)
            has_npu = np.fromiter(map(operator.is_not, A, repeat(None)), bool, n)
            has_bench = np.fromiter(map(operator.is_not, B, repeat(None)), bool, n)
        paired = has_npu & has_bench
        shape_a, shape_b = fa["shape"], fb["shape"]
        same = _same_shapes(coded) if coded is not None else None
        same_shape = paired & (same if same is not None else
                               np.fromiter(map(operator.eq, shape_a, shape_b), bool, n))
        taken = paired & bench_tensor
        # paired tensors only: a one-sided row's shape is never multiplied (it may not be numbers)
        if coded is None and taken.all():
            bench_numel = _numels(shape_b)
        else:
            bench_numel = np.zeros(n, dtype=np.float64)
            counted = np.flatnonzero(taken)
            bench_numel[counted] = coded[1].numel(counted) if coded is not None else \
                _numels(list(map(shape_b.__getitem__, counted.tolist())))
        part = np.where(paired & (npu_io >= _IO_CODE["output"]), _OUT,
                        np.where(paired & (npu_io >= 1), _IN, 0)).astype(np.int8)
        for read in (fa, fb):       # (as arrays now: the lists not held through the diagnosis)
            del read["kind"], read["io"]
        del fb["shape"]
        return cls(npu_tensor, bench_tensor, npu_io, paired, part,
                   taken & (bench_io >= 1) & (bench_io <= _IO_CODE["parameters"]),
                   taken & (npu_io == _IO_CODE["output"]) & same_shape, same_shape, npu_stats, bench_stats,
                   np.where(taken, bench_stats[:, 3], np.nan), bench_numel, A, B, has_npu, has_bench,
                   tol_names, tol_code, floor, fa, fb, bench_io, aligns)


def _same_shapes(coded: tuple) -> np.ndarray | None:
    """Per row, whether the two sides' shapes are equal, from the table's codes of them
    (``SideCodes``: each side's distinct shape objects): the distinct shapes of both sides
    coded together by value, not 350k pairs of tuples compared; None where a shape is not
    hashable."""
    a, b = coded
    try:
        _, joint = codes(a.shapes + b.shapes)
    except TypeError:               # a malformed (nested) shape: not a key
        return None
    return joint[:len(a.shapes)][a.shape] == joint[len(a.shapes):][b.shape]


def _numels(shapes: list) -> np.ndarray:
    """``rows.numel_array`` of ``shapes``, worked out per distinct shape and looked up by
    value: a side's rows share a few shapes, and hashing those small tuples costs a quarter
    of numbering them by identity (350k rows of the 100k-entry pair)."""
    try:
        distinct = dict.fromkeys(shapes)
    except TypeError:               # a malformed (nested) shape: not a key
        return numel_array(shapes)
    per = dict(zip(distinct, numel_array(list(distinct)).tolist()))
    return np.fromiter(map(per.__getitem__, shapes), np.float64, len(shapes))


def _stats(columns: dict, side: str, rows: list, read: list | None) -> np.ndarray:
    """One side's rows x STAT_KEYS statistics (NaN where a row has none): the table's
    statistic columns, which the compare read from these rows (``CompareResult.table_rows``),
    but for rows replaced since (a shard merge's), read again; all from the rows where
    the table has no such columns (md5 mode) or no record of its rows."""
    n = len(rows)
    cols: list = [columns.get(f"{side} {s.column}") for s in STATISTICS]
    if read is None or len(read) != n or not all(isinstance(c, np.ndarray) and c.shape == (n,) for c in cols):
        return stats_of(rows)
    stats = np.column_stack(cols)
    if rows == read:                # (each row the same: list equality's identity test, in C)
        return stats
    changed = np.flatnonzero(np.fromiter(map(operator.is_not, rows, read), bool, n))
    stats[changed] = stats_of(list(map(rows.__getitem__, changed.tolist())))
    return stats


def _per_call(n_calls: int, unit: np.ndarray, values: np.ndarray, empty=-np.inf) -> np.ndarray:
    """Per call the largest of ``values`` over its rows (``unit``: each value's call);
    ``empty`` where it has none."""
    out = np.full(n_calls, empty, dtype=np.float64)
    np.maximum.at(out, unit, values)
    return out


def _cancellation_floors(result, facts: _RowFacts, n_calls: int, errors):
    """Statistics mode: an output row's error against at least what its inputs could sum to.

    A reduction's output that cancels to near zero (a bias gradient before a BatchNorm)
    differs between bf16 and fp32 by the rounding of its terms, ~u x sqrt(N) x RMS(term),
    which relative to its own tiny magnitude looks like a 100% error. Judged against the
    magnitude the sum would have without cancellation, sqrt(N) x RMS of the largest input
    (N = its elements per output element), that noise is the dtype's rounding again."""
    pairs = result.pairs
    with np.errstate(invalid="ignore"):
        taken = facts.paired & facts.bench_in & (facts.bench_norm > -1.0)
    rows = np.flatnonzero(taken)
    big_norm = _per_call(n_calls, facts.unit[rows], facts.bench_norm[rows])
    # the first row of each call holding its largest input (as a scan keeping the first would)
    at_max = rows[facts.bench_norm[rows] == big_norm[facts.unit[rows]]]
    first = np.full(n_calls, len(pairs), dtype=np.int64)
    np.minimum.at(first, facts.unit[at_max], at_max)
    has = (first < len(pairs)) & np.isfinite(big_norm)
    big_numel = np.where(has, facts.bench_numel[np.minimum(first, len(pairs) - 1)], 0.0)
    has &= big_numel > 0
    out = np.flatnonzero(facts.out_same & ~np.isnan(errors) & (facts.bench_numel > 0) & has[facts.unit])
    if not len(out):
        return
    u = facts.unit[out]
    rms = big_norm[u] / np.sqrt(big_numel[u])
    floors = rms * np.sqrt(np.maximum(big_numel[u] / facts.bench_numel[out], 1.0))
    floors = np.maximum(floors, facts.floor[out])
    new = stat_errors(facts.npu_stats[out], facts.bench_stats[out], facts.bench_numel[out], floors)
    lower = new < errors[out]       # (NaN: never)
    errors[out[lower]] = new[lower]


def _gain_floors(result, facts: _RowFacts, n_calls: int, errors):
    """Statistics mode: an input row measured on its call's output scale.

    The floor keeps a tensor that is zero but for cancellation from counting its rounding
    as a 100% error; on a tensor that is small by its nature it shrinks the error instead
    (a gradient of 7e-5 against bf16's floor 1e-3: 14x). A call that multiplies such an input
    up (rsqrt's backward, x^-1.5 ~ 1e5 on Llama's RMSNorm) gives an output above the floor,
    measured in full: a jump that is only the floor's (Llama bf16 at step 1: 0.0014 in,
    0.0225 out, where the gradient's own statistics differ by 2%). The floor is carried
    back through the call's gain (its outputs' magnitude over the input's), so both sides of
    the jump are measured on one scale; an input's error only grows by it."""
    bench = facts.bench_stats
    with np.errstate(invalid="ignore"):
        rms = np.abs(bench[:, 3]) / np.sqrt(np.maximum(facts.bench_numel, 1))
        magnitude = np.maximum.reduce([np.abs(bench[:, 0]), np.abs(bench[:, 1]), rms])
    known = ~np.isnan(errors)
    finite = np.isfinite(magnitude)
    outs = np.flatnonzero(facts.out_same & finite & (facts.bench_numel > 0))
    if not len(outs):
        return
    out_scale = _per_call(n_calls, facts.unit[outs], magnitude[outs])
    ins = np.flatnonzero(facts.bench_in & facts.same_shape & known & finite & (magnitude > 0)
                         & (facts.bench_numel > 0))
    if not len(ins):
        return
    floor = facts.floor[ins]
    gain = out_scale[facts.unit[ins]] / magnitude[ins]
    small = (magnitude[ins] < floor) & (gain > 1.0)
    ins, floor, gain = ins[small], floor[small], gain[small]
    if not len(ins):
        return
    new = stat_errors(facts.npu_stats[ins], bench[ins], facts.bench_numel[ins], floor / gain)
    higher = new > errors[ins]      # (NaN: never)
    errors[ins[higher]] = new[higher]


def _units(result, errors, facts: _RowFacts):
    """Rows grouped into calls, in table order (the aligned call sequence); ``facts.unit``
    set to each row's call.

    A row belongs to its group (``Pair.align`` "group N"), else to its NPU entry, else to
    its bench entry; a call's fields are those of its first row, its entries the first
    each side has. The grouping is coded in C (``codes``) and each call's numbers are
    worked out per column (``_errors_of_calls``) before the calls are made at once: a
    Python step per row and an attribute write per call and field were a third of the
    diagnosis on the 100k-entry pair (bench/compare.py)."""
    n = len(result.pairs)
    aligns = facts.aligns
    npu_entry_of, bench_entry_of = facts.npu["entry"], facts.bench["entry"]
    grouped = [i for i, a in enumerate(aligns) if a.startswith("group")] \
        if any(a.startswith("group") for a in set(aligns)) else []
    bench_only = np.flatnonzero(~facts.has_npu)
    keys = npu_entry_of if not grouped and not len(bench_only) else list(npu_entry_of)
    for i in bench_only.tolist():
        keys[i] = ("bench", bench_entry_of[i])
    for i in grouped:
        keys[i] = aligns[i]
    # the usual table holds each call's rows together: a new call wherever the key changes,
    # if no key comes back later (as many runs as distinct keys); else numbered in C (codes)
    unit = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(np.fromiter(map(operator.ne, keys[1:], keys[:-1]), bool, n - 1), out=unit[1:])
    if n and int(unit[-1]) + 1 != len(set(keys)):
        unit = codes(keys)[1].astype(np.int64)
    facts.unit = unit
    # a call's first row: where its code first appears (codes number them in that order)
    seen = np.maximum.accumulate(unit)
    new = np.ones(n, dtype=bool)
    new[1:] = unit[1:] > seen[:-1]
    first = np.flatnonzero(new)
    m = len(first)
    order = np.arange(n) if n == 0 or (seen == unit).all() else np.argsort(unit, kind="stable")
    ends = np.cumsum(np.bincount(unit, minlength=m)).tolist()
    ordered = order.tolist()
    rows = [ordered[s:e] for s, e in zip([0] + ends[:-1], ends)]
    first_rows = first.tolist()
    npu_entries = list(map(npu_entry_of.__getitem__, first_rows))
    first_bench = list(map(bench_entry_of.__getitem__, first_rows))
    npu_mod = result.npu.modules if result.npu else {}
    bench_mod = result.bench.modules if result.bench else {}
    modules = [npu_mod.get(a) or bench_mod.get(b) for a, b in zip(npu_entries, first_bench)] \
        if npu_mod or bench_mod else [None] * m
    matches = [aligns[i] or "exact" for i in first_rows]
    directions = list(map(result.columns["Direction"].__getitem__, first_rows))
    # the first entry each side has, where the call's first row lacks one
    for entries, entry_of, have in ((npu_entries, npu_entry_of, facts.has_npu),
                                    (first_bench, bench_entry_of, facts.has_bench)):
        missing = list(compress(range(m), map(operator.is_, entries, repeat(None))))
        if missing:
            present = np.flatnonzero(have & np.isin(unit, missing))
            firsts = dict(zip(reversed(unit[present].tolist()), reversed(present.tolist())))   # the first wins
            for k, i in firsts.items():
                entries[k] = entry_of[i]
    if result.mode != "tensor":
        _cancellation_floors(result, facts, m, errors)
        _gain_floors(result, facts, m, errors)
    status, input_error, output_error, worst, tolerance, one_minus_cos, max_rel = \
        _errors_of_calls(result, m, facts, errors)
    _saved_inputs(directions, npu_entries, input_error, output_error)
    facts.calls = _CallFacts(input_error, output_error, np.array(tolerance, dtype=np.float64).reshape(-1),
                             named=np.fromiter(map(bool, npu_entries), bool, m),
                             compared=np.fromiter(map(operator.eq, status, repeat("clean")), bool, m))
    input_error, output_error = (_with_none(x, np.isnan(x)) for x in (input_error, output_error))
    phases, apis, exact, api_keys, normalizes = _marks(directions, npu_entries, first_bench)
    facts.calls.api_keys, facts.calls.directions, facts.calls.modules = api_keys, directions, modules
    facts.calls.key_names, facts.calls.key_of = codes(api_keys)
    facts.calls.keyed = np.array(list(map(bool, facts.calls.key_names)) or [False], dtype=bool)
    facts.calls.exact = np.array(exact, dtype=bool).reshape(-1)
    facts.calls.normalizes = np.array(normalizes, dtype=bool).reshape(-1)
    facts.calls.optimizer = np.fromiter(map(operator.eq, phases, repeat("optimizer")), bool, m)
    calls = list(map(CallDiag, range(m), directions, npu_entries, first_bench, matches, rows, input_error,
                     output_error, tolerance, repeat(None), repeat(None), worst, status, modules,
                     one_minus_cos, max_rel, phases, repeat(None), exact, repeat(None), api_keys, repeat(None),
                     repeat(None), repeat(False), normalizes, repeat(0.0), repeat(""), repeat(""), repeat(""),
                     repeat(False), repeat(None), repeat(None), apis))
    _one_sided_nonfinite(result, calls, facts)
    del facts.npu["entry"], facts.bench["entry"]       # (read: not held through the rest)
    facts.aligns = []
    return calls


def _one_sided_nonfinite(result, calls, facts: _RowFacts):
    """Calls whose output has NaN/Inf on one side only (``nonfinite_out``), and of them those
    whose inputs are finite on both sides (``nonfinite``): a backward call's also its forward
    call's inputs and outputs (what it saved). Such a call made the non-finite values: no
    input difference, draw or routing before it explains a NaN from finite numbers, so it is
    named in any mode. A tensor holds NaN/Inf on a side when its Max or Min is not a finite
    number (a NaN tensor's statistics are all NaN); its Mean and Norm say nothing of that: a
    sum of finite values overflows (a float32 attention mask of -3.4e38 summed in float32
    inside a compiled graph has Mean -inf, in float64 eagerly a finite one). A row without
    statistics on a side proves nothing."""
    extremes_a, extremes_b = facts.npu_stats[:, :2], facts.bench_stats[:, :2]
    bad_a = ~np.isfinite(extremes_a).all(axis=1)
    bad_b = ~np.isfinite(extremes_b).all(axis=1)
    known = facts.paired & facts.npu_tensor & facts.bench_tensor & (facts.bench_numel > 0)
    one_sided = known & (bad_a != bad_b) & (facts.part == _OUT)
    if not one_sided.any():
        return
    # tensors a call takes (and, for its backward, gives) not shown finite on both sides
    unproven = facts.npu_tensor & ~(known & ~bad_a & ~bad_b)
    takes = (facts.npu_io >= _IO_CODE["input"]) & (facts.npu_io <= _IO_CODE["parameters"])
    n = len(calls)
    bad_in = np.bincount(facts.unit[unproven & takes], minlength=n) > 0
    bad_io = np.bincount(facts.unit[unproven & (facts.npu_io >= _IO_CODE["input"])
                                    & (facts.npu_io <= _IO_CODE["output"])], minlength=n) > 0
    forward = {u.npu_entry: u.index for u in calls if u.direction == "forward" and u.npu_entry}
    pairs = result.pairs
    verdicts = result.columns["Result"]
    for i in np.flatnonzero(one_sided).tolist():
        u = calls[facts.unit[i]]
        if u.nonfinite_out or verdicts[i] != "error" or pairs[i].npu.store is None or pairs[i].bench.store is None:
            continue            # its first such row names it; a row the compare did not find
                                # NaN/Inf differing in (statistics a merge could not give): nothing known
        u.nonfinite_out, u.nonfinite_side = pairs[i].npu.name, "NPU" if bad_a[i] else "bench"
        facts.calls.touched.add(u.index)
        made = not bad_in[u.index]
        if made and u.direction == "backward":
            f = forward.get(u.npu_entry[: -len("backward")] + "forward") if u.npu_entry else None
            made = f is not None and not bad_io[f]
        u.nonfinite = made


def _errors_of_calls(result, n: int, facts: _RowFacts, errors) -> tuple:
    """Per call (``n``), as lists: its status ("unmatched" with no paired row, "not
    compared" with no compared output, else "clean"), input error (its largest over what
    it takes), output error (these two as arrays, NaN for None) and the row holding it (the largest over what it gives, the
    last such row on a tie), tolerance (its outputs' loosest dtype), and its outputs'
    worst 1 - cosine and max relative error (None where a call has none)."""
    cols = result.columns
    err = facts.err = errors
    known = facts.paired & ~np.isnan(err)
    ins, outs = np.flatnonzero(known & (facts.part == _IN)), np.flatnonzero(known & (facts.part == _OUT))
    paired = np.bincount(facts.unit[facts.paired], minlength=n) > 0
    input_error = _per_call(n, facts.unit[ins], err[ins])
    output_error = _per_call(n, facts.unit[outs], err[outs])
    has_out = np.bincount(facts.unit[outs], minlength=n) > 0
    at_max = outs[err[outs] == output_error[facts.unit[outs]]]
    worst = np.full(n, -1, dtype=np.int64)
    np.maximum.at(worst, facts.unit[at_max], at_max)
    out_rows = outs.tolist()
    rtols = np.array([vd.TOLERANCES[t].rtol if vd.TOLERANCES.get(t) else -np.inf for t in facts.tol_names]
                     or [0.0])
    tolerance = _per_call(n, facts.unit[outs], rtols[facts.tol_code[outs]])
    max_rel_col = cols.get("MaxRelativeErr")              # md5 mode has none
    cos_col = cols["Cosine"] if result.mode == "tensor" else None

    def worst_of(col, value, values):   # per call, the largest ``value`` of its outputs' cells
        if col is None:
            return None
        if isinstance(col, np.ndarray) and col.dtype == np.float64:
            v = values(col[outs])
        else:
            cells = list(map(col.__getitem__, out_rows))
            if set(map(type, cells)) <= {float}:       # every cell a number: at once
                v = values(np.array(cells, dtype=np.float64))
            else:
                v = np.array([value(_f(c)) for c in cells], dtype=np.float64).reshape(-1)
        return _per_call(n, facts.unit[outs], v)
    with np.errstate(invalid="ignore"):
        one_minus_cos = worst_of(cos_col, lambda c: -np.inf if c is None or math.isnan(c) else 1 - c,
                                 lambda c: np.where(np.isnan(c), -np.inf, 1 - c))
        max_rel = worst_of(max_rel_col, lambda m: m if m is not None and math.isfinite(m) else -np.inf,
                           lambda m: np.where(np.isfinite(m), m, -np.inf))
    f32 = vd.TOLERANCES["float32"].rtol
    compared = paired & has_out
    status = np.where(~paired, "unmatched", np.where(has_out, "clean", "not compared")).tolist()
    inputs = np.where(paired, np.where(input_error == -np.inf, 0.0, input_error), np.nan)
    outputs = np.where(compared, output_error, np.nan)
    worsts = _with_none(worst, ~compared)
    tolerances = np.where(compared, np.where(tolerance == -np.inf, f32, tolerance), UNJUDGED_TOLERANCE).tolist()

    def cells(values):
        if values is None:
            return [None] * n
        return _with_none(values, ~compared | (values == -np.inf))
    return status, inputs, outputs, worsts, tolerances, cells(one_minus_cos), cells(max_rel)


def _with_none(values: np.ndarray, empty: np.ndarray) -> list:
    """``values`` as a list of numbers, None where ``empty``."""
    out = values.tolist()
    for i in np.flatnonzero(empty).tolist():
        out[i] = None
    return out


def _saved_inputs(directions: list, npu_entries: list, input_error: np.ndarray, output_error: np.ndarray):
    """A backward call computes from what its forward call saved (inputs, weights,
    outputs) as well as from the gradients it receives: their error is its input too.
    (Per call, before the calls are made: ``input_error`` (NaN for None) is updated in place.
    Each backward call's forward entry looked up in C: ``map`` over 100k calls.)"""
    m = len(directions)
    named = list(map(bool, npu_entries))
    fwd = list(map(operator.and_, map(operator.eq, directions, repeat("forward")), named))
    forward = dict(zip(compress(npu_entries, fwd), compress(range(m), fwd)))    # (the last of a name wins)
    bwd = list(map(operator.and_, map(operator.eq, directions, repeat("backward")), named))
    ks_all = list(compress(range(m), bwd))
    heads = map(_BEFORE_BACKWARD, compress(npu_entries, bwd))
    fs_all = list(map(forward.get, map(str.__add__, heads, repeat("forward"))))
    links = [(k, f) for k, f in zip(ks_all, fs_all) if f is not None]
    if not links:
        return
    ks, fs = (np.array(x, dtype=np.int64) for x in zip(*links))
    keep = ~np.isnan(input_error[ks])
    ks, fs = ks[keep], fs[keep]
    worst = input_error[ks]
    for other in (input_error[fs], output_error[fs]):      # as max() over those there: the first of equals stays
        worst = np.where(other > worst, other, worst)
    input_error[ks] = worst


_BEFORE_BACKWARD = operator.itemgetter(slice(None, -len("backward")))


def _marks(directions: list, npu_entries: list, bench_entries: list) -> tuple:
    """Per call (as lists): its phase ("optimizer" for forward calls after the step's last
    backward call), its ``ApiEntry`` (``CallDiag.api``: parsed from its NPU entry; for a
    call without one, left to be asked), whether its API is exact, its api_key and whether
    it normalizes.

    What a name says of its API is worked out once per API and direction: an API call's
    name is ``{Prefix}.{api}.{N}.{direction}`` and its counter N says nothing of the kind,
    so one parse serves its many calls and the others' ``ApiEntry`` is made from it (a
    parse per call was a tenth of the diagnosis on bench/compare.py's 100k-entry pair)."""
    m = len(directions)
    last_bwd = next((k for k in range(m - 1, -1, -1) if directions[k] == "backward"), None)
    phases = [""] * m
    if last_bwd is not None:
        for k in range(last_bwd + 1, m):
            if directions[k] == "forward":
                phases[k] = "optimizer"
    apis = [_UNPARSED] * m
    kinds = [_NO_KIND] * m
    known: dict = {}        # (API base, its direction, the call's) -> (prefix, api, what it says), or None
    for k, (npu_entry, bench_entry, call_direction) in enumerate(zip(npu_entries, bench_entries, directions)):
        name = npu_entry or bench_entry
        parts = name.rsplit(".", 2) if name else []
        if len(parts) == 3 and (parts[2] == "forward" or parts[2] == "backward") and parts[1].isdigit():
            base, counter, direction = parts
            key = (base, direction, call_direction)
            got = known.get(key, _UNPARSED)
            if got is _UNPARSED:
                api = parse_name(name)
                got = None if api is None else (api.prefix, api.api, _kind(api, call_direction))
                if api is None or (f"{api.prefix}.{api.api}" == base and api.index == int(counter)
                                   and api.direction == direction and not api.io and not api.arg_path):
                    known[key] = got          # (the grammar's: a name it reads otherwise is parsed each time)
            elif got is not None:
                api = ApiEntry(got[0], got[1], int(counter), direction)
            else:
                api = None
            if got is not None:
                kinds[k] = got[2]
        else:
            api = parse_name(name or "")
            if api is not None:
                kinds[k] = _kind(api, call_direction)
        if npu_entry:
            apis[k] = api
    exact, keys, normalizes = (list(x) for x in zip(*kinds)) if m else ([], [], [])
    return phases, apis, exact, keys, normalizes


_NO_KIND = (False, "", False)     # (exact, api_key, normalizes) of a call whose name says no API


def _kind(api, direction: str) -> tuple:
    """(exact, key, normalizes) of a call of ``api`` (an ApiEntry) in ``direction``."""
    return (api.exact if direction == "forward" else api.exact_backward, api.key, api.leaf in NORMALIZING)


_NPU_ENTRY, _INDEX = operator.attrgetter("npu_entry"), operator.attrgetter("index")
_API_KEY = operator.attrgetter("api_key")


def _judge_calls(result, calls: list, facts: _RowFacts, low: bool, statistics: bool) -> None:
    """``_judge`` of every call, the usual ones at once.

    A call whose status needs more than its numbers (a draw, a replay, NaN/Inf on one side,
    in statistics mode a monotone call's extremes or a bounded normalizer's amplification)
    is judged one at a time; every other call's rule reads its input and output error, its
    threshold and what its API is, which numpy works out per column: a Python step per call
    was a fifth of the diagnosis on bench/compare.py's 100k-entry pair."""
    m = len(calls)
    cf = facts.calls
    out, inp, tol = cf.output_error, cf.input_error, cf.tolerance
    inp0 = np.where(np.isnan(inp), 0.0, inp)                    # (u.input_error or 0.0)
    # what the steps after _units set (a draw, a replay, NaN/Inf on one side, the declared
    # precision, the noise), read of the calls they set it on (``cf.touched``)
    declared, noise, noise_in = np.zeros(m), np.zeros(m), np.zeros(m)
    drawn, local, one_sided = np.zeros(m, bool), np.zeros(m, bool), np.zeros(m, bool)
    for k in sorted(cf.touched):
        u = calls[k]
        declared[k], noise[k], noise_in[k] = u.declared, u.noise or 0.0, u.noise_in or 0.0
        drawn[k], local[k], one_sided[k] = u.draw is not None, u.local is not None, bool(u.nonfinite_out)
    threshold = cf.threshold = np.maximum(np.maximum(tol, declared), NOISE_FACTOR * noise)   # CallDiag.threshold
    cf.input_threshold = np.maximum(tol, NOISE_FACTOR * noise_in)                            # ... input_threshold
    beyond = out > threshold                                                      # (NaN: None, never beyond)
    named = cf.named
    keys, key_of = cf.key_names, cf.key_of
    monotone = np.array([_leaf(k) in MONOTONE for k in keys] or [False])[key_of] & named
    bounded = np.array([k.endswith(".forward") and _leaf(k) in _BOUNDED for k in keys] or [False])[key_of] & named
    stats_only = statistics & ~local
    spacing = _input_rounding(facts, m) if statistics else np.zeros(m)
    normalizers = stats_only & beyond & cf.normalizes & bounded
    alone = drawn | local | one_sided | (stats_only & monotone) | normalizers
    bounds = _amplifications(result, calls, facts, np.flatnonzero(normalizers & ~drawn).tolist())
    # a draw with no NaN/Inf of its own and no replay: its law decides (_judge's draw branch)
    by_law = drawn & ~one_sided & ~local
    for k in np.flatnonzero(by_law).tolist():
        u = calls[k]
        u.status = "introduces" if u.draw.broken else "draw"
    for k in np.flatnonzero(alone & ~by_law).tolist():
        u = calls[k]
        alone_stats = statistics and u.local is None
        jump = STATS_JUMP if alone_stats and (low or u.input_error) else JUMP
        over = bool(beyond[k])
        bound = bounds.get(k) if alone_stats and over and u.normalizes and u.draw is None else None
        norm = norm_check(result, u, _Errors(facts.err), bound[0], _SPACING, STATS_JUMP) if bound is not None else None
        rounding = float(spacing[k]) if alone_stats and over else 0.0
        _judge(u, jump, alone_stats, _extremes_check(result, u) if alone_stats and u.draw is None else None, bound,
               norm, rounding, over)
    # the others: unmatched / not compared stay, within the threshold stay clean; beyond it
    # (no draw, replay, bound or extremes to ask), the rule of _judge's last branches
    judged = cf.compared           # (not "unmatched" nor "not compared": no step before changes a status)
    act = np.flatnonzero(~alone & beyond & judged)
    if not len(act):
        return
    inp0, out, tol = inp0[act], out[act], tol[act]
    exact = cf.exact[act]
    given = inp0 != 0.0                                                   # (u.input_error: truthy)
    jumps = np.where(statistics & (low | given), STATS_JUMP, JUMP)
    roundings = spacing[act] if statistics else np.zeros(len(act))
    inherits = (exact | cf.optimizer[act]) & (inp0 > AGREE)
    cant_select = ~inherits & statistics & exact
    jumped = ~inherits & ~cant_select & (out > jumps * np.maximum(inp0, roundings))
    amplified = (inp0 > cf.input_threshold[act]) | (cf.normalizes[act] & given)
    verdict = np.where(cant_select | (jumped & statistics & amplified), 2, np.where(jumped, 1, 0))
    deque(map(setattr, map(calls.__getitem__, act.tolist()), repeat("status"),
              map(_VERDICTS.__getitem__, verdict.tolist())), 0)


_VERDICTS = ("inherits", "introduces", "can't tell")


def _judge(u: CallDiag, jump: float, statistics: bool = False, extremes: bool | None = None,
           bound: tuple | None = None, norm: NormCheck | None = None, rounding: float = 0.0,
           beyond: bool | None = None):
    """``bound``: statistics mode, a normalizer's (amplification, its input's rounding);
    ``norm``: its output Norm against its weight and bias's (normalized_norm);
    ``rounding``: statistics mode, the rounding one side's inputs carry that the other's do
    not (``_input_rounding``): their elements differ by that much whatever their statistics say;
    ``beyond``: whether its output error is beyond its threshold, where the caller knows."""
    if u.nonfinite and u.status not in ("unmatched", "not compared"):
        u.status = "introduces"         # NaN/Inf from finite inputs: whatever came before
        return
    if u.nonfinite_out and u.status not in ("unmatched", "not compared") and u.output_error == math.inf:
        u.status = "inherits"           # NaN/Inf out of inputs not finite on both sides: they came in
        return
    if extremes is False and u.status not in ("unmatched", "not compared"):
        u.status, u.extremes_off = "introduces", True
        return
    if u.draw is not None:              # a random call: its law, not the bench's draw
        u.status = "introduces" if u.draw.broken else "draw"
        return
    if u.status in ("unmatched", "not compared"):
        if u.local is not None and u.local.introduces and _stands_out(u):
            u.status = "introduces"     # judged on its own inputs: no partner needed
        return
    if beyond is None:
        beyond = u.output_error is not None and u.output_error > u.threshold
    if u.local is not None:
        local = u.local.introduces and u.local.local > NOISE_FACTOR * (u.noise or 0.0) and _stands_out(u)
        u.status = "introduces" if local else ("inherits" if beyond else "clean")
        return
    if not beyond:
        u.status = "clean"
    elif statistics and norm is not None and norm.off:
        # whatever its inputs' statistics say: its output Norm is its weight's and bias's
        u.status, u.norm = "introduces", norm
    elif (u.exact_api or u.phase == "optimizer") and (u.input_error or 0.0) > AGREE:
        u.status = "inherits"           # cannot add error of its own / normalises what came in
    elif statistics and u.exact_api:
        u.status = "can't tell"         # a selection adds no error; its statistics moved anyway
    elif (u.output_error or 0.0) > jump * max(u.input_error or 0.0, rounding):    # beyond: a number
        if statistics and bound is not None:
            # a normalizer amplifies its input's difference, or the rounding of its input,
            # by at most what its input's statistics bound: a jump beyond that it made
            amplification, rounding = bound
            u.amplification = amplification
            explained = jump * amplification * max(u.input_error or 0.0, rounding)
            u.status = "introduces" if u.output_error > explained else "can't tell"
            return
        # From four statistics a call whose inputs already differ may have amplified that
        # (sqrt near 0, a division by a small spread) as well as made error of its own;
        # one whose extremes are its function of its inputs' did compute that function.
        amplified = (u.input_error or 0.0) > u.input_threshold or ((extremes or u.normalizes) and u.input_error)
        u.status = "can't tell" if statistics and amplified else "introduces"
    else:
        u.status = "inherits"


def _input_rounding(facts: _RowFacts, n_calls: int) -> np.ndarray:
    """Statistics mode: the spacing (at 1.0) of the lowest precision among the call's inputs
    held in a bf16/fp16 dtype on one side and another dtype on the other (0.0 where none).

    Such an input's elements differ by its rounding at least, ~2**-8 each for bf16, while
    its Max/Min/Mean/Norm agree far closer (a Norm moves by ~u/sqrt(N), an extreme by at
    most u): four statistics say 1e-4 where the elements differ by 0.4%, or by 5% for a
    gradient through a bf16 BatchNorm backward. An add's output extremes then sit at other
    elements than its inputs' (a GPT-2 residual add in fp16, 2.7e-3 from inputs "9e-5" apart), a
    conv's weight gradient sums products that cancel (6% from a gradient "0.2%" apart): the
    jump is measured from that rounding, as a normalizer's already is (``_amplification``)."""
    # Per call (a list by call index), from its rows at once: a per-call walk over its rows
    # was asked of every call whose output differs (most of a 100k-entry pair's).
    spacing = np.zeros(n_calls)
    dtype_a, dtype_b = facts.npu["dtype"], facts.bench["dtype"]
    rows = np.flatnonzero(facts.paired & facts.npu_tensor & facts.bench_tensor
                          & (facts.npu_io >= _IO_CODE["input"]) & (facts.npu_io <= _IO_CODE["parameters"])).tolist()
    differ = [i for i, a, b in zip(rows, map(dtype_a.__getitem__, rows), map(dtype_b.__getitem__, rows)) if a != b]
    for i in differ:
        u = facts.unit[i]
        for cls in (vd.dtype_class(dtype_a[i] or ""), vd.dtype_class(dtype_b[i] or "")):
            if cls in _LOW_PRECISION:
                spacing[u] = max(spacing[u], _SPACING[cls])
    return spacing


# APIs that divide by their input's spread: a difference in the input, however small against
# its magnitude, can come out several times larger against the output's (statistics mode).
# Adam's update is one: exp_avg / sqrt(exp_avg_sq) is about +-1 whatever the gradient's size,
# so a gradient near zero that differs in the last bits moves its weight by the whole step.
NORMALIZING = frozenset({"layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "normalize",
                         "softmax", "log_softmax", "_softmax", "_log_softmax", "npu_rms_norm",
                         "addcdiv", "addcdiv_", "_foreach_addcdiv", "_foreach_addcdiv_", "_fused_adam_",
                         "_fused_adamw_"})
# Normalizers whose amplification of input error their input's statistics bound (statistics
# mode), by what they divide by: the input's spread (mean subtracted), its RMS, or, for the
# softmax family, nothing: exp turns an absolute input difference d into a relative one, so
# a difference relative to the input's magnitude M comes out at most 2 M times larger.
_BOUNDED = {"layer_norm": "spread", "group_norm": "spread", "batch_norm": "spread", "instance_norm": "spread",
            "rms_norm": "rms", "npu_rms_norm": "rms", "normalize": "rms",
            "softmax": "softmax", "_softmax": "softmax", "log_softmax": "log_softmax",
            "_log_softmax": "log_softmax"}
# Per tolerance class, the spacing of the dtype at 1.0: inputs that agree to this (relative to
# their magnitude) differ by rounding alone, which a normalizer amplifies like any difference
_SPACING = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _amplification(result, u, facts: _RowFacts) -> tuple | None:
    """Statistics mode, a forward normalizer: (how much it can amplify its input's relative
    difference, its input's rounding), from the bench side's statistics of the tensor it
    normalizes (its first input) and, for log_softmax, of its output; None otherwise.

    layer/group/batch/instance norm divide by the spread: a difference relative to the
    input's magnitude comes out up to magnitude / std times larger (the spread taken over the
    whole tensor: per row or channel it can be smaller, which the jump factor covers)."""
    if not u.npu_entry or not u.api_key.endswith(".forward") or _leaf(u.api_key) not in _BOUNDED:
        return None                     # (its API's key first: asked of every normalizer)
    api = u.api
    if api is None or api.direction != "forward" or api.leaf not in _BOUNDED:
        return None
    kind = _BOUNDED[api.leaf]
    pairs = result.pairs
    rows = [i for i in u.rows if facts.paired[i] and facts.bench_tensor[i] and facts.bench_numel[i]]
    first = next((i for i in rows if pairs[i].bench.io == "input"), None)
    if first is None:
        return None
    mx, mn, mean, norm = pairs[first].bench.stats[:4]
    if not all(map(math.isfinite, (mx, mn, mean, norm))):
        return None
    rms = abs(norm) / math.sqrt(pairs[first].bench.numel)
    peak = max(abs(mx), abs(mn))
    scale = max(peak, rms)
    if kind == "spread":
        std = math.sqrt(max(rms * rms - mean * mean, 0.0))
        amplification = scale / std if std > 0 else math.inf
    elif kind == "rms":
        amplification = scale / rms if rms > 0 else math.inf
    else:
        amplification = max(2.0 * peak, 1.0)
        if kind == "log_softmax":
            out = next((i for i in rows if pairs[i].bench.io == "output"), None)
            if out is None:
                return None
            omx, omn, _, onorm = pairs[out].bench.stats[:4]
            oscale = max(abs(omx), abs(omn), abs(onorm) / math.sqrt(pairs[out].bench.numel))
            if not math.isfinite(oscale) or oscale <= 0:
                return None
            amplification = max(2.0 * peak / oscale, 1.0)
    if not math.isfinite(amplification):
        return None
    tol_dtype = result.columns["Tolerance Dtype"][first]
    return amplification, _SPACING.get(tol_dtype, _SPACING["float32"])


def _amplifications(result, calls: list, facts: _RowFacts, ks: list) -> dict:
    """``_amplification`` of the calls ``ks`` (their indices; each a forward normalizer of
    ``_BOUNDED`` by its API's key): call -> (amplification, rounding) where there is one.
    Worked out with numpy over the calls at once (the same float operations, in the same
    order), but for log_softmax, whose output's statistics are asked one call at a time."""
    found: dict = {}
    if not ks:
        return found
    n = len(facts.unit)
    takes = np.flatnonzero(facts.paired & facts.bench_tensor & (facts.bench_numel != 0)
                           & (facts.bench_io == _IO_CODE["input"]))
    first_in = np.full(len(calls), n, dtype=np.int64)       # each call's first such row (its input)
    np.minimum.at(first_in, facts.unit[takes], takes)
    kinds, at = [], []
    for k in ks:
        u = calls[k]
        api = u.api
        if api is None or api.direction != "forward" or api.leaf not in _BOUNDED:
            continue
        kind = _BOUNDED[api.leaf]
        if kind == "log_softmax":
            bound = _amplification(result, u, facts)
            if bound is not None:
                found[k] = bound
        elif first_in[k] < n:
            kinds.append(kind)
            at.append(k)
    if not at:
        return found
    first = first_in[at]
    mx, mn, mean, norm = facts.bench_stats[first].T
    by = np.array(kinds)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rms = np.abs(norm) / np.sqrt(facts.bench_numel[first])
        peak = np.maximum(np.abs(mx), np.abs(mn))
        scale = np.maximum(peak, rms)
        std = np.sqrt(np.maximum(rms * rms - mean * mean, 0.0))
        amplification = np.where(by == "spread", np.where(std > 0, scale / std, np.inf),
                                 np.where(by == "rms", np.where(rms > 0, scale / rms, np.inf),
                                          np.maximum(2.0 * peak, 1.0)))
    ok = np.isfinite(facts.bench_stats[first]).all(axis=1) & np.isfinite(amplification)
    tol_dtype = result.columns["Tolerance Dtype"]
    for j in np.flatnonzero(ok).tolist():
        found[at[j]] = (float(amplification[j]), _SPACING.get(tol_dtype[int(first[j])], _SPACING["float32"]))
    return found


# Elementwise APIs that keep or reverse order: the NPU side's output extremes must be the
# function of its own input extremes (statistics mode's re-run). +1 increasing, -1 decreasing.
MONOTONE = {"sqrt": ("sqrt", 1), "sqrt_": ("sqrt", 1), "rsqrt": ("rsqrt", -1), "rsqrt_": ("rsqrt", -1),
            "exp": ("exp", 1), "exp_": ("exp", 1), "log": ("log", 1), "log_": ("log", 1),
            "tanh": ("tanh", 1), "tanh_": ("tanh", 1), "sigmoid": ("sigmoid", 1), "sigmoid_": ("sigmoid", 1),
            "relu": ("relu", 1), "relu_": ("relu", 1), "neg": ("neg", -1), "__neg__": ("neg", -1),
            "erf": ("erf", 1), "exp2": ("exp2", 1), "log2": ("log2", 1), "log1p": ("log1p", 1),
            "expm1": ("expm1", 1), "atan": ("atan", 1), "asinh": ("asinh", 1), "sinh": ("sinh", 1)}
_EPS = {"torch.bfloat16": 2.0 ** -8, "torch.float16": 2.0 ** -11, "torch.float32": 2.0 ** -24}


_LEAVES: dict = {}      # api_key -> its API's leaf ("Torch.linalg.norm.forward" -> "norm")


def _leaf(api_key: str) -> str:
    leaf = _LEAVES.get(api_key)
    if leaf is None:
        leaf = api_key.rpartition(".")[0].rpartition(".")[2]
        if len(_LEAVES) < 1 << 12:
            _LEAVES[api_key] = leaf
    return leaf


def _monotone(name: str, x: float) -> float:
    f = {"sqrt": math.sqrt, "rsqrt": lambda v: 1 / math.sqrt(v), "exp": math.exp, "log": math.log,
         "tanh": math.tanh, "sigmoid": lambda v: 1 / (1 + math.exp(-v)) if v > -700 else 0.0,
         "relu": lambda v: max(v, 0.0), "neg": lambda v: -v, "erf": math.erf, "exp2": lambda v: 2.0 ** v,
         "log2": math.log2, "log1p": math.log1p, "expm1": math.expm1, "atan": math.atan,
         "asinh": math.asinh, "sinh": math.sinh}[name]
    return f(x)


def _extremes_check(result, u) -> bool | None:
    """Statistics mode: True when the NPU output's Max and Min are the API applied to its own
    input's extremes (within 4 roundings), False when not (the kernel computes something
    else), None when that cannot be checked (not a monotone elementwise call)."""
    if not u.npu_entry or _leaf(u.api_key) not in MONOTONE:     # (asked of every call: its API's leaf first)
        return None
    api = u.api
    if api is None or api.direction != "forward" or api.leaf not in MONOTONE:
        return None
    rows = [result.pairs[i].npu for i in u.rows if result.pairs[i].npu is not None]
    ins = [r for r in rows if r.io == "input" and r.kind == "tensor"]
    outs = [r for r in rows if r.io == "output" and r.kind == "tensor"]
    if len(ins) != 1 or len(outs) != 1 or ins[0].numel != outs[0].numel or not ins[0].numel:
        return None
    name, sign = MONOTONE[api.leaf]
    (imx, imn), (omx, omn) = ins[0].stats[:2], outs[0].stats[:2]
    try:
        want = (_monotone(name, imx), _monotone(name, imn)) if sign > 0 else (_monotone(name, imn), _monotone(name, imx))
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
    if not all(map(math.isfinite, (omx, omn, *want))):
        return None
    eps = _EPS.get(outs[0].dtype or "", 2.0 ** -8)
    return all(abs(got - w) <= 4 * eps * abs(w) + 1e-30 for got, w in zip((omx, omn), want))


def _stands_out(u: CallDiag) -> bool:
    """A replayed call beyond a correct CPU kernel is blamed unless most calls of its API are
    (the device's precision): then only when its error, or the scale part of it, stands out
    from theirs. (The device's own error is correlated across a call's outputs, the rounded
    weights being shared, so rounding's scale test would blame every call.)"""
    if not u.device_error or u.local is None:
        return True
    return max(u.local.local, abs(u.local.bias)) > STAND_OUT * u.device_error


def _eligible(calls):
    """API calls when the dump has them (module entries wrap them and would repeat the
    verdict one level up); modules for an L0 dump; never parameter-gradient entries."""
    has_api = any(not u.name.startswith("Module.") for u in calls)
    return [u for u in calls if (u.direction == "forward" or u.direction == "backward")
            and (not has_api or not (u.npu_entry or u.bench_entry or "").startswith("Module."))]


def _unmatched_before(seq, k):
    """The one-sided calls right before position k (back to the previous compared call)."""
    out = []
    for c in reversed(seq[:k]):
        if c.status != "unmatched":
            break
        out.append(c)
    return out[::-1]


def _first(calls, direction):
    """The first call that introduces error in ``direction``, and the first whose inputs
    differ while nothing before it introduced error (None each when there is none)."""
    seq = [u for u in calls if u.direction == direction]
    differ = None
    for k, u in enumerate(seq):
        if u.status == "introduces":
            return Divergence("introduced", u, _unmatched_before(seq, k)), differ
        if differ is None and u.status in ("inherits", "clean") and \
                (u.input_error or 0.0) > u.input_threshold:
            differ = Divergence("inputs_differ", u, _unmatched_before(seq, k))
    return None, differ


def _round_bf16(x):
    """float64 array ``x`` rounded to bfloat16 (via float32, nearest even), as a cast would."""
    import numpy as np
    with np.errstate(over="ignore", invalid="ignore"):
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return np.where(np.isfinite(x), bits.view(np.float32).astype(np.float64), x)


def _round_fp16(x):
    import numpy as np
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float64)


_CASTS = {"torch.bfloat16": _round_bf16, "torch.float16": _round_fp16}


_FNV_PRIME = np.uint64(0x100000001B3)


def _key_ids(table: np.ndarray) -> tuple[np.ndarray, int]:
    """Per row of ``table`` (rows x k float64), an id shared by the rows of the same bytes;
    and how many there are.

    The rows are told apart by a 64-bit hash of their bytes, checked: where two rows of
    one hash differ (a collision), by their bytes themselves (sorting 200k rows of bytes
    was a tenth of the diagnosis on bench/compare.py's 100k-entry pair)."""
    bits = np.ascontiguousarray(table).view(np.uint64)
    h = np.zeros(len(bits), dtype=np.uint64)
    for column in bits.T:
        h = (h * _FNV_PRIME) ^ column
    uniq, first, ids = np.unique(h, return_index=True, return_inverse=True)
    ids = ids.reshape(-1)
    if (bits == bits[first[ids]]).all():
        return ids, len(uniq)
    keys = np.ascontiguousarray(table).view(f"V{table.itemsize * table.shape[1]}").ravel()
    uniq, ids = np.unique(keys, return_inverse=True)
    return ids.reshape(-1), len(uniq)


def _first_before(ids: np.ndarray, n_ids: int, pos: np.ndarray, src: np.ndarray, ask: np.ndarray) -> np.ndarray:
    """For the ``ask`` rows: whether a ``src`` row with the same id comes before them
    (``pos``: the rows' order)."""
    first = np.full(n_ids, len(pos), dtype=np.int64)
    np.minimum.at(first, ids[src], pos[src])
    return first[ids[ask]] < pos[ask]


def _state(calls, facts: _RowFacts) -> State:
    """Inputs of forward calls that no earlier call of the step produced, and that differ.

    A tensor's identity is not in the dump; its (dtype, shape, statistics) are, and an
    output and the later input it feeds carry the same ones exactly, or, through a cast
    that is not dumped (HF's softmax output ``.to(bf16)``), the same shape and the
    extremes rounded to the new dtype. The step's forward tensors are taken in call
    order at once: an input is produced when an output with its key comes before it."""
    cf = facts.calls
    forward = np.fromiter(map(operator.eq, cf.directions, repeat("forward")), bool, len(calls)) & ~cf.optimizer
    io = facts.npu_io
    seq = np.flatnonzero(forward[facts.unit] & facts.npu_tensor & (io >= _IO_CODE["input"])
                         & (io <= _IO_CODE["output"]))
    seq = seq[np.argsort(facts.unit[seq], kind="stable")]       # in call order (each call's rows in order)
    out = io[seq] == _IO_CODE["output"]
    rows = seq.tolist()
    dtypes, dtype = codes(list(map(facts.npu["dtype"].__getitem__, rows)))
    _, shape = codes(list(map(facts.npu["shape"].__getitem__, rows)))
    stats = facts.npu_stats[seq]
    err = facts.err[seq]
    pos = np.arange(len(seq))
    ids, n_ids = _key_ids(np.column_stack([dtype, shape, stats]))      # (the codes as float64)
    todo = ~out & facts.paired[seq] & ~np.isnan(err)
    todo[todo] = ~_first_before(ids, n_ids, pos, out, todo)
    for name, rnd in _CASTS.items():        # a cast that is not dumped: rounded extremes
        if name not in dtypes:
            continue
        code = dtypes.index(name)
        ask = todo & (dtype == code) & ~np.isnan(stats[:, :2]).any(axis=1)
        if not ask.any():
            continue
        src = out & (dtype != code)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.column_stack([shape, rnd(stats[:, 0]) + 0.0, rnd(stats[:, 1]) + 0.0])   # (+0.0: -0 is 0)
        table = np.where(ask[:, None], np.column_stack([shape, stats[:, 0] + 0.0, stats[:, 1] + 0.0]), cast)
        cid, n_cid = _key_ids(table)
        todo[ask] = ~_first_before(cid, n_cid, pos, src, ask)
    differ = np.flatnonzero(todo & (err > 0))
    differ = differ[np.argsort(-err[differ], kind="stable")]      # largest error first, then in call order
    made = seq[differ]
    return State(OutsideInputs(made, err[differ], facts.unit[made], facts.npu["name"], facts.npu["shape"],
                               cf.modules), int(todo.sum()))


def _drift(calls) -> Drift:
    forward = backward = largest = fastest = None      # (the first of equals, as max() keeps)
    top = fast = 0.0
    isfinite = math.isfinite
    for u in calls:
        e = u.output_error
        if e is None or u.status == "not compared":
            continue
        if u.direction == "forward":
            if u.phase != "optimizer":
                forward = e
        elif u.direction == "backward":
            backward = e
        if not isfinite(e):
            continue
        if largest is None or e > top:
            largest, top = u, e
        if u.status == "inherits" and u.input_error:
            ratio = e / u.input_error
            if fastest is None or ratio > fast:
                fastest, fast = u, ratio
    return Drift(forward, backward, largest, fastest)


def _low_precision(result):
    for dt in dict.fromkeys(result.columns.get("NPU Dtype", ())):     # a few distinct, in order
        if dt and any(lp in dt for lp in _LOW_PRECISION):
            return next(lp for lp in _LOW_PRECISION if lp in dt)
    return None


def _replay(result, calls, replays, progress: bool) -> int:
    """Judge by their local error the calls whose output differs (tensor dumps), and the
    NPU calls with no partner, which need none to be re-run on their own inputs. A group
    (one side's fused call against the other's several) is judged through each of its
    NPU calls: the worst names the group."""
    todo = [u for u in calls if u.npu_entry and u.draw is None and not u.name.startswith("Module.")
            and (u.status == "unmatched" or (u.status != "not compared" and u.output_error))]
    if not todo:
        return 0
    import torch
    from tqdm import tqdm
    done = 0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # small calls one at a time: waking a pool costs more than it saves
    try:
        for u in tqdm(todo, desc="replay calls", unit="call", delay=2.0,
                      disable=None if progress else True):   # (None: on a terminal only)
            worst, worst_entry = None, u.npu_entry
            for entry in _npu_entries(result, u):
                le = replays.local_error(entry)
                if le is not None and (worst is None or (le.introduces, le.ratio) > (worst.introduces, worst.ratio)):
                    worst, worst_entry = le, entry
            u.local = worst
            if worst is not None and worst_entry != u.npu_entry and worst.introduces:
                u.npu_entry = worst_entry      # the group's call that made the error
            done += worst is not None
    finally:
        torch.set_num_threads(threads)
    return done


def _npu_entries(result, u) -> list:
    """The NPU entries of a call (several for a group), in table order."""
    if not u.match.startswith("group"):
        return [u.npu_entry]
    return list(dict.fromkeys(result.pairs[i].npu.entry for i in u.rows if result.pairs[i].npu is not None))


def _draws(calls, replays, facts: _RowFacts) -> Draws | None:
    """Random calls judged by their law on the NPU side's own dump (draws.py).

    Whether an API can draw is asked of its first call (most calls of a dump: none), and a
    dropout's law from statistics is checked for its calls at once (draws.dropout_laws_stats):
    10k dropout calls of bench/compare.py's 100k-entry pair were a tenth of the diagnosis."""
    A, cf = facts.npu_rows, facts.calls
    every = np.fromiter(map(_INDEX, calls), np.int64, len(calls))
    key = cf.key_of[every]
    asked = np.flatnonzero(cf.named[every] & cf.keyed[key])   # (no API parsed from its NPU entry: u.api is None)
    if not len(asked):
        return None
    can = np.zeros(len(cf.key_names), dtype=bool)
    for f in np.unique(key[asked], return_index=True)[1].tolist():
        can[key[asked[f]]] = draws.may_draw(calls[int(asked[f])].api)
    drawing = list(map(calls.__getitem__, asked[can[key[asked]]].tolist()))
    if not drawing:
        return None
    # each drawing call's first NPU tensor input and output row (-1: none)
    mine = np.zeros(len(facts.calls.input_error), dtype=bool)
    mine[list(map(_INDEX, drawing))] = True
    rows = np.flatnonzero(mine[facts.unit] & facts.npu_tensor)
    first_in, first_out = (_first_row(facts, rows[facts.npu_io[rows] == _IO_CODE[io]], len(mine))
                           for io in ("input", "output"))
    # a call's forward call is of its API: one that can draw too
    forward = {u.npu_entry: u for u in drawing if u.direction == "forward"}
    forward_args: dict = {}          # forward call -> (its scalar arguments (draws.arguments), their number)
    numbered: dict = {}              # the arguments' items -> their number (most calls: a few sets)
    kinds: dict = {}                 # (API key, arguments' number) -> (draw kind, dropout's p)
    checks: list = []                # per call drawn: (call, kind, its DrawCheck or its place in ``by_stats``)
    by_stats: list = []              # dropout calls judged from statistics: (input row, output row, p)
    for u in drawing:
        api = u.api
        fwd = forward.get(f"{api.base}.forward")
        args: dict | None = None
        number: int | None = -1
        if fwd is not None:
            args, number = forward_args.get(fwd.index, (None, None))
            if args is None:
                args = draws.arguments(r for r in map(A.__getitem__, fwd.rows) if r is not None)
                try:            # (typed: an argument 1 is not True, nor 0.1 a text)
                    number = numbered.setdefault(tuple((name, place, type(value), value)
                                                       for name, (place, value) in args.items()), len(numbered))
                except TypeError:       # an argument that is no key (a list): asked alone
                    number = None
                forward_args[fwd.index] = args, number
        # a draw's kind and p are its API's (key) and its arguments' alone: asked once per such pair
        law = kinds.get((u.api_key, number)) if number is not None else None
        if law is None:
            kind = draws.draw_kind(api, args or {})
            law = kind, (draws.dropout_p(api, args or {}) if kind == "dropout" and api.leaf in DROPOUT_ARGS
                         else None)
            if number is not None:
                kinds[u.api_key, number] = law
        kind, p = law
        if kind is None:
            continue
        ix, iy = int(first_in[u.index]), int(first_out[u.index])
        x, y = (A[ix] if ix >= 0 else None), (A[iy] if iy >= 0 else None)
        found: DrawCheck | int | None = None      # its check, or its place in ``by_stats``
        if p is not None:             # (a dropout of DROPOUT_ARGS)
            got = replays.first_tensors(u.npu_entry) if replays is not None else None
            if got is not None:
                found = draws.dropout_law_tensors(got[0], got[1], p, got[2])
            elif x is not None and y is not None and x.numel == y.numel:
                found = len(by_stats)
                by_stats.append((ix, iy, p))
        elif kind in ("uniform", "normal") and y is not None:
            values = replays.output_tensor(u.npu_entry) if replays is not None else None
            if values is not None:
                found = (draws.uniform_law_tensors if kind == "uniform" else draws.normal_law_tensors)(values)
            else:
                found = (draws.uniform_law_stats if kind == "uniform" else draws.normal_law_stats)(y.stats, y.numel)
        checks.append((u, kind, found))
    laws: list = []
    if by_stats:
        xs, ys, ps = zip(*by_stats)
        laws = draws.dropout_laws_stats(facts.npu_stats[list(xs)], facts.npu_stats[list(ys)],
                                        np.array(ps, dtype=np.float64))
    n, differ, first, unjudged = 0, 0, None, []
    for u, kind, found in checks:
        if isinstance(found, DrawCheck):
            check = found
        elif found is not None:
            check = laws[found]
        else:
            check = DrawCheck("", False, "a random draw: not compared element by element"
                              + (" (its mask is drawn inside the kernel: it cannot be checked; compare with "
                                 "eager attention, or dropout_p=0 for the check run)" if kind == "draw"
                                 and u.api.leaf == "scaled_dot_product_attention" else ""))
            unjudged.append(u.npu_entry)
        check.differs = u.output_error is not None and u.output_error > u.threshold
        u.draw = check
        facts.calls.touched.add(u.index)
        n += 1
        if check.differs:
            differ += 1
            first = first or u.npu_entry
    return Draws(n, differ, first, unjudged) if n else None


def _first_row(facts: _RowFacts, rows: np.ndarray, n_calls: int) -> np.ndarray:
    """Per call, the first of ``rows`` (row indices, ascending) that is its; -1 for none."""
    first = np.full(n_calls, -1, dtype=np.int64)
    units = facts.unit[rows]
    at = np.unique(units, return_index=True)[1]
    first[units[at]] = rows[at]
    return first


def _after_differing_paths(calls, drawn, facts: _RowFacts) -> str | None:
    """Statistics mode: after the first differing draw, or the first call whose output has
    another number of elements on each side (a data-dependent path: tokens routed to other experts, a
    mask of another size), tensors that differ element by element can have much the same
    Max/Min/Mean/Norm, so the inputs' statistics no longer show how much the inputs differ.
    A call after it is "can't tell" unless its own extremes convict it. Returns the first
    call whose output shape differs, if that came first."""
    firsts = []
    if drawn is not None and drawn.differ:
        firsts.append(next(u.index for u in calls if u.npu_entry == drawn.first_differing))
    A, B = facts.npu_rows, facts.bench_rows     # (paired NPU output tensors of another shape: few)
    other_shape = np.flatnonzero(facts.paired & facts.npu_tensor & (facts.npu_io == _IO_CODE["output"])
                                 & ~facts.same_shape).tolist()
    shaped = next((calls[k] for k in sorted({facts.unit[i] for i in other_shape if A[i].numel != B[i].numel})
                   if calls[k].direction == "forward"), None)
    if shaped is not None:
        firsts.append(shaped.index)
    if not firsts:
        return None
    first = min(firsts)
    for u in calls[first + 1:]:   # NaN/Inf on one side only (an infinite error) convicts whatever came before
        if u.status == "introduces" and u.draw is None and not u.extremes_off \
                and not u.nonfinite and u.output_error is not None and math.isfinite(u.output_error):
            u.status = "can't tell"
    return shaped.npu_entry if shaped is not None and shaped.index == first else None


def _declared_precision(result, calls, touched: set) -> None:
    """Matrix-unit calls with fp32 outputs, in a pair where either run declares reduced-precision
    products for them, are allowed ``REDUCED_PRODUCT`` of their own error (``declared``; their
    indices added to ``touched``)."""
    from probe.dump.math_modes import reduced_precision
    on: list = []
    for side in (result.npu, result.bench):
        if side is not None and side.meta.math_modes:
            on += reduced_precision(side.meta.math_modes)
    matmuls = any(k.startswith(_MATMUL_SETTINGS) for k in on)
    convs = any(k.startswith(_CONV_SETTINGS) for k in on)
    if not (matmuls or convs):
        return
    f32 = vd.TOLERANCES["float32"].rtol
    for u in calls:
        if not u.api_key or u.tolerance != f32:   # fp32 outputs only: TF32/HF32 take fp32 products
            continue
        api = u.api_key.rsplit(".", 1)[0].split(".", 1)[-1]
        if api in MATRIX_UNIT and (convs if api in _CONVS else matmuls):
            u.declared = REDUCED_PRODUCT
            touched.add(u.index)


def _stats_device_precision(calls) -> list:
    """Statistics mode's counterpart of _device_precision: when most calls of one API (the
    matrix-unit family pooled) whose inputs agree within their tolerance still differ
    beyond it, their median output error is the device's; a call that jumped stays named
    only when its error stands out from it. (Calls whose inputs differ are left out: after
    one faulty call every later one differs, and would pass for the device's precision.)"""
    import statistics as st
    groups: dict = {}
    pooled: dict = {}       # api_key -> its group's key
    for u in calls:   # the calls given (nearly) agreeing inputs: what each adds on its own
        if u.status in ("introduces", "can't tell", "clean", "inherits") and u.api_key and u.draw is None \
                and u.output_error is not None and (u.input_error or 0.0) <= u.input_threshold:
            key = pooled.get(u.api_key)
            if key is None:
                api = u.api_key.rsplit(".", 1)[0].split(".", 1)[-1]
                key = pooled[u.api_key] = "matrix units" if api in MATRIX_UNIT else u.api_key
            groups.setdefault(key, []).append(u)
    found = []
    for key in sorted(groups):
        us = groups[key]
        jumped = [u for u in us if u.status in ("introduces", "can't tell")]
        beyond = [u for u in us if u.output_error > u.threshold]
        if len(us) < MIN_POPULATION or len(beyond) <= MOST * len(us) or not jumped:
            continue
        typical = st.median(u.output_error for u in us)
        if typical > max(PLAUSIBLE, max(u.tolerance for u in us)) or not math.isfinite(typical):
            continue
        for u in jumped:
            u.device_error = typical
            if u.output_error <= STAND_OUT * typical:
                u.status = "inherits"
        found.append(DevicePrecision(key, len(us), typical, typical / max(us[0].tolerance, 1e-30)))
    return found


def _device_precision(calls) -> list:
    """What the NPU side adds per API, measured on the run: when most replayed calls of one
    API (matrix-unit APIs pooled: one device setting moves them all) are beyond a correct
    CPU kernel of their dtype by a similar factor, that factor is the device's precision
    (TF32/HF32, another blocking), and a call is blamed only when it stands out from it."""
    import statistics as st
    groups: dict = {}
    for u in calls:
        if u.local is None or u.draw is not None or not u.api_key:
            continue
        api = u.api_key.rsplit(".", 1)[0].split(".", 1)[-1]
        key = "matrix units" if api in MATRIX_UNIT else u.api_key
        groups.setdefault(key, []).append(u)
    found = []
    for key in sorted(groups):
        us = groups[key]
        beyond = [u for u in us if u.local.local > u.local.allowed]
        if len(us) < MIN_POPULATION or len(beyond) <= MOST * len(us):
            continue
        typical_error = st.median(u.local.local for u in us)
        if typical_error > max(PLAUSIBLE, max(u.tolerance for u in us)):
            continue
        excess = st.median(u.local.ratio for u in us)
        for u in us:
            u.device_excess, u.device_error = excess, typical_error
        found.append(DevicePrecision(key, len(us), typical_error, excess))
    return found


def diagnose(result, noise: dict | None = None, replay: bool | None = None,
             progress: bool = False) -> Diagnosis:
    """Per-call local/inherited verdicts, first divergence forward and backward, suspects.

    ``noise``: bench entry -> run-to-run (input, output) error of that call (noise_floor).
    ``replay``: re-run calls on the NPU's inputs (default: in tensor mode)."""
    facts = _RowFacts.of(result)
    errors = row_errors(result, facts)
    calls = _units(result, errors, facts)
    low = _low_precision(result)
    touched = facts.calls.touched         # calls whose fields the steps below set (_judge_calls reads them)
    _declared_precision(result, calls, touched)
    if noise:
        for u in calls:
            if u.bench_entry in noise:
                u.noise_in, u.noise = noise[u.bench_entry]
                touched.add(u.index)
    eligible = _eligible(calls)
    replayed = 0
    replays = None
    if (result.mode == "tensor" if replay is None else replay) and result.npu is not None:
        replays = Replays(result.npu.json_path)
    drawn = _draws(eligible, replays, facts)
    device = []
    if replays is not None:
        replayed = _replay(result, eligible, replays, progress)
        touched.update(u.index for u in eligible if u.local is not None)
        device = _device_precision(eligible)
    statistics = result.mode != "tensor"
    paths_differ = None
    _judge_calls(result, calls, facts, bool(low), statistics)
    if statistics:
        device += _stats_device_precision(eligible)
        paths_differ = _after_differing_paths(calls, drawn, facts)
    if device and result.npu is not None and result.npu.meta.math_modes:
        from probe.dump.math_modes import reduced_precision
        settings = tuple(reduced_precision(result.npu.meta.math_modes))
        for p in device:
            p.settings = settings
    (fwd, fwd_differ), (bwd, bwd_differ) = _first(eligible, "forward"), _first(eligible, "backward")
    intro = [u for u in eligible if u.status == "introduces"]
    firsts = [d.call for d in (fwd, bwd) if d is not None]
    intro.sort(key=lambda u: -u.score)
    suspects = firsts + [u for u in intro if u not in firsts]
    measure = ("relative L2 error ||npu-bench||/||bench||" if result.mode == "tensor"
               else "worst statistic difference relative to the tensor's magnitude")
    primary = fwd or bwd
    covered = coverage(result, eligible, primary.call if primary is not None else None,
                       [u for u in eligible if u.nonfinite_out])
    return Diagnosis(calls, fwd, bwd, suspects[:N_SUSPECTS], measure,
                     inputs_differ=fwd_differ or bwd_differ, state=_state(calls, facts),
                     drift=_drift(eligible), replayed=replayed, low_precision=low, draws=drawn, device=device,
                     paths_differ=paths_differ, coverage=covered)


def noise_floor(bench_json: str, bench2_json: str, **kw) -> dict:
    """bench entry -> (input, output) error between two bench runs of the same program:
    what nondeterminism alone produces at that call."""
    from .engine import compare_dumps
    r = compare_dumps(bench2_json, bench_json, progress=False, **kw)
    out = {}
    facts = _RowFacts.of(r)
    for u in _units(r, row_errors(r, facts), facts):
        if u.bench_entry and u.output_error is not None:
            out[u.bench_entry] = (u.input_error or 0.0, u.output_error)
    return out


def mark_rows(result, diag: Diagnosis) -> None:
    """Make the rows agree with the diagnosis: the worst output row of a call that
    introduces error is an error row that says why; an error row of a call shown by its
    replay to inherit becomes a warning that says so (its inputs explain it)."""
    cols = result.columns
    verdicts, messages = cols["Result"], cols["Err_message"]
    for u in diag.calls:
        if u.status == "introduces" and u.worst_row is not None:
            i = u.worst_row
            verdicts[i] = "error"
            text = f"error: introduces error: {u.reason}"
            messages[i] = text + ("; " + messages[i] if messages[i] else "")
        elif u.status in ("inherits", "clean") and u.local is not None:
            for i in u.rows:
                if verdicts[i] == "error" and result.pairs[i].npu is not None \
                        and result.pairs[i].npu.io in ("output", "parameters_grad"):
                    verdicts[i] = "warning"
                    messages[i] = f"warning: inherited: {u.reason}; " + messages[i]
