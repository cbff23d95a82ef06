"""Statistics mode: the output Norm of a normalizer, which its weight and bias fix.

``layer_norm``, ``rms_norm``, ``group_norm`` and a training ``batch_norm`` divide each
row (group, channel) by its own spread: the normalized tensor has mean square
v / (v + eps) ~ 1 in every row whatever the input was, so the output ``x_hat * w + b``
has Norm ~ sqrt(rows x (||w||^2 + ||b||^2)). Two sides' output Norms therefore differ by
what their weights and biases say, and by little else: the input's difference moves it
only through how unevenly the weight weighs the features (its spread), the eps and the
bias's cross term, and rounding of the output by its dtype. A kernel that scales its
output (a wrong rstd, a weight applied twice) moves it by the whole scale.

The general statistics rule cannot see that in a bf16 run against fp32: the call's input
error is the worst of its inputs', and a bias that moved by 3% of its own (tiny)
magnitude after one AdamW step makes any output jump look explained (GPT-2's LayerNorm
scaled by 1.2: output 0.2 off, input "0.03", no 10x jump). Measured on the cross-device
runs of ``tests/`` (GPT-2, Llama with ``F.rms_norm``, the MoE whose tokens route
differently, the conv net's training BatchNorm; bf16, fp16 with a GradScaler, TF32,
split-K, its own random stream with dropout; 3-4 steps, 155 calls): the Norm's departure
from what the weights give is at most 2.8e-4 (after dropout drew other numbers, whose
inputs differ by 10-20%; 1.7e-4 for the conv net's bf16 BatchNorm, 5.5e-6 for GPT-2's
LayerNorms in bf16), where bf16's spacing, the least the bound allows in a bf16 run, is
28x that; 1.5e-8 with sums reordered in fp32, 7.7e-7 with TF32. No call comes within 9x
of its bound. A LayerNorm scaled by 1.2 departs by 0.2 (16x its bound), by
1.05 0.05 (4x), by 1.02 0.02 (1.4x).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Protocol

import msgspec

# leaf -> (weight, bias, eps: each the argument's position or keyword; None where the API
# has none), the eps when not given, and the position/keyword of a "training" flag that
# must be True (batch_norm in eval mode normalizes by running statistics, not its own)
_ARGS = {
    "layer_norm": (("2", "weight"), ("3", "bias"), ("4", "eps"), 1e-5, None),
    "group_norm": (("2", "weight"), ("3", "bias"), ("4", "eps"), 1e-5, None),
    "rms_norm": (("2", "weight"), None, ("3", "eps"), 0.0, None),
    "npu_rms_norm": (("1", "gamma"), None, ("2", "epsilon"), 1e-6, None),
    "batch_norm": (("3", "weight"), ("4", "bias"), ("7", "eps"), 1e-5, ("5", "training")),
}
_RMS = frozenset({"rms_norm", "npu_rms_norm"})     # divide by the RMS, no mean subtracted


class RowErrors(Protocol):
    """Per row its relative error (a float), None where nothing was compared (diagnosis.row_errors)."""
    def __getitem__(self, i: int) -> Any: ...


class NormCheck(msgspec.Struct, frozen=True, gc=False):
    """A normalizer's output Norm against what its weight and bias give."""
    ratio: float        # the NPU side's output Norm / the bench's
    expected: float     # the same ratio of sqrt(||w||^2 + ||b||^2), NPU over bench
    allowed: float      # relative departure of ratio from expected that rounding and the inputs explain

    @property
    def departure(self) -> float:
        return abs(self.ratio / self.expected - 1.0)

    @property
    def off(self) -> bool:
        return self.departure > self.allowed


def _arg(rows: dict, where) -> Optional[int]:
    if where is None:
        return None
    for key in where:
        i = rows.get(".input." + key)
        if i is not None:
            return i
    return None


def norm_check(result, u, errors: RowErrors, amplification: float, spacing: Mapping[str, float],
               jump: float) -> Optional[NormCheck]:
    """``u``'s output Norm against its parameters' (statistics mode, a forward normalizer
    whose input, output and parameters are compared tensors); None where that cannot be
    checked.

    ``errors``: per row, the relative error of the statistics (diagnosis.row_errors);
    ``amplification``: how much its input's statistics let it amplify a relative input
    difference (magnitude / spread); ``spacing``: per tolerance class, the dtype's
    spacing at 1.0; ``jump``: the factor by which a call must exceed what explains it.

    Allowed: the output's spacing (bf16 2^-7: a kernel computing its statistics in bf16
    may shift every row alike) plus ``jump`` x what the inputs can move: the input's
    difference (at least its rounding) times the amplification, times how much the Norm
    depends on where the normalized values lie (the weight's spread around its RMS, the
    eps against the input's variance, twice the bias against the weight), and the
    weight's and bias's own differences that the ratio of their Norms does not carry."""
    api = u.api
    if api is None or api.direction != "forward" or api.leaf not in _ARGS or not u.npu_entry:
        return None
    w_at, b_at, eps_at, eps_default, training_at = _ARGS[api.leaf]
    pairs, tol = result.pairs, result.columns["Tolerance Dtype"]
    head = len(u.npu_entry)
    rows = {}
    for i in u.rows:
        p = pairs[i]
        if p.npu is not None and p.bench is not None and p.npu.entry == u.npu_entry:
            rows[p.npu.name[head:]] = i
    x, y = rows.get(".input.0"), rows.get(".output.0")
    w, b, eps_row, training = (_arg(rows, at) for at in (w_at, b_at, eps_at, training_at))
    if x is None or y is None or errors[x] is None:
        return None
    for i in (x, y, w, b):
        if i is not None and (pairs[i].npu.kind != "tensor" or pairs[i].bench.kind != "tensor"
                              or not pairs[i].bench.numel or pairs[i].npu.shape != pairs[i].bench.shape):
            return None
    if training_at is not None and (training is None or pairs[training].npu.value is not True
                                    or pairs[training].bench.value is not True):
        return None
    if (w is None and b is not None) or any(errors[i] is None for i in (w, b) if i is not None):
        return None
    eps = pairs[eps_row].bench.value if eps_row is not None else None
    eps = float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else eps_default
    ny, by = pairs[y].npu.stats, pairs[y].bench.stats
    stats = [ny[3], by[3], *pairs[x].bench.stats[:4]]
    if w is not None:
        stats += [*pairs[w].npu.stats[:4], *pairs[w].bench.stats[:4]]
    if b is not None:
        stats += [*pairs[b].npu.stats[:4], *pairs[b].bench.stats[:4]]
    if not all(map(math.isfinite, stats)) or by[3] <= 0 or ny[3] < 0:
        return None
    _, _, mean, norm = pairs[x].bench.stats[:4]
    ms = (norm * norm) / pairs[x].bench.numel
    var = ms if api.leaf in _RMS else max(ms - mean * mean, 0.0)
    if var <= 0:
        return None
    uneven = eps / (var + eps)
    expected = 1.0
    params = 0.0
    if w is not None:
        wmx, wmn, _, wnorm_b = pairs[w].bench.stats[:4]
        wnorm_n = pairs[w].npu.stats[3]
        w_ms = wnorm_b * wnorm_b / pairs[w].bench.numel
        if w_ms <= 0:
            return None
        hi, lo = max(wmx * wmx, wmn * wmn), (min(wmx * wmx, wmn * wmn) if wmx * wmn > 0 else 0.0)
        uneven += max(hi - w_ms, w_ms - lo) / w_ms
        bnorm_n = bnorm_b = 0.0
        params = errors[w]
        if b is not None:
            bmx, bmn, _, bnorm_b = pairs[b].bench.stats[:4]
            bnorm_n = pairs[b].npu.stats[3]
            b_ratio = max(abs(bmx), abs(bmn)) / math.sqrt(w_ms)
            uneven += 2.0 * b_ratio
            params += errors[b] * b_ratio
        denominator = wnorm_b * wnorm_b + bnorm_b * bnorm_b
        if denominator <= 0:
            return None
        expected = math.sqrt((wnorm_n * wnorm_n + bnorm_n * bnorm_n) / denominator)
        if expected <= 0:
            return None
    floor = spacing.get(tol[x] or "", spacing["float32"])
    allowed = spacing.get(tol[y] or "", spacing["float32"]) \
        + jump * (uneven * amplification * max(errors[x], floor) + params)
    return NormCheck(ny[3] / by[3], expected, allowed)
