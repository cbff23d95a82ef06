"""One request's rows gathered from every step of one run into a dump of its own.

The existing compare (engine, align, diagnosis, replay) then judges a request of the NPU run
against the same request of the bench run as it judges any two dumps: whatever the batch,
the padding or the chunking, each call's tensors hold the request's token rows only, one row
per position in position order. The steps holding the request are lined up call by call
(``merge_steps``: the longest common sequence of their APIs) and merged: a call of theirs
holds the request's rows from all of them, so a prefill split in chunks on one side and whole
on the other lines up by (request, position). A call only some steps make (HF's prefill
builds the padding mask, its decodes don't) stands alone in its place; where the two sides'
sequences differ, the engine aligns them.

Which dims of a tensor are token rows (``row_picker``):
- its leading dims equal the step's ``token_shape`` (the contract): each row is one token;
- HF's [batch, 1, ...] where the step has more than one position (lm_head under
  ``logits_to_keep=1``): each batch row's last position;
- HF's [batch, ..., seq, ...] (attention's [batch, heads, seq, head_dim]): the batch row and
  the first later dim of the step's seq length; at a decode step (one token per batch row),
  any [batch, ...]; tensor dumps only.
HF's tensors keep their rank: n rows become n sequences of one token ([n, 1, ...]), so a call
re-run on them (replay) computes row by row what it computed on the batch.
An input whose rows can't be told is kept whole when it is the same at every step (a weight)
and left out (null) otherwise (a KV cache, a batch's mask); such an output is left out always
(the batch's); a call none of whose tensors has token rows is not the request's and is left
out.

Statistics dumps gather each row's ``[Max, Min, Mean, Norm]`` from ``token_stats``; the
request's statistics are then those of its rows together. Tensor dumps slice the .npy files.
"""
from __future__ import annotations

import difflib
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import orjson

from probe.errors import ConfigError

from .tensors import load, resolve
from .tokens import Layout, Request, Side

log = logging.getLogger(__name__)

_COUNTED = (re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$"),
            re.compile(r"^(?P<api>.+\.(?:forward|backward))\.(?P<n>\d+)$"))
_STATS = ("Max", "Min", "Mean", "Norm")
DATA_DIR = "dump_tensor_data"


@dataclass
class Gathered:
    """A request's dump of one side, and where its rows came from."""
    json_path: str
    mode: str                                           # tensor / statistics
    origin: Dict[str, List[Tuple[int, str]]] = field(default_factory=dict)   # entry -> [(step, name there)]
    positions: Dict[str, List[int]] = field(default_factory=dict)   # "entry.output.0" -> row positions
    steps_at: Dict[str, List[int]] = field(default_factory=dict)    # "entry.output.0" -> each row's step
    row_stats: Dict[str, List[list]] = field(default_factory=dict)  # statistics dumps: each row's [Max, Min, Mean, Norm]
    files: Dict[str, str] = field(default_factory=dict)             # tensor dumps: row name -> its .npy

    def rows_of(self, key: str) -> Optional[np.ndarray]:
        """A gathered tensor's rows, one a row (tensor dumps: the .npy; statistics dumps:
        each row's four statistics), or None."""
        if key in self.row_stats:
            return np.array([[float(v) if isinstance(v, (int, float)) else np.nan for v in r]
                             for r in self.row_stats[key]], dtype=np.float64)
        if key not in self.files:
            return None
        path = os.path.join(os.path.dirname(self.json_path), DATA_DIR, self.files[key])
        arr = load(path)
        return arr.reshape(len(arr), -1) if arr.ndim else None


def row_picker(shape: tuple, layout: Layout, rows: List[Tuple[int, int]], tensor: bool):
    """(how, picks) for a tensor of ``shape`` in a step of ``layout``: picks are
    (index, position) with index a flat row ("token"), a batch row ("last") or (batch row,
    seq index) ("seq"); None when its rows can't be told."""
    ts = layout.token_shape
    k = len(ts)
    if tuple(shape[:k]) == ts:
        return "token", rows
    if k != 2 or not tensor or len(shape) < 2:
        return None
    b, s = ts
    if len(shape) >= 3 and shape[0] == b:
        for d in range(2, len(shape)):
            if shape[d] == s:
                return ("seq", d), [((f // s, f % s), p) for f, p in rows]
    if s > 1 and tuple(shape[:2]) == (b, 1):
        return "last", [(f // s, p) for f, p in rows if f % s == s - 1]
    if s == 1 and shape[0] == b:          # a decode step: a batch row is one token
        return "batch", rows
    return None


def _take(arr: np.ndarray, how, picks: list, k: int, unit_seq: bool = True) -> np.ndarray:
    """The picked rows, the tensor's rank kept: HF's [batch, seq, ...] tensors become n
    sequences of one token ([n, 1, ...]), so that a call re-run on them (replay) computes
    what it computed on the batch, row by row; ``unit_seq`` False: [n, ...], as a serving
    engine's flat token rows are (a run compared against one of those)."""
    idx = [i for i, _ in picks]
    if how == "token":
        flat = arr.reshape((-1,) + arr.shape[k:])[idx]
        return flat[:, None] if k == 2 and unit_seq else flat
    if how in ("last", "batch"):
        return arr[idx]
    d = how[1]
    if not picks:
        return np.empty((0,) + arr.shape[1:d] + (1,) + arr.shape[d + 1:], arr.dtype)
    return np.concatenate([np.take(arr[bi:bi + 1], [j], axis=d) for (bi, j), _ in picks])


def _stats(arr: np.ndarray) -> dict:
    if arr.size == 0:
        return dict.fromkeys(_STATS)
    if arr.dtype == np.bool_:
        return {"Max": bool(arr.max()), "Min": bool(arr.min()), "Mean": float(arr.mean()),
                "Norm": float(math.sqrt(arr.sum()))}
    a = arr.astype(np.float64)
    return {"Max": _num(a.max()), "Min": _num(a.min()), "Mean": _num(a.mean()),
            "Norm": _num(np.sqrt(np.sum(a * a)))}


def _num(x) -> Optional[float]:
    """A statistic for JSON: NaN and infinities, which JSON has not, as null."""
    x = float(x)
    return x if math.isfinite(x) else None


def _combine(rows: List[list]) -> dict:
    """The statistics of rows of equal size taken together, from each row's."""
    def col(j):
        return [float(r[j]) if isinstance(r[j], (int, float)) and not isinstance(r[j], bool) else math.nan
                for r in rows]
    if not rows:
        return dict.fromkeys(_STATS)
    mx, mn, mean, norm = col(0), col(1), col(2), col(3)
    return {"Max": _num(max(mx)), "Min": _num(min(mn)), "Mean": _num(sum(mean) / len(mean)),
            "Norm": _num(math.sqrt(sum(n * n for n in norm)))}


def _leaf_at(tree, path):
    for key in path:
        if isinstance(tree, list) and isinstance(key, int) and key < len(tree):
            tree = tree[key]
        elif isinstance(tree, dict) and isinstance(key, str) and key in tree:
            tree = tree[key]
        else:
            return None
    return tree


def _is_leaf(x) -> bool:
    return isinstance(x, dict) and isinstance(x.get("type"), str)


def _is_tensor(x) -> bool:
    return _is_leaf(x) and "shape" in x and "dtype" in x and isinstance(x.get("shape"), list)


class _Writer:
    """Writes one request's dump folder."""

    def __init__(self, side: Side, req: Request, limit: int, out_dir: str, docs: Optional[dict] = None,
                 unit_seq: bool = True):
        self.side, self.req, self.limit = side, req, limit
        self.unit_seq = unit_seq
        self.out_dir = out_dir
        self.data_dir = os.path.join(out_dir, DATA_DIR)
        self.loaded: Dict[int, dict] = docs if docs is not None else {}
        self.tensor = False
        self.gathered = Gathered(os.path.join(out_dir, "dump.json"), "statistics")
        self.counts: Dict[str, int] = {}

    def data(self, step: int) -> dict:
        if step not in self.loaded:
            path = self.side.layouts[step].json_path
            try:
                with open(path, "rb") as fh:
                    doc = orjson.loads(fh.read())
            except (OSError, orjson.JSONDecodeError) as exc:
                raise ConfigError(f"{path}: not readable as JSON ({exc})") from None
            data = doc.get("data") if isinstance(doc, dict) else None
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: no \"data\" object")
            self.loaded[step] = {"doc": doc, "data": data}
        return self.loaded[step]["data"]

    def file_for(self, key: str) -> str:
        """A file name of probe's own for a row (the row's name comes from the dump: never a
        path written to)."""
        name = f"t{len(self.gathered.files)}.npy"
        self.gathered.files[key] = name
        return name

    def name(self, original: str) -> str:
        """The entry's name in the request's dump: its API's calls numbered on across the
        merged steps, as they come."""
        for rx in _COUNTED:
            m = rx.match(original)
            if m:
                api = m.group("api")
                n = self.counts.get(api, 0)
                self.counts[api] = n + 1
                return f"{api}.{n}.{m.group('dir')}" if "dir" in rx.groupindex else f"{api}.{n}"
        n = self.counts.get(original, 0)
        self.counts[original] = n + 1
        return original if n == 0 else f"{original}.{n}"

    def run(self) -> Gathered:
        steps = [s for s in self.req.steps if self.side.layouts[s].request_rows(self.req.rid, self.limit)]
        os.makedirs(self.data_dir, exist_ok=True)
        out: Dict[str, Any] = {}
        first_doc: dict = {}
        if steps:
            self.data(steps[0])
            first_doc = self.loaded[steps[0]]["doc"]
        rows = {s: self.side.layouts[s].request_rows(self.req.rid, self.limit) for s in steps}
        for calls in merge_steps([(s, list(self.data(s))) for s in steps]):
            new = self.name(calls[0][1])
            entry = self.entry(new, [(s, self.data(s)[name]) for s, name in calls], rows)
            if entry is not None:
                out[new] = entry
                self.gathered.origin[new] = calls
        doc = {k: first_doc.get(k) for k in ("task", "level", "framework", "math_modes") if k in first_doc}
        doc["task"] = "tensor" if self.tensor else "statistics"
        doc["dump_data_dir"] = self.data_dir if self.tensor else None
        doc["data"] = out
        with open(self.gathered.json_path, "wb") as fh:
            fh.write(orjson.dumps(doc))
        self.gathered.mode = "tensor" if self.tensor else "statistics"
        return self.gathered

    def entry(self, new: str, entries: list, rows: dict) -> Optional[dict]:
        first = entries[0][1]
        if not isinstance(first, dict):
            return None
        sliced = [False]

        def walk(tree, path):
            if _is_tensor(tree):
                return self.leaf(new, path, entries, rows, sliced)
            if _is_leaf(tree) or tree is None:
                return tree
            if isinstance(tree, list):
                return [walk(x, path + (i,)) for i, x in enumerate(tree)]
            if isinstance(tree, dict):
                return {k: walk(v, path + (k,)) for k, v in tree.items()}
            return tree
        entry = {k: walk(v, (k,)) for k, v in first.items()}
        return entry if sliced[0] else None

    def leaf(self, new: str, path: tuple, entries: list, rows: dict, sliced: list):
        leaves = [(s, _leaf_at(e, path)) for s, e in entries]
        if not all(_is_tensor(x) for _, x in leaves):
            return None
        parts: list = []
        positions: List[int] = []
        at: List[int] = []
        for s, x in leaves:
            lay = self.side.layouts[s]
            tensor = bool(x.get("data_name"))
            got = row_picker(tuple(x["shape"]), lay, rows[s], tensor)
            if got is None:
                return self.whole(new, path, leaves)
            how, picks = got
            if tensor:
                data_dir = os.path.join(os.path.dirname(lay.json_path), DATA_DIR)
                try:
                    arr = load(resolve(data_dir, x["data_name"]))
                    part: Any = _take(arr, how, picks, len(lay.token_shape), self.unit_seq)
                except (OSError, ValueError, IndexError) as exc:
                    log.info("%s: rows of %s not gathered: %s", new, x.get("data_name"), exc)
                    return None
            else:
                ts = x.get("token_stats")
                if how != "token" or not isinstance(ts, list) or len(ts) != len(lay.rows):
                    return self.whole(new, path, leaves)
                part = [ts[f] if isinstance(ts[f], list) and len(ts[f]) == 4 else [None] * 4 for f, _ in picks]
            parts.append(part)
            positions += [p for _, p in picks]
            at += [s] * len(picks)
        order = sorted(range(len(positions)), key=positions.__getitem__)
        first = leaves[0][1]
        key = _row_name(new, path)
        self.gathered.positions[key] = [positions[i] for i in order]
        self.gathered.steps_at[key] = [at[i] for i in order]
        leaf = {"type": first["type"], "dtype": first["dtype"], "requires_grad": False}
        if isinstance(parts[0], np.ndarray):
            if len({p.shape[1:] for p in parts}) != 1:    # HF's decode reshapes GQA's query
                if len({math.prod(p.shape[1:]) for p in parts}) != 1:
                    return self.whole(new, path, leaves)
                parts = [p.reshape((len(p),) + parts[0].shape[1:]) for p in parts]
            arr = np.concatenate(parts)[order]
            name = self.file_for(key)
            np.save(os.path.join(self.data_dir, name), arr, allow_pickle=False)
            self.tensor = True
            leaf.update(shape=list(arr.shape), **_stats(arr), data_name=name)
        else:
            stat_rows = [r for p in parts for r in p]
            stat_rows = [stat_rows[i] for i in order]
            self.gathered.row_stats[key] = stat_rows
            k = len(self.side.layouts[leaves[0][0]].token_shape)
            rest_shape = ([1] if k == 2 and self.unit_seq else []) + list(first["shape"][k:])
            leaf.update(shape=[len(stat_rows)] + rest_shape, **_combine(stat_rows))
        sliced[0] = True
        return leaf

    def whole(self, new: str, path: tuple, leaves: list):
        """A tensor without token rows: an input kept when it is the same at every step (a
        weight), else null. An output without token rows is the batch's (a padding mask's
        sum), never the request's: null, even where the request has one step only."""
        def sig(x):
            return (tuple(x["shape"]), x.get("dtype"), *(x.get(k) for k in _STATS))
        if path[0] == "output" or len({sig(x) for _, x in leaves}) != 1:
            return None
        s, x = leaves[0]
        leaf = dict(x)
        leaf.pop("token_stats", None)
        if x.get("data_name"):
            data_dir = os.path.join(os.path.dirname(self.side.layouts[s].json_path), DATA_DIR)
            try:
                arr = load(resolve(data_dir, x["data_name"]))
            except (OSError, ValueError) as exc:
                log.info("%s: %s not read: %s", new, x.get("data_name"), exc)
                return None
            name = self.file_for(_row_name(new, path))
            np.save(os.path.join(self.data_dir, name), arr, allow_pickle=False)
            leaf["data_name"] = name
        return leaf


def _api(name: str) -> str:
    """An entry's name without its call counter: what lines up calls of two steps."""
    for rx in _COUNTED:
        m = rx.match(name)
        if m:
            return m.group("api") + ("." + m.group("dir") if "dir" in rx.groupindex else "")
    return name


def merge_steps(steps: List[Tuple[int, List[str]]]) -> List[List[Tuple[int, str]]]:
    """The calls of several steps as one sequence: each item the (step, entry name) of one call
    in each step that made it. Steps are lined up by their APIs in order (the longest common
    subsequence): the model's calls are found in every step, a call that only some steps make
    (HF's prefill builds the attention mask) stands alone, in its place."""
    merged: List[List[Tuple[int, str]]] = []
    for step, names in steps:
        if not merged:
            merged = [[(step, n)] for n in names]
            continue
        matcher = difflib.SequenceMatcher(None, [_api(c[0][1]) for c in merged], [_api(n) for n in names],
                                          autojunk=False)
        out: List[List[Tuple[int, str]]] = []
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                out += [c + [(step, n)] for c, n in zip(merged[i1:i2], names[j1:j2])]
            else:
                out += merged[i1:i2] + [[(step, n)] for n in names[j1:j2]]
        merged = out
    return merged


def _row_name(entry: str, path: tuple) -> str:
    """The row's name as the compare's rows name it (``entry.input.0``, ``entry.output.0``)."""
    head = {"input_args": "input", "input_kwargs": "input", "output": "output"}
    parts = [entry] + [head.get(str(path[0]), str(path[0]))] + [str(k) for k in path[1:]]
    return ".".join(parts)


def gather(side: Side, req: Request, limit: int, out_dir: str, docs: Optional[dict] = None,
           unit_seq: bool = True) -> Gathered:
    """Write ``req``'s rows of positions below ``limit`` as a dump in ``out_dir``. ``docs``:
    the side's dump.json files already parsed, by step (filled as they are read), so that
    the requests of one run read each step's file once. ``unit_seq`` False: a [batch, seq]
    step's rows as [n, ...], not [n, 1, ...] (compared with a run of flat token rows)."""
    return _Writer(side, req, limit, out_dir, docs, unit_seq).run()
