"""Find dump.json files: a dump.json, a rank dir, a step dir or a dump root; pair ranks."""
from __future__ import annotations

import os
import re

from probe.untrusted import open_file

_RANK = re.compile(r"^(rank|proc)(\d*)$")
_STEP = re.compile(r"^step(\d+)$")


def rank_id(dirname: str):
    """'rank3' -> '3', 'rank' -> '', 'proc123' -> 'proc123' (a pid, not a rank); else None."""
    m = _RANK.match(dirname)
    if not m:
        return None
    return m.group(2) if m.group(1) == "rank" else ""


def find_dumps(path: str) -> dict:
    """{(step, rank): dump.json path} below ``path`` (a file, rank dir, step dir or root)."""
    if os.path.isfile(path):
        return {("", ""): path}
    if os.path.lexists(path) and not os.path.isdir(path):
        open_file(path).close()           # a FIFO, a device: DumpError, one line saying which
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such dump: {path}")
    if os.path.isfile(os.path.join(path, "dump.json")):
        return {("", ""): os.path.join(path, "dump.json")}
    found = {}
    steps = [d for d in sorted(os.listdir(path)) if _STEP.match(d)]
    step_dirs = [(d, os.path.join(path, d)) for d in steps] or [("", path)]
    for step, sdir in step_dirs:
        for d in sorted(os.listdir(sdir)):
            rid = rank_id(d)
            jp = os.path.join(sdir, d, "dump.json")
            if rid is not None and os.path.isfile(jp):
                found[(step, rid)] = jp
    if not found:
        raise FileNotFoundError(f"no dump.json under {path} (expected step*/rank*/dump.json)")
    return found


def pair_dumps(npu_path: str, bench_path: str):
    """[(key, npu_json, bench_json)] for the keys both sides have, and the unpaired
    [(side, key)] with side "npu" or "bench".

    A single dump on each side pairs regardless of names (proc<pid> differs per run).
    """
    npu, bench = find_dumps(npu_path), find_dumps(bench_path)
    if len(npu) == 1 and len(bench) == 1:
        (k, a), (_, b) = next(iter(npu.items())), next(iter(bench.items()))
        return [(k, a, b)], []
    pairs = [(k, npu[k], bench[k]) for k in sorted(npu, key=order) if k in bench]
    unpaired = [("npu", k) for k in sorted(npu, key=order) if k not in bench] + \
               [("bench", k) for k in sorted(bench, key=order) if k not in npu]
    return pairs, unpaired


def step_number(key) -> int:
    """The step of a key as a number ("step12" -> 12; a tree without step dirs -> 0)."""
    m = _STEP.match(key[0] or "")
    return int(m.group(1)) if m else 0


def rank_number(key) -> int:
    """The rank of a key as a number ("3" -> 3; a "rank" or procN dir -> 0)."""
    return int(key[1]) if key[1] and key[1].isdigit() else 0


def order(key) -> tuple:
    """Numeric order: step2 before step10, rank2 before rank10."""
    return step_number(key), rank_number(key), key


def label(key) -> str:
    """What a person reads: "step1/rank0", "rank1", "step1/rank" (never empty)."""
    step, rank = key
    parts = [step] if step else []
    parts.append(f"rank{rank}")
    return "/".join(parts)


def tag_for(key) -> str:
    step, rank = key
    parts = []
    if step:
        parts.append(step)
    if rank:
        parts.append(f"rank{rank}")
    return "_".join(parts)


def step_of(json_path: str) -> int | None:
    """The step of ``{root}/step{N}/{rank dir}/dump.json``, or None when the path has none."""
    parent = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(json_path))))
    m = _STEP.match(parent)
    return int(m.group(1)) if m else None
