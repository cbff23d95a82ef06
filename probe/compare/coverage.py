"""What a compare could judge, and why not where it could not.

"No API introduces error" is an answer only when calls were compared: a CI job reads it as
a pass. A compare of an empty dump, of a step killed half-way, of two unrelated programs
or of a run that went NaN where no call can be blamed compares little or nothing, and its
verdict must say so instead. ``coverage`` lists those gaps, each with its reason; the
verdict (summary_json), the console's first line (report) and the run's grid (causality)
read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MIN_PAIRED = 0.5      # fewer of a side's calls paired than this: the dumps are of different programs

EMPTY_SIDE = "empty_side"
INCOMPLETE_DUMP = "incomplete_dump"
NOTHING_PAIRED = "nothing_paired"
UNRELATED_RUNS = "unrelated_runs"
UNEXPLAINED_NONFINITE = "unexplained_nonfinite"
KINDS = (EMPTY_SIDE, INCOMPLETE_DUMP, NOTHING_PAIRED, UNRELATED_RUNS, UNEXPLAINED_NONFINITE)


@dataclass
class Gap:
    """One reason the compare could not judge the whole step."""
    kind: str                         # one of KINDS
    text: str                         # the reason, in words


@dataclass
class DumpState:
    """What one side's dump.json says of itself."""
    entries: int
    complete: bool | None             # probe's marker; None: the dump has none (msprobe's)
    truncated: bool                   # cut off mid-entry (a torn write)


@dataclass
class Coverage:
    calls: int                        # API calls of the step (modules for an L0 dump), both sides
    npu_calls: int
    bench_calls: int
    paired: int                       # calls both sides hold
    compared: int                     # of them, with an output compared
    npu: DumpState | None = None
    bench: DumpState | None = None
    gaps: list = field(default_factory=list)   # Gap, in KINDS order

    @property
    def judged(self) -> bool:
        """Enough was compared for "no API introduces error" to be an answer."""
        return not self.gaps

    @property
    def text(self) -> str:
        return "; ".join(g.text for g in self.gaps)


def dump_state(side) -> DumpState | None:
    if side is None:
        return None
    meta = side.meta
    complete = meta.complete if isinstance(meta.complete, bool) else None
    return DumpState(meta.entries, complete, bool(meta.truncated))


def _side_gaps(name: str, state: DumpState | None) -> tuple[list, bool]:
    """(gaps, empty) of one side."""
    if state is None:
        return [], False
    gaps = []
    empty = state.entries == 0
    if empty:
        gaps.append(Gap(EMPTY_SIDE, f"the {name} dump has no entries (its dump.json holds no \"data\", or an "
                                    f"empty one: a full disk, a dump that never started): nothing to compare"))
    if state.truncated:
        gaps.append(Gap(INCOMPLETE_DUMP, f"the {name} dump is incomplete: its dump.json is cut off after "
                                         f"{state.entries} entries (a write torn mid-entry); compared what is there"))
    elif state.complete is False:
        gaps.append(Gap(INCOMPLETE_DUMP, f"the {name} dump is incomplete: its step did not finish (dump.json is "
                                         f"not marked complete: the run was killed or crashed mid-step, "
                                         f"{state.entries} entries written); compared what is there"))
    return gaps, empty


def coverage(result, eligible: list, culprit, nonfinite: list) -> Coverage:
    """The gaps of one compare. ``eligible``: the diagnosis's calls (API calls, or modules
    of an L0 dump); ``culprit``: the first divergence's call, or None; ``nonfinite``: the
    calls whose output has NaN/Inf on one side only."""
    npu_calls = sum(1 for u in eligible if u.npu_entry)
    bench_calls = sum(1 for u in eligible if u.bench_entry)
    paired = sum(1 for u in eligible if u.status != "unmatched")
    compared = sum(1 for u in eligible if u.status not in ("unmatched", "not compared"))
    cov = Coverage(len(eligible), npu_calls, bench_calls, paired, compared,
                   dump_state(result.npu), dump_state(result.bench))
    empty = False
    incomplete = {}
    for name, state in (("NPU", cov.npu), ("bench", cov.bench)):
        gaps, side_empty = _side_gaps(name, state)
        empty |= side_empty
        cov.gaps += gaps
        incomplete[name] = any(g.kind == INCOMPLETE_DUMP for g in gaps)
    if not empty and compared == 0:
        cov.gaps.append(Gap(NOTHING_PAIRED, f"no call was compared: of {npu_calls} NPU and {bench_calls} bench "
                                            f"calls, {paired} pair and none of them has an output both sides hold"
                                            if paired else
                                            f"no call was compared: none of the {npu_calls} NPU calls pairs "
                                            f"with one of the {bench_calls} bench calls"))
    elif not empty:
        # a side cut short leaves the other's later calls unpaired: judged on the short side
        sides = [n for n, c in (("NPU", npu_calls), ("bench", bench_calls)) if incomplete[n]] or ["NPU", "bench"]
        most = max(npu_calls if n == "NPU" else bench_calls for n in sides)
        if paired < MIN_PAIRED * most:
            cov.gaps.append(Gap(UNRELATED_RUNS, f"the two dumps look like different programs: only {paired} of "
                                                f"{npu_calls} NPU calls and of {bench_calls} bench calls pair "
                                                f"({cov.calls - paired} unmatched); compare dumps of the same model "
                                                f"and step"))
    if culprit is None and nonfinite:
        u = nonfinite[0]
        cov.gaps.append(Gap(UNEXPLAINED_NONFINITE,
                            f"NaN/Inf appear on the {u.nonfinite_side} side only from {u.nonfinite_out} on, and no "
                            f"compared call can be blamed for them (the inputs of the first such call are already "
                            f"non-finite, or came from calls not compared)"))
    order = {k: n for n, k in enumerate(KINDS)}
    cov.gaps.sort(key=lambda g: order[g.kind])
    return cov
