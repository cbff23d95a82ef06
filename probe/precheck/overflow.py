"""Find where Inf/NaN first appeared in an existing dump (probe's or msprobe's).

An entry is an overflow *origin* when one of its outputs holds Inf/NaN while none of its
inputs did; an entry whose inputs already held them only passes the overflow on. A
backward entry's inputs are the grads w.r.t. its outputs and, because e.g. log's gradient
divides by the forward input, also the forward call's inputs. Entries are scanned step by
step, rank by rank, forward entries in call order, then backward entries in call order.

A tensor holds Inf/NaN exactly when its recorded Max or Min is not finite (a NaN anywhere
makes the min/max NaN); Mean and Norm are not used, since they overflow on their own
for large finite values (msprobe's 1e38-scaled fixture has Norm = Infinity on finite
data). Without statistics the tensor file is read.
"""
from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from probe.compare import tensors as tensor_files
from probe.compare.reader import DumpMeta, read_dump
from probe.errors import ConfigError
from probe.vocabulary import MAX, MIN, forward_of

_FLOAT = ("float", "bfloat16", "half", "double", "complex")


@dataclass
class OverflowHit:
    entry: str
    phase: str
    dump_json: str
    tensors: list            # "output.0" etc. holding Inf/NaN
    kinds: list              # "NaN", "Inf" per tensor

    @property
    def where(self) -> str:
        rank_dir = os.path.dirname(self.dump_json)
        return os.path.join(os.path.basename(os.path.dirname(rank_dir)), os.path.basename(rank_dir))

    def __str__(self):
        parts = ", ".join(f"{t} ({k})" for t, k in zip(self.tensors, self.kinds))
        return f"{self.entry} [{self.where}]: {parts} from finite inputs"


@dataclass
class OverflowReport:
    hits: list = field(default_factory=list)      # origins, in scan order
    passed_on: list = field(default_factory=list)  # entries that only carried Inf/NaN on
    scanned: int = 0
    dumps: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    @property
    def first(self) -> OverflowHit | None:
        return self.hits[0] if self.hits else None


def dump_files(path: str) -> list:
    """dump.json files under ``path`` ordered by step number, then rank folder."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no such dump: {path}")
    if os.path.isfile(os.path.join(path, "dump.json")):
        return [os.path.join(path, "dump.json")]
    found = glob.glob(os.path.join(path, "*", "dump.json")) + glob.glob(os.path.join(path, "*", "*", "dump.json"))

    def key(p):
        parts = os.path.relpath(p, path).split(os.sep)
        nums = [int(m.group()) if (m := re.search(r"\d+", s)) else -1 for s in parts[:-1]]
        return nums, parts
    if not found:
        raise ConfigError(f"{path} holds no dump.json (looked in ./, */ and step*/rank*/)")
    return sorted(found, key=key)


def _tensor_state(desc, data_dir):
    """None if finite (or not a float tensor), else "NaN" / "Inf"."""
    dtype = str(desc.get("dtype", ""))
    if not any(f in dtype for f in _FLOAT):
        return None
    values = [desc.get(k) for k in (MAX, MIN)]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        if all(isinstance(v, int) or math.isfinite(v) for v in values):    # (an int of 400 digits is finite)
            return None
        return "NaN" if any(math.isnan(v) for v in values) else "Inf"
    name = desc.get("data_name")
    if name and data_dir:
        try:
            arr = tensor_files.load(tensor_files.resolve(data_dir, name))
        except (ValueError, OSError):
            return None
        arr = np.asarray(arr, dtype=np.float64)
        if np.isnan(arr).any():
            return "NaN"
        if np.isinf(arr).any():
            return "Inf"
    return None


def _scan(value, prefix, data_dir, out):
    """Append (label, state) for every non-finite tensor in a nested description."""
    if isinstance(value, list):
        for i, v in enumerate(value):
            _scan(v, f"{prefix}.{i}" if prefix else str(i), data_dir, out)
    elif isinstance(value, dict):
        if value.get("type") == "torch.Tensor":
            state = _tensor_state(value, data_dir)
            if state:
                out.append((prefix, state))
        elif "type" not in value:
            for k, v in value.items():
                _scan(v, f"{prefix}.{k}", data_dir, out)
    return out


def find_overflow(path: str, limit: int | None = None) -> OverflowReport:
    """Overflow origins in a dump (a dump.json, a rank folder or a dump root).

    ``limit``: stop after this many origins (None: all).
    """
    report = OverflowReport()
    for dump_json in dump_files(path):
        report.dumps.append(dump_json)
        folder = os.path.join(os.path.dirname(os.path.abspath(dump_json)), "dump_tensor_data")
        data_dir = folder if os.path.isdir(folder) else None
        meta = DumpMeta(dump_json)
        dirty_inputs = {}       # forward entry name -> its inputs held Inf/NaN
        backward = []
        for name, entry in read_dump(dump_json, meta):
            report.scanned += 1
            if not isinstance(entry, dict):
                continue
            if "input" in entry and "input_args" not in entry:
                backward.append((name, entry))
                continue
            ins = _scan([entry.get("input_args"), entry.get("input_kwargs"), entry.get("parameters")],
                        "", data_dir, [])
            dirty_inputs[name] = bool(ins)
            _judge(report, dump_json, name, "forward", bool(ins), entry.get("output"), "output", data_dir)
            if limit and len(report.hits) >= limit:
                return report
        for name, entry in backward:
            ins = _scan(entry.get("input"), "input", data_dir, [])
            fwd_dirty = dirty_inputs.get(forward_of(name), False)
            _judge(report, dump_json, name, "backward", bool(ins) or fwd_dirty, entry.get("output"),
                   "output", data_dir)
            if limit and len(report.hits) >= limit:
                return report
        report.problems.extend(meta.problems)
    return report


def _judge(report, dump_json, name, phase, inputs_dirty, outputs, label, data_dir):
    outs = _scan(outputs, label, data_dir, [])
    if not outs:
        return
    if inputs_dirty:
        report.passed_on.append(name)
        return
    report.hits.append(OverflowHit(name, phase, dump_json, [o[0] for o in outs], [o[1] for o in outs]))
