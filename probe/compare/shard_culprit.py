"""Which rank's shard made a merged tensor differ from the bench's.

A merged tensor that differs names a call; the run's answer also needs the rank whose
kernel was wrong. Each piece of the merged tensor sits somewhere in the bench's whole
tensor, so:

- tensor dumps: each rank's piece is compared with the bench tensor's slice at its offset
  (relative L2 error); the ranks beyond the tolerance are named, worst first;
- statistics: a replicated copy is the whole tensor, compared with the bench's statistics
  directly; a shard is convicted when its Max lies above the whole tensor's Max or its Min
  below its Min (no part of a correct tensor can), else when its RMS is out of family
  (its ratio to the whole tensor's RMS stands out from every other shard's). Two shards
  whose Norm and Mean add up wrong cannot otherwise be told apart: then every rank is a
  candidate and the text says so;
- a Partial tensor's terms cannot be checked against a bench that holds their sum.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from probe.tolerances import tolerance_for

from .shard_merge import MergedTensor
from .tensors import load
from .verdict import dtype_class

log = logging.getLogger(__name__)

STANDS_OUT = 3.0    # a shard's RMS deviation this many times every other shard's is out of family


@dataclass
class Culprit:
    """The rank(s) whose piece differs, most likely first, and one sentence why."""
    ranks: list
    text: str
    certain: bool = True
    errors: dict = field(default_factory=dict)    # rank -> its piece's error, where measured

    def as_dict(self) -> dict:
        return {"ranks": list(self.ranks), "text": self.text, "certain": self.certain}


def find_culprit(mt: MergedTensor, bench_stats: tuple, bench_file: str | None, rtol: float) -> Culprit | None:
    """The rank(s) of ``mt`` whose piece differs from the bench (its statistics, and its
    tensor file in a tensor dump: ``bench_file``). None where the pieces are not several."""
    pieces = mt.pieces
    ranks = sorted({p.rank for p in pieces})
    if mt.cant_tell or len(ranks) < 2:
        return None
    if mt.reduce:
        return Culprit(ranks, f"{mt.name} is a {mt.layout} tensor: each rank holds a term of the {mt.reduce}, "
                              f"and the bench holds only the result: which rank's term is off cannot be told",
                       certain=False)
    if bench_file is not None and mt.has_files:
        try:
            return _by_slices(mt, load(bench_file), rtol)
        except (OSError, ValueError) as exc:
            log.debug("culprit of %s by slices failed: %s", mt.name, exc)
    return _by_statistics(mt, bench_stats, rtol)


def _by_slices(mt: MergedTensor, bench: np.ndarray, rtol: float) -> Culprit:
    if tuple(bench.shape) != tuple(mt.shape):
        raise ValueError(f"bench shape {list(bench.shape)} is not the merged {list(mt.shape)}")
    errors: dict = {}
    for p in mt.pieces:
        a = mt.piece_array(p).astype(np.float64)
        b = bench[tuple(slice(o, o + s) for o, s in zip(p.offset, p.shape))].astype(np.float64)
        norm = float(np.sqrt(np.sum(b * b)))
        diff = float(np.sqrt(np.sum((a - b) ** 2))) if np.isfinite(a).all() and np.isfinite(b).all() else math.inf
        err = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
        errors[p.rank] = max(errors.get(p.rank, 0.0), err)
    return _named(mt, errors, rtol, "its piece differs from the bench's slice at its offset by")


def _by_statistics(mt: MergedTensor, bench: tuple, rtol: float) -> Culprit:
    tol = tolerance_for(dtype_class(mt.dtype))
    numel = math.prod(mt.shape) or 1
    b_max, b_min, _, b_norm = bench
    b_rms = b_norm / math.sqrt(numel) if math.isfinite(b_norm) else math.nan
    scale = max(abs(b_max) if math.isfinite(b_max) else 0.0, abs(b_min) if math.isfinite(b_min) else 0.0,
                b_rms if math.isfinite(b_rms) else 0.0, tol.floor)
    if mt.how == "replicate":       # every copy is the whole tensor
        errors = {p.rank: _stat_error(p.stats, bench, scale) for p in mt.pieces}
        return _named(mt, errors, rtol, "its copy's statistics differ from the bench's whole tensor's by")
    above = {p.rank: p.stats[0] for p in mt.pieces if p.stats[0] > b_max + rtol * scale}
    below = {p.rank: p.stats[1] for p in mt.pieces if p.stats[1] < b_min - rtol * scale}
    convicted = sorted(set(above) | set(below))
    if convicted:
        said = [f"rank {r}'s Max {above[r]:.6g} exceeds the whole tensor's {b_max:.6g}" for r in sorted(above)]
        said += [f"rank {r}'s Min {below[r]:.6g} is below the whole tensor's {b_min:.6g}" for r in sorted(below)
                 if r not in above]
        return Culprit(convicted, "; ".join(said) + " (no piece of a correct tensor can)")
    ratios = {p.rank: (p.stats[3] / math.sqrt(max(p.numel, 1))) / b_rms for p in mt.pieces
              if p.numel and b_rms and math.isfinite(b_rms) and math.isfinite(p.stats[3])}
    devs = {r: abs(math.log(q)) if q > 0 else math.inf for r, q in ratios.items()}
    if len(devs) >= 2:
        worst = max(devs, key=lambda r: devs[r])
        rest = max(d for r, d in devs.items() if r != worst)
        if devs[worst] > rtol and devs[worst] > STANDS_OUT * rest:
            return Culprit([worst], f"rank {worst}'s shard is out of family: its RMS is {ratios[worst]:.4g}x the whole "
                                    f"tensor's, every other shard's within {math.exp(rest):.4g}x", certain=False)
    ranks = sorted({p.rank for p in mt.pieces})
    return Culprit(ranks, f"which of ranks {', '.join(map(str, ranks))} computed it wrong cannot be told from "
                          f"statistics (their shards' extremes lie within the whole tensor's and none is out of "
                          f"family); dump tensors to compare each shard with its slice", certain=False)


def _stat_error(stats: tuple, bench: tuple, scale: float) -> float:
    worst = 0.0
    for x, y in zip(stats, bench):
        if math.isnan(x) and math.isnan(y):
            continue
        if not (math.isfinite(x) and math.isfinite(y)):
            if x != y:
                return math.inf
            continue
        worst = max(worst, abs(x - y) / scale)
    return worst


def _named(mt: MergedTensor, errors: dict, rtol: float, how: str) -> Culprit:
    order = sorted(errors, key=lambda r: -errors[r])
    beyond = [r for r in order if errors[r] > rtol]
    fine = [r for r in order if r not in beyond]
    if beyond:
        text = "; ".join(f"rank {r}: {how} {errors[r]:.3g}" for r in beyond)
        if fine:
            text += f"; rank{'s' if len(fine) > 1 else ''} {', '.join(map(str, sorted(fine)))} within " \
                    f"{max(errors[r] for r in fine):.3g}"
        return Culprit(beyond, text, True, errors)
    return Culprit(order, f"every rank's piece is within {rtol:.3g} of the bench ({how} at most "
                          f"{errors[order[0]]:.3g}): the difference is spread over the ranks", False, errors)
