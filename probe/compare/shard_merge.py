"""The ranks of one step of a sharded run read as one logical dump, as one device would
have written it.

A tensor-parallel (or FSDP) rank dumps its local shard; a single-device bench dumps the
whole tensor. To compare them, each call's shards are merged by their layout: the one a
DTensor's entry records (``placements``, ``global_offset``: probe/dump/dtensor_layout.py),
else the layout file's rule for the row (layout_file.py), else, for plain tensors, a
check that every rank holds the same copy.

- **Shard**: the pieces are placed at their offsets (tensors: concatenated exactly;
  statistics: Max of the Max, Min of the Min, the element-weighted Mean, the root of the
  summed squared Norms);
- **Replicate**: one copy (the lowest rank's), and a check that the copies agree (within
  the dtype's tolerance; ``disagree`` says which ranks differ);
- **Partial**: each rank holds a term: tensors are reduced (sum, avg, max, min); the
  statistics of a sum are not functions of its terms' statistics, so a statistics dump
  *can't tell* (``cant_tell`` says why, and the row gets that status).

The ranks' dump.json files are streamed side by side (entries in the same order on every
rank, as SPMD code makes them; an entry one rank has out of order waits in a small buffer)
and the merged dump is written entry by entry with its tensor files, so memory holds one
call's shards at a time, whatever the size of the run. The merged dump is an ordinary
dump (``dump.json``, ``dump_tensor_data/``, the lowest rank's ``construct.json`` and
``stack.json``): the engine, the diagnosis and its replays read it as they read any other.

    report = merge_ranks([(0, ".../step1/rank0/dump.json"), (1, ".../step1/rank1/dump.json")],
                         "OUT/merged_npu/step1/rank/dump.json", rules)   # -> MergeReport
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field

import numpy as np

from probe.tolerances import TOLERANCES
from probe.vocabulary import ENTRY_KEYS, MAX, MEAN, MIN, NORM, PARAMETERS_GRAD, STAT_KEYS, parse_entry_name

from .layout_file import LayoutRules
from .reader import DumpMeta, read_dump
from .tensors import load, resolve
from .verdict import dtype_class

log = logging.getLogger(__name__)

LAYOUT_KEYS = ("local_shape", "placements", "mesh_shape", "global_offset")
_MERGED_STATS = (MAX, MIN, MEAN, NORM)     # the statistics a merge computes from its pieces'
# a piece's keys the merged tensor does not keep: its layout, its hash and file, and any
# statistic the merge does not compute (one rank's would pass for the whole tensor's)
_NOT_KEPT = frozenset(LAYOUT_KEYS) | {"md5", "data_name"} | (frozenset(STAT_KEYS) - frozenset(_MERGED_STATS))
_TENSOR_TYPES = ("torch.Tensor", "numpy.ndarray")
_NAN = float("nan")
_SHARD = re.compile(r"^Shard\(dim=(-?\d+)\)$")
_PARTIAL = re.compile(r"^_?Partial\((?:reduce_op=)?(?:[A-Za-z_]+\.)?([A-Za-z]+)\)$")
_REDUCE_NAMES = {"sum": "sum", "avg": "avg", "mean": "avg", "max": "max", "min": "min"}
NO_LAYOUT = ("its copies differ across ranks and neither a recorded layout nor the layout file "
             "says how to merge them (give a layout file rule for it)")


@dataclass
class Piece:
    """One rank's part of a tensor, as its dump.json entry describes it."""
    rank: int
    shape: tuple                     # the rank's local shape
    dtype: str
    stats: tuple                     # Max, Min, Mean, Norm (NaN where not recorded)
    offset: tuple | None = None      # where it starts in the whole tensor
    data_path: str | None = None     # its tensor file (tensor dumps)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class MergedTensor:
    """One row of the logical dump: the pieces of one tensor on every rank, merged."""
    name: str                        # the row name (entry + .input.0 ...)
    how: str                         # "shard" / "replicate" / "partial" / "one rank" / "can't tell"
    layout: str                      # the placements, as a person reads them ("Shard(dim=1)")
    source: str                      # "recorded", "layout file" or "plain" (copies that agree)
    shape: tuple                     # the whole tensor's shape
    dtype: str
    stats: tuple = (_NAN, _NAN, _NAN, _NAN)
    groups: list = field(default_factory=list)   # pieces at one offset each: copies, or a Partial's terms
    reduce: str | None = None        # a Partial's reduction
    cant_tell: str = ""              # why the merge cannot give this tensor
    disagree: str = ""               # copies that should agree and do not: which ranks
    scale: float = 1.0               # the layout file's factor: the pieces' files times it (their stats are scaled)

    @property
    def pieces(self) -> list:
        return [p for g in self.groups for p in g]

    @property
    def has_files(self) -> bool:
        return bool(self.groups) and all(p.data_path for p in self.pieces)

    def array(self) -> np.ndarray:
        """The whole tensor from its pieces' files (one call's pieces in memory at a time).
        Raises ValueError where the merge cannot give it."""
        if self.cant_tell:
            raise ValueError(self.cant_tell)
        if not self.has_files:
            raise ValueError("a piece has no tensor file")
        if self.how in ("replicate", "one rank"):
            return self._scaled(load(self.groups[0][0].data_path))
        out = None
        for group in self.groups:
            value = _reduce([load(p.data_path) for p in group], self.reduce) if self.reduce \
                else load(group[0].data_path)
            if out is None:
                out = np.empty(self.shape, dtype=value.dtype)
            out[_slices(group[0].offset, group[0].shape)] = value
        return self._scaled(out) if out is not None else np.empty(self.shape)

    def _scaled(self, a: np.ndarray) -> np.ndarray:
        return (a * self.scale).astype(a.dtype) if self.scale != 1 and a.dtype.kind in "fc" else a

    def piece_array(self, p: Piece) -> np.ndarray:
        """One piece's tensor as the merged tensor holds it (times the rule's scale)."""
        if p.data_path is None:
            raise ValueError(f"rank {p.rank}'s piece has no tensor file")
        return self._scaled(load(p.data_path))


@dataclass
class MergeReport:
    """What merging one step's ranks did: the logical dump's path and what it could not do."""
    json_path: str
    ranks: list
    rank_jsons: list
    tensors: bool = False            # the merged dump holds tensor files
    counts: dict = field(default_factory=dict)     # how -> rows
    cant_tell: dict = field(default_factory=dict)  # row -> why
    disagree: dict = field(default_factory=dict)   # row -> which ranks' copies differ
    problems: list = field(default_factory=list)   # a rank's dump cut off, entries one rank lacks

    def notes(self, side: str) -> list:
        """What a person reads in the report, said once per kind."""
        ranks = ", ".join(map(str, self.ranks))
        done = ", ".join(f"{n} {how}" for how, n in sorted(self.counts.items()) if how != "can't tell")
        notes = [f"{side} ranks {ranks} merged into one logical dump by their layouts ({done or 'nothing'}): "
                 f"{self.json_path}"]
        if self.cant_tell:
            first, why = next(iter(self.cant_tell.items()))
            notes.append(f"{side}: {len(self.cant_tell)} row(s) can't be merged, \"can't tell\" "
                         f"(first: {first}: {why})")
        if self.disagree:
            first, which = next(iter(self.disagree.items()))
            notes.append(f"{side}: {len(self.disagree)} replicated row(s) whose copies differ across ranks "
                         f"(first: {first}: {which}); the lowest rank's copy is compared")
        return notes + list(self.problems)


# ---------------------------------------------------------------- one tensor's layout

@functools.lru_cache(maxsize=256)
def parse_placement(text: str) -> tuple:
    """("shard", dim) / ("replicate", None) / ("partial", op) / ("unknown", text)."""
    text = str(text).strip()
    m = _SHARD.match(text)
    if m:
        return "shard", int(m.group(1))
    if text == "Replicate()":
        return "replicate", None
    m = _PARTIAL.match(text)
    if m and m.group(1).lower() in _REDUCE_NAMES:
        return "partial", _REDUCE_NAMES[m.group(1).lower()]
    return "unknown", text


def _stat(x) -> float:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)):
        return float(x)
    return _NAN


def is_tensor_leaf(d) -> bool:
    """A tensor's description (rows.py reads the same ones as tensor rows)."""
    return isinstance(d, dict) and (d.get("type") in _TENSOR_TYPES or ("dtype" in d and "shape" in d))


def _piece(rank: int, leaf: dict, data_dir: str) -> Piece:
    path = None
    if leaf.get("data_name"):
        try:
            path = resolve(data_dir, leaf["data_name"])
        except ValueError:
            path = None
    offset = leaf.get("global_offset")
    shape = leaf.get("local_shape", leaf.get("shape")) or ()
    stats = tuple([v if type(v) is float else _stat(v) for v in map(leaf.get, _MERGED_STATS)])
    return Piece(rank, tuple(shape), str(leaf.get("dtype")), stats,
                 tuple(offset) if isinstance(offset, list) else None, path)


def merge_tensor(name: str, leaves: list, data_dirs: list, rules: LayoutRules | None,
                 tensors: bool) -> MergedTensor:
    """Merge one tensor's descriptions on every rank (``leaves``: (rank, leaf dict or None),
    rank order; ``data_dirs`` in the same order). ``tensors``: merge by the files (a tensor
    dump) rather than by the statistics."""
    present = [(r, leaf, d) for (r, leaf), d in zip(leaves, data_dirs) if is_tensor_leaf(leaf)]
    first = present[0][1]
    pieces = [_piece(r, leaf, d) for r, leaf, d in present]
    dtype = str(first.get("dtype"))
    if len(present) == 1:
        layout = first.get("placements")
        if layout and len(leaves) > 1:
            return _cant(name, pieces, tuple(first.get("shape") or ()), dtype, str(layout), "recorded",
                         f"only rank {pieces[0].rank} recorded this {layout} tensor: its other pieces are missing")
        return MergedTensor(name, "one rank", "", "plain", pieces[0].shape, dtype, pieces[0].stats, [pieces])
    if len(present) < len(leaves):
        missing = sorted(set(r for r, _ in leaves) - set(p.rank for p in pieces))
        return _cant(name, pieces, tuple(first.get("shape") or ()), dtype, "", "plain",
                     f"rank(s) {', '.join(map(str, missing))} have no such tensor")
    if any(p.dtype != dtype for p in pieces):
        return _cant(name, pieces, pieces[0].shape, dtype, "", "plain",
                     f"the ranks' dtypes differ ({', '.join(sorted(set(p.dtype for p in pieces)))})")
    if first.get("placements"):
        return _recorded(name, first, pieces, dtype, tensors)
    rule = rules.find(name) if rules is not None else None
    if rules is not None and rule is not None:
        return _ruled(name, rule, pieces, dtype, tensors, rules.path)
    return _plain(name, pieces, dtype, tensors)


def _cant(name, pieces, shape, dtype, layout, source, why) -> MergedTensor:
    return MergedTensor(name, "can't tell", layout, source, tuple(shape), dtype, groups=[pieces], cant_tell=why)


def _recorded(name: str, leaf: dict, pieces: list, dtype: str, tensors: bool) -> MergedTensor:
    """A DTensor: its placements, mesh and offsets as the dump recorded them."""
    placements = [parse_placement(str(p)) for p in leaf["placements"]]
    layout = ", ".join(str(p) for p in leaf["placements"])
    shape = tuple(leaf.get("shape") or ())
    unknown = [text for kind, text in placements if kind == "unknown"]
    if unknown:
        return _cant(name, pieces, shape, dtype, layout, "recorded", f"placement {unknown[0]} is not merged")
    mesh = leaf.get("mesh_shape") or []
    if mesh and math.prod(mesh) != len(pieces):
        return _cant(name, pieces, shape, dtype, layout, "recorded",
                     f"its mesh {list(mesh)} holds {math.prod(mesh)} devices, the step {len(pieces)} ranks: "
                     f"the dump does not say which ranks form which mesh")
    reduces = {arg for kind, arg in placements if kind == "partial"}
    copies = any(kind == "replicate" for kind, _ in placements)
    if len(reduces) > 1 or (reduces and copies):
        return _cant(name, pieces, shape, dtype, layout, "recorded",
                     f"placements {layout} mix Partial with {'another reduction' if len(reduces) > 1 else 'Replicate'} "
                     f"over a mesh: the dump does not record each rank's mesh coordinate to tell copies from terms")
    if any(p.offset is None for p in pieces):
        if len(placements) != 1:
            return _cant(name, pieces, shape, dtype, layout, "recorded",
                         "no global offset recorded (this torch) on a mesh of several dimensions")
        kind, arg = placements[0]
        pieces = _with_offsets(pieces, arg if kind == "shard" else None)
    reduce = reduces.pop() if reduces else None
    shards = any(kind == "shard" for kind, _ in placements)
    how = "partial" if reduce else ("shard" if shards else "replicate")
    return _assemble(name, how, layout, "recorded", shape, dtype, pieces, reduce, tensors)


def _ruled(name: str, rule, pieces: list, dtype: str, tensors: bool, path: str) -> MergedTensor:
    """A plain tensor the layout file describes (a 1-D mesh over the step's ranks, rank order),
    times the rule's scale where it has one (a float tensor's pieces and their statistics)."""
    if rule.scale == 1 or dtype_class(dtype) in (None, "exact"):
        return _ruled_layout(name, rule, pieces, dtype, tensors, path)
    mt = _ruled_layout(name, rule, [_scaled_piece(p, rule.scale) for p in pieces], dtype, tensors, path)
    mt.scale = rule.scale
    mt.layout = f"{mt.layout} x{rule.scale:g}"
    return mt


def _scaled_piece(p: Piece, scale: float) -> Piece:
    """The piece's statistics as ``scale`` times it has them (Max and Min swap below zero)."""
    mx, mn, mean, norm = p.stats
    mx, mn = (mx * scale, mn * scale) if scale > 0 else (mn * scale, mx * scale)
    return Piece(p.rank, p.shape, p.dtype, (mx, mn, mean * scale, norm * abs(scale)), p.offset, p.data_path)


def _ruled_layout(name: str, rule, pieces: list, dtype: str, tensors: bool, path: str) -> MergedTensor:
    source = "layout file"
    if rule.kind == "shard":
        ndim = len(pieces[0].shape)
        dim = rule.shard_dim + ndim if rule.shard_dim < 0 else rule.shard_dim
        layout = f"Shard(dim={dim})"
        if not 0 <= dim < ndim:
            return _cant(name, pieces, pieces[0].shape, dtype, layout, source,
                         f"{path}: rule {rule.pattern!r} shards dim {rule.shard_dim} of a {ndim}-d tensor")
        others = {p.shape[:dim] + p.shape[dim + 1:] for p in pieces}
        if len(others) != 1 or any(len(p.shape) != ndim for p in pieces):
            return _cant(name, pieces, pieces[0].shape, dtype, layout, source,
                         f"the ranks' shapes {[list(p.shape) for p in pieces]} differ beyond dim {dim}")
        shape = list(pieces[0].shape)
        shape[dim] = sum(p.shape[dim] for p in pieces)
        return _assemble(name, "shard", layout, source, tuple(shape), dtype, _with_offsets(pieces, dim), None, tensors)
    if len({p.shape for p in pieces}) != 1:
        return _cant(name, pieces, pieces[0].shape, dtype, rule.kind, source,
                     f"a {rule.kind} rule, but the ranks' shapes differ: {[list(p.shape) for p in pieces]}")
    if rule.kind == "partial":
        return _assemble(name, "partial", f"Partial({rule.reduce})", source, pieces[0].shape, dtype,
                         _with_offsets(pieces, None), rule.reduce, tensors)
    return _assemble(name, "replicate", "Replicate()", source, pieces[0].shape, dtype,
                     _with_offsets(pieces, None), None, tensors)


def _plain(name: str, pieces: list, dtype: str, tensors: bool) -> MergedTensor:
    """A plain tensor with no rule: one tensor when every rank holds the same copy."""
    if len({p.shape for p in pieces}) != 1:
        return _cant(name, pieces, pieces[0].shape, dtype, "", "plain",
                     f"the ranks' shapes differ ({', '.join(str(list(p.shape)) for p in pieces)}) and " + NO_LAYOUT)
    merged = _assemble(name, "replicate", "", "plain", pieces[0].shape, dtype, _with_offsets(pieces, None), None, tensors)
    if merged.disagree:
        return _cant(name, pieces, pieces[0].shape, dtype, "", "plain", NO_LAYOUT)
    return merged


def _with_offsets(pieces: list, dim: int | None) -> list:
    """Offsets of a 1-D mesh in rank order: cumulative along ``dim``, zero without one."""
    out, at = [], 0
    for p in pieces:
        offset = [0] * len(p.shape)
        if dim is not None:
            offset[dim] = at
            at += p.shape[dim]
        out.append(Piece(p.rank, p.shape, p.dtype, p.stats, tuple(offset), p.data_path))
    return out


def _assemble(name, how, layout, source, shape, dtype, pieces, reduce, tensors) -> MergedTensor:
    """Group the pieces by offset, check they tile the whole tensor, merge the statistics
    and check that copies agree."""
    groups: dict = {}
    for p in pieces:
        groups.setdefault(p.offset, []).append(p)
    ordered = [groups[k] for k in sorted(groups)]
    for g in ordered:
        if len({p.shape for p in g}) != 1:
            return _cant(name, pieces, shape, dtype, layout, source,
                         f"pieces at offset {list(g[0].offset)} have different shapes")
    if sum(g[0].numel for g in ordered) != math.prod(shape) or not all(_inside(g[0], shape) for g in ordered):
        return _cant(name, pieces, shape, dtype, layout, source,
                     f"the pieces ({', '.join(f'rank {p.rank}: {list(p.shape)} at {list(p.offset)}' for p in pieces)}) "
                     f"do not tile the shape {list(shape)}")
    mt = MergedTensor(name, how, layout, source, tuple(shape), dtype, groups=ordered, reduce=reduce)
    if tensors and mt.has_files:
        _merge_files(mt)
    elif reduce:
        mt.how, mt.cant_tell = "can't tell", (
            f"a {layout} tensor holds one term of a {reduce} on each rank: the statistics of a {reduce} are not "
            f"functions of its terms' (dump tensors to merge it)")
    else:
        _merge_stats(mt)
    return mt


def _inside(p: Piece, shape) -> bool:
    return p.offset is not None and len(p.offset) == len(shape) and all(0 <= o and o + s <= n for o, s, n in zip(p.offset, p.shape, shape))


def _merge_stats(mt: MergedTensor) -> None:
    """Whole-tensor statistics from the first copy of each piece; copies checked against it."""
    firsts = [g[0] for g in mt.groups]
    live = [p for p in firsts if p.numel]
    if not live:
        mt.stats = firsts[0].stats
    else:
        n = sum(p.numel for p in live)
        mx = max(p.stats[0] for p in live) if not any(math.isnan(p.stats[0]) for p in live) else _NAN
        mn = min(p.stats[1] for p in live) if not any(math.isnan(p.stats[1]) for p in live) else _NAN
        mean = sum(p.stats[2] * p.numel for p in live) / n
        norm = math.sqrt(sum(p.stats[3] ** 2 for p in live))
        mt.stats = (mx, mn, mean, norm)
    differ = [(g[0].rank, p.rank) for g in mt.groups for p in g[1:] if not stats_agree(g[0], p)]
    if differ:
        mt.disagree = _differ_text(differ)


def stats_agree(a: Piece, b: Piece) -> bool:
    """Two copies' statistics equal within the dtype's tolerance (exact for ints and bools)."""
    tol = TOLERANCES.get(dtype_class(a.dtype) or "")
    if tol is None:
        return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a.stats, b.stats))
    rms = abs(a.stats[3]) / math.sqrt(max(a.numel, 1)) if math.isfinite(a.stats[3]) else 0.0
    scale = max(abs(a.stats[0]) if math.isfinite(a.stats[0]) else 0.0,
                abs(a.stats[1]) if math.isfinite(a.stats[1]) else 0.0, rms, tol.floor)
    for x, y in zip(a.stats, b.stats):
        if math.isnan(x) and math.isnan(y):
            continue
        if not (math.isfinite(x) and math.isfinite(y)):
            if x != y:
                return False
            continue
        if abs(x - y) > tol.rtol * scale:
            return False
    return True


def arrays_agree(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    """Two copies equal element by element within the dtype's tolerance, NaN/Inf at the same places."""
    if a.shape != b.shape:
        return False
    tol = TOLERANCES.get(dtype_class(dtype) or "")
    if tol is None:
        return bool(np.array_equal(a, b))
    x, y = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    fx, fy = np.isfinite(x), np.isfinite(y)
    if not np.array_equal(fx, fy) or not np.array_equal(x[~fx], y[~fy], equal_nan=True):
        return False
    x, y = x[fx], y[fy]
    if not x.size:
        return True
    scale = max(float(np.sqrt(np.mean(x * x))), tol.floor)
    return bool(np.all(np.abs(x - y) <= tol.rtol * np.maximum(np.abs(x), scale)))


def _differ_text(differ: list) -> str:
    return "; ".join(f"rank {b}'s copy differs from rank {a}'s" for a, b in differ)


def _merge_files(mt: MergedTensor) -> None:
    """Tensor dumps: copies checked element by element (which decides ``disagree``); the
    statistics from the pieces as in a statistics dump, a Partial's from the reduced tensor
    when it is written (``_merged_leaf``)."""
    differ: list = []
    for g in mt.groups:
        if mt.reduce or len(g) < 2:
            continue
        ref = mt.piece_array(g[0])
        differ.extend((g[0].rank, p.rank) for p in g[1:] if not arrays_agree(ref, mt.piece_array(p), mt.dtype))
    if not mt.reduce:
        _merge_stats(mt)
    mt.disagree = _differ_text(differ) if differ else ""


def array_stats(a: np.ndarray) -> tuple:
    """Max, Min, Mean, Norm of an array in float64 (the dump's own definitions)."""
    if not a.size:
        return (_NAN, _NAN, _NAN, _NAN)
    x = a.astype(np.float64, copy=False)
    return (float(x.max()), float(x.min()), float(x.mean()), float(np.sqrt(np.sum(x * x))))


def _reduce(arrays: list, op: str) -> np.ndarray:
    dtype = arrays[0].dtype
    if op in ("max", "min"):
        return (np.maximum if op == "max" else np.minimum).reduce(arrays)
    total = np.sum([a.astype(np.float64) for a in arrays], axis=0) if dtype.kind == "f" else np.sum(arrays, axis=0)
    if op == "avg":
        total = total / len(arrays)
    return total.astype(dtype) if dtype.kind == "f" else total


def _slices(offset, shape) -> tuple:
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


# ---------------------------------------------------------------- one entry on every rank

class _Walk:
    """Rebuilds one entry from its copies on every rank, merging each tensor (row names as
    rows.py gives them: the layout file's patterns match those)."""

    def __init__(self, data_dirs: list, ranks: list, rules: LayoutRules | None, tensors: bool, sink):
        self.data_dirs, self.ranks, self.rules, self.tensors, self.sink = data_dirs, ranks, rules, tensors, sink

    def entry(self, name: str, copies: list) -> dict:
        base = copies[0]
        if not isinstance(base, dict):
            return base
        out = dict(base)
        if PARAMETERS_GRAD in name:
            parsed = parse_entry_name(name)
            if parsed is not None and parsed.direction == PARAMETERS_GRAD and not parsed.io:
                for key in base:
                    out[key] = self.value(f"{name}.{key}", [_get(c, key) for c in copies], False)
                return out
        for key, io in ENTRY_KEYS:
            if key in base:
                out[key] = self.value(f"{name}.{io}", [_get(c, key) for c in copies], True)
        return out

    def value(self, name: str, copies: list, index_lists: bool):
        base = copies[0]
        if base is None:
            return None
        if isinstance(base, list):
            return [self.value(f"{name}.{i}" if index_lists else name,
                               [c[i] if isinstance(c, list) and i < len(c) else None for c in copies], index_lists)
                    for i in range(len(base))]
        if isinstance(base, dict):
            if isinstance(base.get("type"), str):
                return self.leaf(name, copies) if is_tensor_leaf(base) else base
            return {k: self.value(f"{name}.{k}", [_get(c, k) for c in copies], index_lists) for k in base}
        return base

    def leaf(self, name: str, copies: list) -> dict:
        mt = merge_tensor(name, list(zip(self.ranks, copies)), self.data_dirs, self.rules, self.tensors)
        return self.sink(mt, copies[0])


def _get(d, key):
    return d.get(key) if isinstance(d, dict) else None


class _RankReader:
    """One rank's entries in file order; ``take(name)`` reads ahead to the entry and keeps
    the ones passed on the way (another rank's order) until they are asked for."""

    def __init__(self, rank: int, path: str):
        self.rank, self.path = rank, path
        self.meta = DumpMeta(path)
        self.entries = read_dump(path, self.meta, stream=True)
        self.ahead: dict = {}

    def take(self, name: str):
        if name in self.ahead:
            return self.ahead.pop(name)
        for n, e in self.entries:
            if n == name:
                return e
            self.ahead[n] = e
        return None

    def rest(self):
        while self.ahead:
            name = next(iter(self.ahead))
            yield name, self.ahead.pop(name)
        yield from self.entries


def entries_side_by_side(rank_jsons: list):
    """Yield ``(entry name, [entry on each rank or None])``: the lowest rank's order, then
    entries only later ranks have. Also returns the readers' metadata (as the last value of
    the generator: ``StopIteration.value``)."""
    readers = [_RankReader(r, p) for r, p in rank_jsons]
    done: set = set()
    for k, reader in enumerate(readers):
        for name, entry in (reader.entries if k == 0 else reader.rest()):
            if name in done:
                continue
            done.add(name)
            copies = [None] * k + [entry] + [other.take(name) for other in readers[k + 1:]]
            yield name, copies
    return [r.meta for r in readers]


# ---------------------------------------------------------------- the merged dump

_HEADER = ("task", "level", "framework", "math_modes", "complete")


def merge_ranks(rank_jsons: list, out_json: str, rules: LayoutRules | None = None) -> MergeReport:
    """Write the merged dump of ``rank_jsons`` ([(rank, dump.json)], one step) to
    ``out_json`` (its folder is made; an older merge there is replaced)."""
    rank_jsons = sorted(rank_jsons)
    out_dir = os.path.dirname(os.path.abspath(out_json))
    data_out = os.path.join(out_dir, "dump_tensor_data")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    ranks = [r for r, _ in rank_jsons]
    data_dirs = [os.path.join(os.path.dirname(os.path.abspath(p)), "dump_tensor_data") for _, p in rank_jsons]
    report = MergeReport(os.path.abspath(out_json), ranks, [p for _, p in rank_jsons])
    report.tensors = _has_tensor_files(rank_jsons[0][1])
    written: set = set()

    def sink(mt: MergedTensor, base: dict) -> dict:
        report.counts[mt.how] = report.counts.get(mt.how, 0) + 1
        if mt.cant_tell:
            report.cant_tell[mt.name] = mt.cant_tell
        if mt.disagree:
            report.disagree[mt.name] = mt.disagree
        return _merged_leaf(mt, base, data_out, written, report.tensors)

    walk = _Walk(data_dirs, ranks, rules, report.tensors, sink)
    tmp = out_json + ".tmp"
    gen = entries_side_by_side(rank_jsons)
    metas: list = []
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write('{"data": {')
        first = True
        while True:
            try:
                name, copies = next(gen)
            except StopIteration as stop:
                metas = stop.value or []
                break
            lacking = [r for r, c in zip(ranks, copies) if c is None]
            if lacking and len(report.problems) < 20:
                report.problems.append(f"{name}: not on rank(s) {', '.join(map(str, lacking))}")
            present = next(c for c in copies if c is not None)
            copies = [c if c is not None else _absent(present) for c in copies]
            merged = walk.entry(name, copies)
            fh.write(("" if first else ",\n") + json.dumps(name) + ": " + json.dumps(merged))
            first = False
        fh.write("}")
        base_meta = metas[0] if metas else DumpMeta(rank_jsons[0][1])
        if any(m.complete is False for m in metas):    # one rank's step did not finish: nor did the merge's
            base_meta.complete = False
        for key in _HEADER:
            value = getattr(base_meta, key, None)
            if value is not None:
                fh.write(f", {json.dumps(key)}: {json.dumps(value)}")
        if report.tensors:
            fh.write(f', "dump_data_dir": {json.dumps(data_out)}')
        fh.write("}")
    os.replace(tmp, out_json)
    for meta in metas:
        report.problems.extend(meta.problems)
    for extra in ("construct.json", "stack.json"):
        src = os.path.join(os.path.dirname(os.path.abspath(rank_jsons[0][1])), extra)
        if os.path.isfile(src):
            shutil.copyfile(src, os.path.join(out_dir, extra))
    log.debug("merged ranks %s into %s: %s", ranks, out_json, report.counts)
    return report


def _absent(entry):
    """What a rank lacking an entry contributes: the same structure with no tensors."""
    if isinstance(entry, dict):
        if isinstance(entry.get("type"), str):
            return None
        return {k: _absent(v) for k, v in entry.items()}
    if isinstance(entry, list):
        return [_absent(v) for v in entry]
    return None


def _has_tensor_files(json_path: str) -> bool:
    data_dir = os.path.join(os.path.dirname(os.path.abspath(json_path)), "dump_tensor_data")
    return os.path.isdir(data_dir) and any(True for _ in os.scandir(data_dir))


def _finite_or_none(x: float):
    return None if math.isnan(x) else x


def _merged_leaf(mt: MergedTensor, base: dict, data_out: str, written: set, tensors: bool) -> dict:
    """The merged tensor's description in the logical dump (and its file, in a tensor dump)."""
    leaf = {k: v for k, v in base.items() if k not in _NOT_KEPT}
    leaf["shape"] = list(mt.shape)
    if mt.cant_tell:
        for key in _MERGED_STATS:
            leaf[key] = None
        leaf["merge"] = f"can't tell: {mt.cant_tell}"
        return leaf
    if tensors and mt.has_files:
        try:
            arr = mt.array()
            if mt.reduce:
                mt.stats = array_stats(arr)
            os.makedirs(data_out, exist_ok=True)
            name = _file_name(base.get("data_name") or mt.name, written)
            np.save(os.path.join(data_out, name), np.asarray(arr, order="C"), allow_pickle=False)
            leaf["data_name"] = name
        except (OSError, ValueError) as exc:
            log.warning("merged tensor %s not written: %s", mt.name, exc)
    for key, value in zip(_MERGED_STATS, mt.stats):
        leaf[key] = _finite_or_none(value)
    ranks = ",".join(str(p.rank) for p in mt.pieces)
    leaf["merge"] = " ".join(x for x in (mt.how, mt.layout, f"over ranks {ranks}", f"({mt.source})") if x)
    return leaf


def _file_name(name: str, written: set) -> str:
    stem = os.path.basename(name)
    stem = stem[: -len(".npy")] if stem.endswith(".npy") else (stem[: -len(".pt")] if stem.endswith(".pt") else stem)
    out, k = stem + ".npy", 1
    while out in written:
        out, k = f"{stem}.{k}.npy", k + 1
    written.add(out)
    return out


def entry_tensors(rank_jsons: list, entry: str, rules: LayoutRules | None = None) -> dict:
    """row name -> MergedTensor of one entry (its pieces on every rank, not written
    anywhere): what a culprit search needs for the one call it looks at."""
    rank_jsons = sorted(rank_jsons)
    copies = []
    for _, path in rank_jsons:
        found = None
        for name, e in read_dump(path, DumpMeta(path), stream=True):
            if name == entry:
                found = e
                break
        copies.append(found)
    present = next((c for c in copies if c is not None), None)
    if present is None:
        return {}
    copies = [c if c is not None else _absent(present) for c in copies]
    ranks = [r for r, _ in rank_jsons]
    data_dirs = [os.path.join(os.path.dirname(os.path.abspath(p)), "dump_tensor_data") for _, p in rank_jsons]
    found_rows: dict = {}

    def keep(mt: MergedTensor, base: dict) -> dict:
        found_rows[mt.name] = mt
        return base

    _Walk(data_dirs, ranks, rules, _has_tensor_files(rank_jsons[0][1]), keep).entry(entry, copies)
    return found_rows
