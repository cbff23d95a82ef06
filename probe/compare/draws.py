"""Random calls judged by the law their draw must satisfy, never element by element.

Two devices draw different random numbers from the same seed (CUDA's and Ascend's
generators are counter-based, the CPU's is a Mersenne Twister), so a dropout's output on
the NPU differs from the bench's in ~p of its elements whatever the kernels do. Compared
element by element it looks like a 50% error made from nothing; re-run with a fresh draw
it differs again, by chance. Neither says anything about the kernel. What a correct
kernel must do is satisfy its law, which the NPU side's own dump can be checked against:

- dropout (``F.dropout``, ``dropout1d/2d/3d``, ``native_dropout``; its backward too,
  where the gradient goes through the same mask): every kept element equals its input
  times ``1/(1-p)`` up to one rounding of the dtype, and the dropped fraction is within
  ``Z`` standard errors ``sqrt(p(1-p)/n)`` of ``p`` (tensor dumps). From statistics alone:
  ``Norm(out)^2 (1-p) / Norm(in)^2`` is 1 within ``Z`` standard errors, bounded by
  ``sqrt(p/(1-p)) max|in| / Norm(in)``, and ``Max``/``Min`` of the output are no larger
  in magnitude than the input's times ``1/(1-p)`` (a wrong scale shows in both);
- ``rand``/``rand_like``: values in [0, 1), mean 1/2 within ``Z`` standard errors;
  ``randn``/``randn_like``: mean 0 and mean square 1 within ``Z`` standard errors;
- every other draw (``randint``, ``randperm``, ``bernoulli``, ``multinomial``, ``normal_``,
  attention with ``dropout_p > 0``, whose mask is drawn inside the kernel and cannot be
  read back) is a draw and is not judged at all: the summary says which.

A random call whose law holds is status "draw": never a culprit, and when its output
differs from the bench's the summary says once that the two runs drew differently (from
which call on, how many calls). Every later call is judged as usual: in a tensor dump by
its re-run on the NPU side's own inputs, which the different draw does not disturb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Z = 6.0                 # standard errors a law's statistic may stray before it is broken
ROUNDS = 2.0            # kept elements: within this many roundings of input/(1-p)
DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "native_dropout"})
_UNIFORM = frozenset({"rand", "rand_like"})
_NORMAL = frozenset({"randn", "randn_like"})
# APIs that draw only with some arguments: (keyword, position among the written arguments)
_DRAW_ARGS = {"scaled_dot_product_attention": ("dropout_p", 4)}
_TINY = {"torch.bfloat16": 2.0 ** -133, "torch.float16": 2.0 ** -24, "torch.float32": 2.0 ** -149}
_EPS = {"torch.bfloat16": 2.0 ** -8, "torch.float16": 2.0 ** -11, "torch.float32": 2.0 ** -24,
        "torch.float64": 2.0 ** -53}


@dataclass
class DrawCheck:
    """The law of one random call, checked on the NPU side's own dump."""
    law: str                # "dropout", "uniform", "normal" or "" (a draw not judged)
    broken: bool            # the law does not hold: the kernel is wrong
    reason: str             # one sentence, for the report
    differs: bool = False   # its output differs from the bench's (the draws differ)


def arguments(rows) -> dict:
    """A call's scalar arguments from its input rows: the name each is written under (its
    keyword, or its position as text) -> (its place among them, its value); the first row of
    a name kept. Made once per forward call: its backward call asks the same."""
    out: dict = {}
    for r in rows:
        if r.io != "input" or r.kind != "value":
            continue
        tail = r.name.rsplit(".input.", 1)[-1]
        if tail not in out:
            out[tail] = (len(out), r.value)
    return out


def arg(args: dict, keyword, position):
    """The value of a call's scalar argument (``arguments``: the first row written under
    its keyword or its position), or None."""
    by_name, by_place = args.get(keyword), args.get(str(position))
    if by_name is None or (by_place is not None and by_place[0] < by_name[0]):
        by_name = by_place
    return None if by_name is None else by_name[1]


def may_draw(api) -> bool:
    """Whether a call of ``api`` can draw random numbers at all: what ``draw_kind`` needs
    its rows for, asked first (most calls of a dump are not random)."""
    return api.leaf in _DRAW_ARGS or api.random


def draw_kind(api, args: dict) -> str | None:
    """"dropout", "uniform", "normal" or "draw" when the call draws random numbers, None
    when it does not (a dropout in eval mode, attention with dropout_p == 0). ``args``:
    the scalar arguments (``arguments``) of the call's forward entry, for either direction."""
    from probe.precheck.entries import DROPOUT_ARGS
    leaf = api.leaf
    if leaf in _DRAW_ARGS:
        p = arg(args, *_DRAW_ARGS[leaf])
        return "draw" if isinstance(p, (int, float)) and p > 0 else None
    if not api.random:
        return None
    if leaf in DROPOUT_ARGS:
        p_at, train_at, train_default = DROPOUT_ARGS[leaf]
        training = arg(args, "training" if leaf != "native_dropout" else "train", train_at)
        if training is None:
            training = train_default if train_default is not None else True
        p = arg(args, "p", p_at)
        if not training or (isinstance(p, (int, float)) and p == 0):
            return None
        return "dropout" if leaf in DROPOUTS else "draw"
    if api.direction == "forward" and leaf in _UNIFORM:
        return "uniform"
    if api.direction == "forward" and leaf in _NORMAL:
        return "normal"
    return "draw"


def dropout_p(api, args: dict) -> float:
    """A dropout call's p from its forward call's arguments (torch's default 0.5 when not written)."""
    from probe.precheck.entries import DROPOUT_ARGS
    p = arg(args, "p", DROPOUT_ARGS[api.leaf][0])
    return float(p) if isinstance(p, (int, float)) and 0 <= p < 1 else 0.5


# ---- the laws, from tensors ---------------------------------------------------------
def dropout_law_tensors(x, y, p: float, dtype: str) -> DrawCheck:
    """Dropout's law on one input/output pair (float64 numpy arrays of one shape, ``dtype``
    the output's; for a backward entry the gradient w.r.t. the output and w.r.t. the input)."""
    import numpy as np
    x = x.reshape(-1)
    y = y.reshape(-1)
    live = x != 0
    n = int(live.sum())
    if n == 0:
        return DrawCheck("dropout", False, "its input is zero: nothing to check")
    kept = live & (y != 0)
    scale = 1.0 / (1.0 - p)
    expect = x[kept] * scale
    eps = _EPS.get(dtype, 2.0 ** -8)
    # relative to the value, and at least the spacing of the dtype's subnormals (an fp16
    # output below 6.1e-5 is spaced 2^-24 apart whatever its size)
    off = np.abs(y[kept] - expect) > ROUNDS * (eps * np.abs(expect) + _TINY.get(dtype, 0.0)) + 1e-300
    dropped = 1.0 - kept.sum() / n
    se = math.sqrt(p * (1 - p) / n) if 0 < p < 1 else 0.0
    if off.any():
        k = int(off.sum())
        ratio = float(np.median(y[kept][off] / x[kept][off]))
        return DrawCheck("dropout", True, f"{k} of its {int(kept.sum())} kept elements are not input/(1-p): "
                                          f"scaled by {ratio:.4g} where 1/(1-p) = {scale:.4g}")
    if se and abs(dropped - p) > Z * se:
        return DrawCheck("dropout", True, f"it drops {dropped:.3%} of its elements where p = {p:g} "
                                          f"({(dropped - p) / se:+.1f} standard errors)")
    return DrawCheck("dropout", False, f"a dropout draw (p = {p:g}): kept elements are input/(1-p), "
                                       f"{dropped:.1%} dropped")


def uniform_law_tensors(y) -> DrawCheck:
    y = y.reshape(-1)
    n = y.size
    if n == 0:
        return DrawCheck("uniform", False, "empty")
    if y.min() < 0 or y.max() >= 1:
        return DrawCheck("uniform", True, f"its values leave [0, 1): {y.min():.4g} .. {y.max():.4g}")
    return _moments("uniform", float(y.mean()), 0.5, math.sqrt(1 / 12 / n), None, None, None)


def normal_law_tensors(y) -> DrawCheck:
    y = y.reshape(-1)
    n = y.size
    if n == 0:
        return DrawCheck("normal", False, "empty")
    return _moments("normal", float(y.mean()), 0.0, 1 / math.sqrt(n), float((y * y).mean()), 1.0,
                    math.sqrt(2 / n))


def _moments(law, mean, want_mean, se_mean, square, want_square, se_square) -> DrawCheck:
    if abs(mean - want_mean) > Z * se_mean:
        return DrawCheck(law, True, f"its mean {mean:.4g} is {(mean - want_mean) / se_mean:+.1f} standard "
                                    f"errors from a {law} draw's {want_mean:g}")
    if square is not None and abs(square - want_square) > Z * se_square:
        return DrawCheck(law, True, f"its mean square {square:.4g} is {(square - want_square) / se_square:+.1f} "
                                    f"standard errors from a {law} draw's {want_square:g}")
    return DrawCheck(law, False, f"a {law} draw: its moments are a {law} draw's")


# ---- the laws, from statistics ------------------------------------------------------
def dropout_law_stats(x_stats, y_stats, p: float) -> DrawCheck:
    """Dropout's law from Max/Min/Mean/Norm of the input and the output alone."""
    import numpy as np
    return dropout_laws_stats(np.array([x_stats], dtype=np.float64), np.array([y_stats], dtype=np.float64),
                              np.array([p], dtype=np.float64))[0]


def dropout_laws_stats(x_stats, y_stats, ps) -> list:
    """``dropout_law_stats`` of many calls at once (numpy arrays: k x Max/Min/Mean/Norm of
    their inputs and outputs, k values of p): every number worked out per column (10k
    dropout calls on bench/compare.py's 100k-entry pair), each call's reason then written
    from its own."""
    import numpy as np
    mx, mn, nx = x_stats[:, 0], x_stats[:, 1], x_stats[:, 3]
    my, ny_min, ny = y_stats[:, 0], y_stats[:, 1], y_stats[:, 3]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        readable = np.isfinite(x_stats[:, [0, 1, 3]]).all(axis=1) & np.isfinite(y_stats[:, [0, 1, 3]]).all(axis=1) \
            & (nx != 0)
        scale = 1.0 / (1.0 - ps)
        big = np.maximum(np.abs(mx), np.abs(mn))
        reach = np.maximum(np.abs(my), np.abs(ny_min))
        beyond = reach > big * scale * (1 + 2 ** -7)
        ratio = ny * ny * (1 - ps) / (nx * nx)
        se = np.where(ps > 0, np.sqrt(ps / (1 - ps)) * big / nx, 0.0)
        off = (se != 0) & (np.abs(ratio - 1) > Z * se)
        norm_ratio, errors = np.sqrt(ratio), (ratio - 1) / se
    case = np.where(~readable, 0, np.where(beyond, 1, np.where(off, 2, 3))).tolist()
    reasons: dict = {}          # p -> the reason of a law that holds
    out = []
    for k, (c, p) in enumerate(zip(case, ps.tolist())):
        if c == 3:
            reason = reasons.get(p)
            if reason is None:
                reason = reasons[p] = (f"a dropout draw (p = {p:g}): its Norm is what kept elements scaled "
                                       f"by 1/(1-p) give")
            out.append(DrawCheck("dropout", False, reason))
        elif c == 0:
            out.append(DrawCheck("dropout", False, f"a dropout draw (p = {p:g})"))
        elif c == 1:
            b = float(big[k])
            out.append(DrawCheck("dropout", True, f"its output reaches {float(reach[k]):.4g}, beyond its "
                                                  f"input's {b:.4g} x 1/(1-p) = {b * float(scale[k]):.4g}"))
        else:
            out.append(DrawCheck("dropout", True, f"its Norm is {float(norm_ratio[k]):.4g} x what kept elements "
                                                  f"scaled by 1/(1-p) give ({float(errors[k]):+.1f} standard errors)"))
    return out


def uniform_law_stats(y_stats, n) -> DrawCheck:
    mx, mn, mean, _ = y_stats
    if mn < 0 or mx >= 1:
        return DrawCheck("uniform", True, f"its values leave [0, 1): {mn:.4g} .. {mx:.4g}")
    return _moments("uniform", mean, 0.5, math.sqrt(1 / 12 / max(n, 1)), None, None, None)


def normal_law_stats(y_stats, n) -> DrawCheck:
    _, _, mean, norm = y_stats
    n = max(n, 1)
    return _moments("normal", mean, 0.0, 1 / math.sqrt(n), norm * norm / n, 1.0, math.sqrt(2 / n))
