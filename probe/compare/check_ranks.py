"""A bad rank without a bench: collective results that differ between ranks of one run.

In data parallel every rank holds the same tensor after an all_reduce, a broadcast or an
all_gather. The k-th collective of a step is the same event on every rank, so its
recorded result (md5 where the dump has one, else Max/Min/Mean/Norm) must agree across
ranks; a rank whose result differs from the majority's has a bad card, link or kernel.
Where no majority can tell (two ranks), a default all_reduce (sum) still can: its
result's mean must be the sum of the ranks' input means. Only the dump of one run is
needed.

    from probe import check_ranks
    report = check_ranks("dump_root")          # step*/rank*/dump.json
    report.bad_ranks                           # [1]
    for m in report.mismatches: print(m.step, m.name, m.ranks, m.detail)

Collectives whose results legitimately differ per rank (reduce_scatter, scatter, gather,
reduce, all_to_all) and point-to-point calls are not checked. Dumps made before probe
recorded collectives' results (``"output": [null]``) cannot be checked: said in notes.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from .causality import collective_op
from .dump_tree import find_dumps, rank_number, step_number
from .reader import read_dump
from probe.vocabulary import MEAN, NORM, STAT_KEYS

IDENTICAL_ON_ALL_RANKS = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                          "_all_gather_base"}


@dataclass
class Mismatch:
    step: int
    event: int                 # the k-th collective of the step (default group)
    name: str                  # the entry name on the majority's first rank
    ranks: list                # ranks whose result differs from the majority's
    majority: list             # ranks that agree
    detail: str


@dataclass
class RanksReport:
    root: str
    steps: list
    ranks: list
    checked: int = 0           # collective events compared across ranks
    mismatches: list = field(default_factory=list)
    undecided: list = field(default_factory=list)   # results differ, who is wrong unknown
    notes: list = field(default_factory=list)

    @property
    def bad_ranks(self) -> list:
        return sorted({r for m in self.mismatches for r in m.ranks})

    @property
    def first(self) -> Mismatch | None:
        return min(self.mismatches, key=lambda m: (m.step, m.event), default=None)

    def lines(self) -> list:
        out = [f"check-ranks {self.root}: {len(self.steps)} step(s) x {len(self.ranks)} rank(s), "
               f"{self.checked} collective result(s) compared across ranks"]
        if not self.mismatches and not self.undecided:
            out.append("no rank's collective result differs from the others'" if self.checked
                       else "nothing compared")
        for m in self.undecided:
            out.append(f"step {m.step} {m.name} (collective #{m.event}): {m.detail}")
        for m in self.mismatches:
            out.append(f"step {m.step} {m.name} (collective #{m.event}): rank(s) "
                       f"{', '.join(map(str, m.ranks))} differ from rank(s) "
                       f"{', '.join(map(str, m.majority))}: {m.detail}")
        f = self.first
        if f is not None:
            out.append(f"first: step {f.step}, rank(s) {', '.join(map(str, f.ranks))} at {f.name}")
        out += [f"note: {n}" for n in self.notes]
        return out


def _leaves(x, out):
    if isinstance(x, dict):
        if x.get("type") in ("torch.Tensor", "numpy.ndarray"):
            out.append(x)
        else:
            for v in x.values():
                _leaves(v, out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _leaves(v, out)
    return out


def _collectives(path: str) -> list:
    """[(name, op, [result tensor summaries], [input tensor summaries] or None)] in call
    order; the inputs only of a default (sum) all_reduce, whose result's mean must be
    the sum of the ranks' input means."""
    out = []
    for name, entry in read_dump(path):
        op = collective_op(name)
        if op is None or not isinstance(entry, dict):
            continue
        args = entry.get("input_args") or []
        summed = op == "all_reduce" and not (entry.get("input_kwargs") or {}).get("op") and len(args) < 2
        out.append((name, op, _leaves(entry.get("output"), []),
                    _leaves(args[:1], []) if summed else None))
    return out


_MEAN_TOL = {"torch.bfloat16": 1e-2, "torch.float16": 1e-2}


def _off_sum(calls: dict) -> list | None:
    """Ranks whose all_reduce result's mean is not the sum of every rank's input mean
    (relative to the result's RMS): who is wrong where no majority can tell (2 ranks)."""
    if any(c[3] is None for c in calls.values()):
        return None
    n = {len(c[3]) for c in calls.values()} | {len(c[2]) for c in calls.values()}
    if len(n) != 1:
        return None
    bad = []
    for r, (_, _, res, _) in calls.items():
        for j, t in enumerate(res):
            want = sum(_num(c[3][j].get(MEAN)) for c in calls.values())
            numel = 1
            for d in t.get("shape") or []:
                numel *= d
            rms = _num(t.get(NORM)) / max(numel, 1) ** 0.5
            dev = abs(_num(t.get(MEAN)) - want) / max(rms, 1e-30)
            if not math.isfinite(dev):
                return None
            if dev > _MEAN_TOL.get(t.get("dtype"), 1e-5):
                bad.append(r)
                break
    return bad if 0 < len(bad) < len(calls) else None


def _signature(results: list, use_md5: bool) -> tuple:
    if use_md5:
        return tuple(t.get("md5") for t in results)
    return tuple(tuple(_num(t.get(k)) for k in STAT_KEYS) for t in results)


def _num(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _close(a: tuple, b: tuple, rtol: float) -> bool:
    if len(a) != len(b):
        return False
    for ta, tb in zip(a, b):
        if isinstance(ta, str) or isinstance(tb, str) or ta is None or tb is None:
            if ta != tb:
                return False
            continue
        for x, y in zip(ta, tb):
            if math.isnan(x) and math.isnan(y):
                continue
            if not abs(x - y) <= rtol * max(abs(x), abs(y)):
                return False
    return True


def _describe(a: tuple, b: tuple, use_md5: bool) -> str:
    if use_md5:
        return f"md5 {list(a)} vs {list(b)}"
    for k, (ta, tb) in enumerate(zip(a, b)):
        if ta != tb:
            return (f"tensor {k}: Max/Min/Mean/Norm {[f'{v:.6g}' for v in ta]} vs majority "
                    f"{[f'{v:.6g}' for v in tb]}")
    return f"{len(a)} vs {len(b)} result tensors"


def check_ranks(root: str, rtol: float = 1e-6) -> RanksReport:
    """Per step, every all_reduce / broadcast / all_gather result compared across ranks.

    ``rtol``: statistics agree within this relative difference (identical tensors give
    identical statistics; md5 is compared exactly)."""
    dumps = find_dumps(root)
    by_step: dict = {}
    for key, path in dumps.items():
        by_step.setdefault(step_number(key), {})[rank_number(key)] = path
    report = RanksReport(root, sorted(by_step), sorted({rank_number(k) for k in dumps}))
    unrecorded = 0
    for step in report.steps:
        ranks = by_step[step]
        if len(ranks) < 2:
            report.notes.append(f"step {step}: one rank only, nothing to compare")
            continue
        seqs = {r: _collectives(p) for r, p in sorted(ranks.items())}
        lengths = {r: len(s) for r, s in seqs.items()}
        if len(set(lengths.values())) > 1:
            report.notes.append(f"step {step}: ranks made different numbers of collectives "
                                f"({', '.join(f'rank{r} {n}' for r, n in lengths.items())}): compared "
                                f"the first {min(lengths.values())}")
        for k in range(min(lengths.values())):
            calls = {r: s[k] for r, s in seqs.items()}
            ops = {c[1] for c in calls.values()}
            if len(ops) > 1:
                report.notes.append(f"step {step}: collective #{k} is {sorted(ops)} on different "
                                    f"ranks: the ranks' collectives are out of step from here")
                break
            op = ops.pop()
            if op not in IDENTICAL_ON_ALL_RANKS:
                continue
            results = {r: c[2] for r, c in calls.items()}
            if not all(results.values()):
                unrecorded += 1
                continue
            use_md5 = all(t.get("md5") for res in results.values() for t in res)
            sigs = {r: _signature(res, use_md5) for r, res in results.items()}
            report.checked += 1
            majority_sig, _ = Counter(sigs.values()).most_common(1)[0]
            tol = 0.0 if use_md5 else rtol
            agree = [r for r, s in sigs.items() if _close(s, majority_sig, tol)]
            differ = [r for r in sigs if r not in agree]
            if not differ:
                continue
            how = ""
            if len(agree) <= len(differ):        # no majority: the sum of the inputs decides
                off = _off_sum(calls)
                if off is None:
                    report.undecided.append(Mismatch(
                        step, k, calls[agree[0]][0], [], [],
                        "ranks disagree and no majority or input sum tells which is wrong: "
                        + "; ".join(f"rank{r} {[f'{v:.6g}' for v in sigs[r][0]] if sigs[r] else '-'}"
                                    for r in sigs)))
                    continue
                differ, agree = off, [r for r in sigs if r not in off]
                how = " (no majority: the result's mean is not the sum of the ranks' input means)"
            ref = agree[0]
            report.mismatches.append(Mismatch(step, k, calls[ref][0], differ, agree,
                                              _describe(sigs[differ[0]], sigs[ref], use_md5) + how))
    if unrecorded:
        report.notes.append(f"{unrecorded} collective call(s) have no recorded result "
                            f"(\"output\": [null], a dump made before probe recorded them): not checked")
    return report
