"""The requests of an inference dump: its steps' token layouts read back, requests matched
across two runs by their prompts, and how far each pair of requests can be judged.

An inference step (``probe/inference/token_layout.py``) records which request and position
each token row is. Steps are never paired by number: batched and one-at-a-time runs, or two
schedulers, put other requests in a step. A request is found again in the other run by its
prompt token ids (exact), and its rows are then gathered from every step that holds them
(``request_dump.py``). Once the two runs generated another token for a request, its later
rows compute other inputs: only the positions before that are judged (``judged``).

``token_layout.json`` is untrusted input: each field is checked, and a bad file is a
``ConfigError`` naming it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import orjson

from probe.errors import ConfigError
from probe.inference.token_layout import FILE_NAME

from .dump_tree import find_dumps, order, rank_number, step_number


@dataclass
class Layout:
    """One step's ``token_layout.json``: rows as (request, position, token, pad) tuples."""
    step: int
    json_path: str                      # the step's dump.json
    source: str
    token_shape: Tuple[int, ...]
    rows: List[tuple]
    produced: Dict[str, int]
    prompts: Dict[str, List[int]]

    def request_rows(self, rid: str, limit: int | None = None) -> List[Tuple[int, int]]:
        """(flat row index, position) of ``rid``'s token rows here (padding left out), the
        positions below ``limit`` only when it is given."""
        return [(i, r[1]) for i, r in enumerate(self.rows)
                if r[0] == rid and not r[3] and (limit is None or r[1] < limit)]


@dataclass
class Request:
    """One request of one run, as its steps recorded it."""
    rid: str
    prompt: List[int]
    arrival: tuple                      # (first step, first row there): the run's order of arrival
    tokens: Dict[int, int] = field(default_factory=dict)     # position -> token id
    steps: List[int] = field(default_factory=list)
    fed: int = 0                        # the positions below this were fed to the model (have rows)

    def sequence(self) -> List[int]:
        """The prompt and the generated tokens, up to the first position not known."""
        out, p = [], 0
        while p in self.tokens:
            out.append(self.tokens[p])
            p += 1
        return out

    def generated(self) -> List[int]:
        return self.sequence()[len(self.prompt):]


@dataclass
class Side:
    """One run's inference steps of one rank, and its requests in order of arrival."""
    root: str
    rank: int
    layouts: Dict[int, Layout]
    requests: List[Request]


def is_inference_root(path: str) -> bool:
    """Whether a dump root's steps hold token layouts (an inference dump). A dump.json
    named alone is one pair, compared as such."""
    if not os.path.isdir(path):
        return False
    try:
        dumps = find_dumps(path)
    except FileNotFoundError:
        return False
    return any(os.path.isfile(os.path.join(os.path.dirname(p), FILE_NAME)) for p in dumps.values())


def _bad(path: str, what: str) -> ConfigError:
    return ConfigError(f"{path}: {what}")


def read_layout(path: str, step: int, json_path: str) -> Layout:
    """One ``token_layout.json``, every field checked."""
    try:
        with open(path, "rb") as fh:
            doc = orjson.loads(fh.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise _bad(path, f"not readable as JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise _bad(path, "not a JSON object")
    shape = doc.get("token_shape")
    if not isinstance(shape, list) or not shape or not all(type(n) is int and n >= 0 for n in shape):
        raise _bad(path, f"token_shape {shape!r}: a list of sizes expected")
    rows = doc.get("rows")
    if not isinstance(rows, list) or len(rows) != math.prod(shape):
        raise _bad(path, f"rows: a list of {math.prod(shape)} rows (token_shape {shape}) expected")
    out = []
    for k, r in enumerate(rows):
        if not (isinstance(r, list) and len(r) == 4 and isinstance(r[0], str) and type(r[1]) is int
                and type(r[2]) is int and type(r[3]) is bool):
            raise _bad(path, f"rows[{k}] {r!r}: [request, position, token, pad] expected")
        out.append(tuple(r))
    produced = doc.get("produced") or {}
    prompts = doc.get("prompts") or {}
    if not isinstance(produced, dict) or not all(isinstance(k, str) and type(v) is int for k, v in produced.items()):
        raise _bad(path, "produced: {request: token id} expected")
    if not isinstance(prompts, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(type(t) is int for t in v) for k, v in prompts.items()):
        raise _bad(path, "prompts: {request: [token ids]} expected")
    return Layout(step, json_path, str(doc.get("source")), tuple(shape), out, produced, prompts)


def read_sides(root: str) -> Dict[int, Side]:
    """{rank: Side} of an inference dump root; steps without a layout are left out."""
    by_rank: Dict[int, Dict[int, Layout]] = {}
    dumps = find_dumps(root)
    for key in sorted(dumps, key=order):
        lp = os.path.join(os.path.dirname(dumps[key]), FILE_NAME)
        if os.path.isfile(lp):
            step = step_number(key)
            by_rank.setdefault(rank_number(key), {})[step] = read_layout(lp, step, dumps[key])
    return {rank: Side(root, rank, layouts, _requests(layouts)) for rank, layouts in by_rank.items()}


def _requests(layouts: Dict[int, Layout]) -> List[Request]:
    found: Dict[str, Request] = {}
    for step in sorted(layouts):
        lay = layouts[step]
        last: Dict[str, int] = {}
        for k, (rid, pos, tok, pad) in enumerate(lay.rows):
            if pad:
                continue
            req = found.get(rid)
            if req is None:
                req = found[rid] = Request(rid, [], (step, k))
            if not req.steps or req.steps[-1] != step:
                req.steps.append(step)
            req.tokens.setdefault(pos, tok)
            req.fed = max(req.fed, pos + 1)
            last[rid] = max(pos, last.get(rid, -1))
        for rid, prompt in lay.prompts.items():
            if rid in found and not found[rid].prompt:
                found[rid].prompt = list(prompt)
        for rid, tok in lay.produced.items():
            if rid in last:
                found[rid].tokens.setdefault(last[rid] + 1, tok)
    for req in found.values():
        if not req.prompt:       # no step named it: the tokens before its first produced one
            req.prompt = req.sequence()
    return sorted(found.values(), key=lambda r: r.arrival)


@dataclass
class Pair:
    """A request of the NPU run and the bench request with the same prompt."""
    number: int                         # the NPU request's place in its run's order of arrival
    npu: Request
    bench: Request

    def judged(self) -> int:
        """The positions below this are judged: those whose input tokens (and all before them)
        are the same in both runs. The row at the last of them produced the first token that
        differs, so it is judged; the rows after it computed other inputs."""
        a, b = self.npu.sequence(), self.bench.sequence()
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        # a run that generated more tokens fed more positions: those have no row on the other side
        return min(n, self.npu.fed, self.bench.fed)

    def first_differing_token(self) -> Optional[int]:
        """Index into the generated tokens of the first one that differs, or None."""
        a, b = self.npu.generated(), self.bench.generated()
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return i
        return None


def match(npu: List[Request], bench: List[Request]) -> Tuple[List[Pair], List[Request], List[Request]]:
    """Pairs by exact prompt (a prompt given twice pairs in order of arrival), and the
    requests of each run left without one."""
    free: Dict[tuple, List[Request]] = {}
    for r in bench:
        free.setdefault(tuple(r.prompt), []).append(r)
    pairs, lone = [], []
    for k, r in enumerate(npu):
        cands = free.get(tuple(r.prompt))
        if cands:
            pairs.append(Pair(k, r, cands.pop(0)))
        else:
            lone.append(r)
    used = {id(p.bench) for p in pairs}
    return pairs, lone, [r for r in bench if id(r) not in used]
