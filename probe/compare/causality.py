"""Which rank's divergence came first: collectives order events across ranks.

A collective's output on every rank depends on every rank's input. When rank 1
introduces error before an all_reduce, rank 0's all_reduce output differs while its own
inputs agree; the per-pair diagnosis of rank 0 then says the all_reduce (or the first
call reading its result) introduces error. It does not: it inherits from rank 1.

The k-th collective of a rank (``Distributed.*`` calls of the default group, in call
order; point-to-point send/recv excluded) is the same event on every rank: a
synchronisation point. A call made after passing k collectives sits at epoch k; it can
have been reached by anything another rank did before a collective it has passed. So a
Lamport order over ranks: (collectives passed before the call, then order within the
rank). In that order:

- call f' on rank r' reaches call f on rank r when some collective m lies between them:
  f' happened before m on r' (``f'.reaches <= m``) and f after m on r, or f is m itself
  (``m <= f.sees``);
- a rank whose first divergence is reached by another rank's divergence inherits;
- a collective whose result differs on one rank while no other rank diverged before it
  (every rank's input agrees) is itself the culprit on that rank (a bad link or card).

Steps: the earliest step with an introduction wins; later steps inherit through the
weights.

A step whose pair names no introduction is "clean" only where its calls were judged: calls
statistics "can't tell" from their numbers make it "cant_tell" (the first named); calls
"can't tell" only because a shard merge could not give their numbers (merged_pair.py)
leave it clean where the calls compared after them agree, and the cell's reason says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

POINT_TO_POINT = {"send", "recv", "isend", "irecv", "batch_isend_irecv"}


def collective_op(name: str | None) -> str | None:
    """'Distributed.all_reduce.3.forward' -> 'all_reduce'; None for anything else
    (and for point-to-point calls, which synchronise two ranks, not all)."""
    if not name or not name.startswith("Distributed."):
        return None
    parts = name.split(".")
    if len(parts) < 3 or parts[-1] == "backward" or parts[1] in POINT_TO_POINT:
        return None
    return parts[1]


@dataclass
class Mark:
    """A pair's first divergence, placed among the rank's collectives."""
    name: str
    direction: str
    kind: str                  # "introduced" or "inputs_differ"
    position: int              # index in the pair's aligned call sequence
    epoch: int                 # collectives passed before the call
    collective: bool           # the call is itself collective number ``epoch``
    input_error: float | None = None
    output_error: float | None = None

    @property
    def reaches(self) -> int:
        """The first collective its error can travel through to other ranks."""
        return self.epoch + 1 if self.collective else self.epoch

    @property
    def sees(self) -> int:
        """The last collective whose result (other ranks' data) it can depend on."""
        return self.epoch if self.collective else self.epoch - 1

    @property
    def order(self) -> tuple:
        """Lamport order: collectives passed, a collective after the calls before it, position."""
        return self.epoch, self.collective, self.position


@dataclass
class Unsure:
    """A pair's "can't tell" calls of one kind: how many, the first, and why."""
    count: int
    first: str
    reason: str
    last_index: int = -1       # the last one's position in the aligned call sequence


@dataclass
class Timeline:
    """What the run needs from one pair: its first divergence and its collectives."""
    first: Mark | None
    collectives: list = field(default_factory=list)   # k -> (name, status, input_error, output_error, tolerance)
    not_judged: str = ""       # why the pair's compare could not judge its step (coverage.py); "" if it could
    cant_tell: Unsure | None = None    # calls statistics can't tell from their numbers
    unmerged: Unsure | None = None     # calls "can't tell" because a shard merge could not give their numbers
    agree_after: int = 0       # calls compared after the last unmerged one whose output agrees
    differ_after: str = ""     # the first call compared after it whose output differs ("" if none)


def epochs(calls) -> list:
    """Per call (in sequence order): how many collectives came before it."""
    out, k = [], 0
    for u in calls:
        out.append(k)
        if collective_op(u.npu_entry or u.bench_entry) and u.direction == "forward":
            k += 1
    return out


def _first(diag):
    """The pair's earliest divergence (forward or backward) as (kind, call)."""
    found = []
    for d in (getattr(diag, "forward", None), getattr(diag, "backward", None)):
        if d is not None:
            found.append((d.call.index, d.kind, d.call))
    if not found:            # a diagnosis without forward/backward: its first introduction
        for u in diag.calls:
            if u.status == "introduces":
                return "introduced", u
        return None
    _, kind, call = min(found, key=lambda t: t[0])
    return kind, call


def timeline(diag) -> Timeline:
    calls = diag.calls
    ep = epochs(calls)
    at = {id(u): k for u, k in zip(calls, ep)}
    colls = [(u.name, u.status, u.input_error, u.output_error, u.tolerance)
             for u in calls if collective_op(u.npu_entry or u.bench_entry) and u.direction == "forward"]
    first = _first(diag)
    mark = None
    if first is not None:
        kind, u = first
        mark = Mark(u.name, u.direction, kind, u.index, at.get(id(u), 0),
                    bool(collective_op(u.npu_entry or u.bench_entry)) and u.direction == "forward",
                    u.input_error, u.output_error)
    cov = getattr(diag, "coverage", None)
    t = Timeline(mark, colls, cov.text if cov is not None else "")
    t.cant_tell = _unsure([u for u in calls if u.status == "can't tell" and not u.note])
    t.unmerged = _unsure([u for u in calls if u.status == "can't tell" and u.note])
    if t.unmerged is not None:
        after = [u for u in calls if u.index > t.unmerged.last_index and u.output_error is not None
                 and u.status in ("clean", "inherits", "introduces", "can't tell")]
        t.agree_after = sum(u.status == "clean" for u in after)
        t.differ_after = next((u.name for u in after if u.status != "clean"), "")
    return t


def cant_tell_text(count: int, first: str, reason: str) -> str:
    """How calls statistics can't tell are said, in a pair's verdict and in a run's cell."""
    return f"{count} call{'s' if count > 1 else ''} can't be told from statistics, first {first}: {reason}"


def _unsure(calls) -> Unsure | None:
    if not calls:
        return None
    return Unsure(len(calls), calls[0].name, calls[0].reason, max(u.index for u in calls))


@dataclass
class Cell:
    """A pair's verdict in the run: its own diagnosis, corrected for the other ranks."""
    verdict: str               # one of vocabulary.RUN_VERDICTS
    mark: Mark | None = None
    reason: str = ""
    source: int | None = None  # the rank it inherits from


def judge_step(timelines: dict) -> dict:
    """rank -> Cell for one step, from rank -> Timeline (None for a failed pair)."""
    cells = {}
    marks = {r: t.first for r, t in timelines.items() if t is not None and t.first is not None}
    for r, t in timelines.items():
        if t is None:
            cells[r] = Cell("failed")
            continue
        m = t.first
        if m is None:          # clean only where the pair's compare could judge its step
            calls = unjudged_calls(t)
            # a step not compared says so first, and then what its compared calls could not tell
            cells[r] = Cell("not_compared", reason="; ".join(filter(None, (t.not_judged, calls.reason)))) \
                if t.not_judged else calls
            continue
        sources = sorted((m2.order, r2) for r2, m2 in marks.items() if r2 != r and m2.reaches <= m.sees)
        if sources:
            r2 = sources[0][1]
            through = _collective_name(t, max(marks[r2].reaches, 0))
            cells[r] = Cell("inherits", m, f"{m.name} differs because rank {r2} diverged first "
                                           f"({marks[r2].name}), before {through}", r2)
        elif m.kind == "introduced":
            reason = (f"its output differs (error {_g(m.output_error)}) while its inputs agree "
                      f"(error {_g(m.input_error)}), before any other rank diverged")
            if m.collective:
                agree = [r2 for r2, t2 in timelines.items() if r2 != r and t2 is not None
                         and _input_agrees(t2, m.epoch)]
                reason = ("the collective's result differs on this rank while no other rank "
                          "diverged before it" + (f" (inputs agree on ranks {agree})" if agree else "")
                          + ": a bad link or card")
            cells[r] = Cell("introduces", m, reason)
        else:
            cells[r] = Cell("inputs_differ", m, "its inputs already differ, though no compared call "
                                                "before it introduced error")
    return cells


def unjudged_calls(t: Timeline) -> Cell:
    """The cell of a pair that names no divergence and compared its step: "clean" unless
    some of its calls could not be judged. Calls statistics can't tell from their numbers
    (an output beyond tolerance they cannot attribute) make it "cant_tell"; calls whose
    numbers a shard merge could not give leave it clean only where calls compared after
    them agree, and say so (later in the call sequence stands for downstream: the
    diagnosis does not follow data from call to call)."""
    n = t.cant_tell.count if t.cant_tell else 0
    parts = []
    if t.cant_tell is not None:
        parts.append(cant_tell_text(n, t.cant_tell.first, t.cant_tell.reason))
    u = t.unmerged
    checked = u is not None and t.agree_after > 0 and not t.differ_after
    if u is not None:
        many = u.count > 1
        said = (f"{u.count} call{'s' if many else ''} can't be judged ({'their outputs' if many else 'its output'} "
                f"can't be merged across ranks), first {u.reason}")
        after = "the last of them" if many else "it"
        if checked:
            k = t.agree_after
            parts.append(f"{said}; the {k} call{'s' if k > 1 else ''} compared after {after} "
                         f"agree{'' if k > 1 else 's'} with the bench")
        elif t.differ_after:
            parts.append(f"{said}; a call compared after {after} differs ({t.differ_after})")
        else:
            parts.append(f"{said}; no call compared after {after} checks {'them' if many else 'it'}")
    if not parts:
        return Cell("clean")
    if t.cant_tell is None and checked:
        return Cell("clean", reason="; ".join(parts))
    one = n + (u.count if u is not None else 0) == 1
    return Cell("cant_tell", reason="; ".join(parts + [f"dump tensors to judge {'it' if one else 'them'}"]))


def _g(x) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else "-"


def _collective_name(t: Timeline, k: int) -> str:
    if 0 <= k < len(t.collectives):
        return t.collectives[k][0]
    return f"collective #{k}"


def _input_agrees(t: Timeline, k: int) -> bool:
    if not 0 <= k < len(t.collectives):
        return False
    _, _, err, _, tol = t.collectives[k]
    return err is not None and err <= tol


def first_of_run(cells: dict) -> tuple | None:
    """((step, rank), Cell) of the run's first divergence from {(step, rank): Cell}: the
    earliest step with an introduction, the earliest call there in Lamport order; failing
    any introduction, the earliest step whose inputs differ."""
    for kind in ("introduces", "inputs_differ"):
        steps = sorted({s for (s, _), c in cells.items() if c.verdict == kind})
        if steps:
            s = steps[0]
            cands = [((c.mark.order, r), (s, r), c) for (s2, r), c in cells.items()
                     if s2 == s and c.verdict == kind]
            return min(cands, key=lambda t: t[0])[1:]
    return None
