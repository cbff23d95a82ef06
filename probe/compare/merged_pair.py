"""A run compared across layouts: which steps merge their ranks, and what a merged pair
adds to its compare.

``probe compare --npu TP_ROOT --bench SINGLE_ROOT``: the NPU tree has step*/rank0..N-1,
the bench one rank per step (or TP=4 against TP=2: both sides several, in other numbers).
Where a step has a different number of ranks on each side and the side with several
carries layouts (a DTensor's entries record them) or a layout file is given, that side's
ranks are merged into one logical dump per step (shard_merge) by the worker comparing the
pair, one call's shards in memory at a time; the pair is then an ordinary pair. Steps with
as many ranks on both sides pair rank by rank as before.

A merged pair adds three things to its compare, and the engine knows none of them:

- rows whose tensor the merge could not give (a Partial tensor in a statistics dump, plain
  copies that differ with no layout) are "can't tell" rows saying why, and a call whose
  output is such a row is a "can't tell" call (not a clean one);
- a replicated tensor whose copies differ across ranks is an error row naming the ranks;
- the pair's first divergence is traced to the rank whose shard differs (shard_culprit):
  the run's answer names that rank.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import msgspec

from .dump_tree import find_dumps, label, order, rank_number
from .layout_file import LayoutRules
from .shard_culprit import Culprit, find_culprit
from .shard_merge import MergeReport, entry_tensors, merge_ranks
from .tensors import resolve

log = logging.getLogger(__name__)

MERGED_DIR = "merged_{side}"          # OUT/merged_npu/step1/rank/dump.json
_SCAN = 1 << 20


@dataclass
class MergeJob:
    """One pair's merges, done by the worker before it compares (plain data: pickled)."""
    npu_ranks: list | None            # [(rank, dump.json)] to merge, or None: the side is one dump
    bench_ranks: list | None
    npu_json: str                     # the dump.json compared (the merged one where merged)
    bench_json: str
    rules: LayoutRules | None = None

    def run(self) -> MergedPair:
        npu = merge_ranks(self.npu_ranks, self.npu_json, self.rules) if self.npu_ranks else None
        bench = merge_ranks(self.bench_ranks, self.bench_json, self.rules) if self.bench_ranks else None
        return MergedPair(npu, bench, self.rules)


@dataclass
class MergePlan:
    """The pairs of a run where some steps merge: (key, npu json, bench json, MergeJob or None)."""
    pairs: list
    unpaired: list
    notes: list = field(default_factory=list)


def carries_layouts(path: str) -> bool:
    """Whether a dump.json records any DTensor layout (read in 1 MB pieces, stopping at the first)."""
    tail = b""
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(_SCAN)
            if not chunk:
                return False
            if b'"placements"' in tail + chunk:
                return True
            tail = chunk[-16:]


def plan_merges(npu_root: str, bench_root: str, output_path: str, rules: LayoutRules | None) -> MergePlan | None:
    """The run's pairs when some step has another number of ranks on each side and can be
    merged; None where every step pairs rank by rank (the caller pairs as before)."""
    npu, bench = _by_step(find_dumps(npu_root)), _by_step(find_dumps(bench_root))
    if sum(map(len, npu.values())) == 1 and sum(map(len, bench.values())) == 1:
        return None                   # one dump a side: pairs whatever its folder is called
    differ = [s for s in sorted(set(npu) & set(bench), key=_step_order) if len(npu[s]) != len(bench[s])]
    if not differ:
        return None
    s = differ[0]
    several = [side for side in (npu[s], bench[s]) if len(side) > 1]
    if rules is None and not any(carries_layouts(side[min(side, key=_rank_order)]) for side in several):
        return None
    pairs: list = []
    unpaired: list = []
    for step in sorted(set(npu) | set(bench), key=_step_order):
        n, b = npu.get(step), bench.get(step)
        if n is None or b is None:
            side, ranks = ("npu", n or {}) if b is None else ("bench", b)
            unpaired.extend((side, (step, rid)) for rid in sorted(ranks, key=_rank_order))
            continue
        if len(n) == len(b):
            for rid in sorted(set(n) | set(b), key=_rank_order):
                if rid in n and rid in b:
                    pairs.append(((step, rid), n[rid], b[rid], None))
                else:
                    unpaired.append(("npu" if rid in n else "bench", (step, rid)))
            continue
        rid = next(iter(b)) if len(b) == 1 else (next(iter(n)) if len(n) == 1 else "")
        key = (step, rid)
        npu_json, npu_ranks = _side(n, output_path, "npu", step)
        bench_json, bench_ranks = _side(b, output_path, "bench", step)
        pairs.append((key, npu_json, bench_json, MergeJob(npu_ranks, bench_ranks, npu_json, bench_json, rules)))
    pairs.sort(key=lambda p: order(p[0]))
    merged = [label(k) for k, _, _, job in pairs if job is not None]
    notes = [f"steps with another number of ranks on each side are compared as one logical dump per step, "
             f"their ranks merged by their layouts{' and the layout file ' + rules.path if rules else ''}: "
             f"{', '.join(merged[:10])}{' ...' if len(merged) > 10 else ''}"]
    return MergePlan(pairs, unpaired, notes)


def merge_hint(npu_root: str, bench_root: str) -> str:
    """Why no step/rank paired, where the ranks differ in number but nothing says how to merge."""
    npu, bench = _by_step(find_dumps(npu_root)), _by_step(find_dumps(bench_root))
    for s in sorted(set(npu) & set(bench), key=_step_order):
        if len(npu[s]) != len(bench[s]):
            return (f"; the NPU side has {len(npu[s])} rank(s) at {s or 'its step'}, the bench {len(bench[s])}, "
                    f"and no entry records a layout (a DTensor's): give a layout file (--layout FILE) to merge "
                    f"plain shards")
    return ""


def _by_step(found: dict) -> dict:
    out: dict = {}
    for (step, rid), path in found.items():
        out.setdefault(step, {})[rid] = path
    return out


def _step_order(step: str) -> tuple:
    return order((step, ""))


def _rank_order(rid: str) -> tuple:
    return rank_number(("", rid)), rid


def _side(ranks: dict, output_path: str, side: str, step: str):
    """(the dump.json compared, [(rank, dump.json)] to merge or None) for one side of a step."""
    if len(ranks) == 1:
        return next(iter(ranks.values())), None
    folder = os.path.join(output_path, MERGED_DIR.format(side=side), *([step] if step else []), "rank")
    merged = [(rank_number(("", rid)), path) for rid, path in ranks.items()]
    return os.path.join(folder, "dump.json"), sorted(merged)


# ---------------------------------------------------------------- what the merge adds to a compare

@dataclass
class MergedPair:
    """A pair whose sides were merged: its reports, and the culprit rank once found."""
    npu: MergeReport | None
    bench: MergeReport | None
    rules: LayoutRules | None = None
    culprit: Culprit | None = None
    culprit_call: str | None = None

    def before_diagnosis(self, result) -> None:
        """Rows the merge could not give become "can't tell" rows (their numbers cleared, so
        the diagnosis takes nothing from them); copies that differ are error rows."""
        from probe.vocabulary import STAT_DIFFS, TENSOR_METRICS
        cols = result.columns
        cleared = [c for c in STAT_DIFFS + TENSOR_METRICS + ["Err/Tolerance", "Tolerance Dtype"] if c in cols]
        for side in (self.npu, self.bench):
            if side is not None:
                result.notes.extend(side.notes("NPU" if side is self.npu else "bench"))
        for i, p in enumerate(result.pairs):
            if p.npu is None or p.bench is None:
                continue
            why = self._cant_tell(p)
            if why:
                for c in cleared:
                    cols[c][i] = None
                cols["Result"][i] = "warning"
                cols["Err_message"][i] = f"warning: can't tell: {why}"
                # the merge did not give its whole shape: not a data-dependent path's other
                # number of elements for the diagnosis (the table keeps the shape it holds)
                side_row = "npu" if self.npu is not None and p.npu.name in self.npu.cant_tell else "bench"
                other = p.bench if side_row == "npu" else p.npu
                setattr(p, side_row, msgspec.structs.replace(getattr(p, side_row), shape=other.shape))
                continue
            differ = self._disagree(p)
            if differ:
                cols["Result"][i] = "error"
                text = f"error: copies of this replicated tensor differ across ranks ({differ})"
                cols["Err_message"][i] = text + ("; " + cols["Err_message"][i] if cols["Err_message"][i] else "")

    def _cant_tell(self, p) -> str:
        for side, row in ((self.npu, p.npu), (self.bench, p.bench)):
            if side is not None and row.name in side.cant_tell:
                return side.cant_tell[row.name]
        return ""

    def _disagree(self, p) -> str:
        for side, row in ((self.npu, p.npu), (self.bench, p.bench)):
            if side is not None and row.name in side.disagree:
                return side.disagree[row.name]
        return ""

    def after_diagnosis(self, result, diag) -> None:
        """Calls whose output the merge could not give are "can't tell", with the reason; the
        first divergence is traced to the rank whose shard differs."""
        pairs = result.pairs
        for u in diag.calls:
            if u.status not in ("clean", "not compared"):
                continue
            for i in u.rows:
                p = pairs[i]
                if p.npu is None or p.bench is None or p.npu.io not in ("output", "parameters_grad"):
                    continue
                why = self._cant_tell(p)
                if why:
                    u.status, u.note = "can't tell", f"{p.npu.name} can't be merged across ranks: {why}"
                    break
        self._find_culprit(result, diag)

    def _find_culprit(self, result, diag) -> None:
        found = [d for d in (diag.forward, diag.backward) if d is not None and d.kind == "introduced"]
        if not found or self.npu is None:
            return
        u = min(found, key=lambda d: d.call.index).call
        rows = [i for i in u.rows if result.pairs[i].npu is not None and result.pairs[i].bench is not None
                and result.pairs[i].npu.io in ("output", "parameters_grad")]
        if u.worst_row in rows:
            rows.remove(u.worst_row)
            rows.insert(0, u.worst_row)
        if not rows or not u.npu_entry:
            return
        try:
            pieces = entry_tensors(list(zip(self.npu.ranks, self.npu.rank_jsons)), u.npu_entry, self.rules)
        except (OSError, ValueError) as exc:
            log.debug("pieces of %s not read: %s", u.npu_entry, exc)
            return
        for i in rows:
            a, b = result.pairs[i].npu, result.pairs[i].bench
            mt = pieces.get(a.name)
            if mt is None:
                continue
            bench_file = None
            if result.mode == "tensor" and b.data_name and result.bench is not None:
                try:
                    bench_file = resolve(result.bench.data_dir, b.data_name)
                except ValueError:
                    bench_file = None
            culprit = find_culprit(mt, b.stats, bench_file, max(u.tolerance, 1e-12))
            if culprit is not None:
                self.culprit, self.culprit_call = culprit, u.name
                result.notes.append(f"{u.name}: the rank{'s' if len(culprit.ranks) > 1 else ''} whose piece "
                                    f"differs: {', '.join(map(str, culprit.ranks))} ({a.name}: {culprit.text})")
                return

    def culprit_dict(self) -> dict | None:
        """What the run's answer takes: the ranks (most likely first), why, and the ranks merged."""
        if self.culprit is None or self.npu is None:
            return None
        return dict(self.culprit.as_dict(), call=self.culprit_call, merged_ranks=list(self.npu.ranks))
