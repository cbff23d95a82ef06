"""The layer mapping: which module rows of a served run are which rows of the reference.

A vLLM run and a transformers run of the same weights share no API call by name (vLLM's
``_C.onednn_mm`` against ``Functional.linear``, its paged attention against SDPA), and not
every module either: vLLM fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``,
and its norms add the residual themselves (``RMSNorm(x, residual)`` returns the normed
tensor and the residual stream), so a vLLM decoder layer outputs (MLP output, residual)
where transformers' outputs their sum. Where the two models compute the same tensor, a
module's row names it on both sides; this file says which, as msprobe's ``layer_mapping``
(``-lm``) says which cells of a MindSpore model are which modules of a PyTorch one.

One rule a line, the NPU side's row, then the bench's::

    model.layers.*.self_attn.output.0: model.layers.*.self_attn.output.0
    model.layers.*.input_layernorm.output.1: model.layers.*.input_layernorm.input.0   # the residual stream
    logits_processor.output.0: lm_head.output.0
    model.layers.*.mlp: model.layers.*.mlp     # a module alone: every row both sides have

A row is a module's path from the model's root (as mix level names it, without its class:
``Module.model.layers.0.mlp.LlamaMLP.forward.0`` is ``model.layers.0.mlp``), then
``input.N`` (an argument), ``input.NAME`` (a keyword argument) or ``output.N``. ``*`` matches
one part of a path (a layer number); the k-th ``*`` of a key is the k-th of its value.

With a mapping, a request's compare holds the mapped rows only, each pair under the bench's
module name (``Module.model.layers.0.mlp.forward.0``): the rows the file names are the calls
compared, in the NPU run's order, with the same diagnosis rules. JSON, or YAML when the name
does not end in ``.json``; a bad file is one ``ConfigError`` line naming the file and key.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from probe.errors import ConfigError
from probe.untrusted import read_rules_file

log = logging.getLogger(__name__)

_MODULE_ENTRY = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward)\.(?P<n>\d+)$")
_PART = re.compile(r"^[A-Za-z0-9_]+$|^\*$")
ALLOWED = "a module path (dotted, * for one part), optionally then input.N, input.NAME or output.N"


@dataclass(frozen=True)
class Side:
    """One side of a rule: a module path pattern and a row of it (None: every row)."""
    module: str
    slot: Optional[str]                  # "input.0", "input.hidden_states", "output.1", or None

    def regex(self):
        parts = [r"([^.]+)" if p == "*" else re.escape(p) for p in self.module.split(".")]
        return re.compile(r"^" + r"\.".join(parts) + r"$")

    def fill(self, binds: Tuple[str, ...]) -> str:
        it = iter(binds)
        return ".".join(next(it) if p == "*" else p for p in self.module.split("."))


@dataclass(frozen=True)
class Rule:
    npu: Side
    bench: Side


@dataclass(frozen=True)
class LayerMapping:
    """The rules of one file, in file order (plain data)."""
    path: str
    rules: Tuple[Rule, ...]


def _side(path: str, key: str, text: str) -> Side:
    parts = text.strip().split(".")
    slot = None
    if len(parts) >= 3 and parts[-2] in ("input", "output") and (parts[-2] == "input" or parts[-1].isdigit()):
        slot = ".".join(parts[-2:])
        parts = parts[:-2]
    if not parts or not all(_PART.match(p) for p in parts):
        raise ConfigError(f"layer mapping {path}: {key!r}: {text!r} is not {ALLOWED}")
    return Side(".".join(parts), slot)


def parse_mapping(doc, path: str = "<layer mapping>") -> LayerMapping:
    """Rules from an already parsed document (a mapping NPU row -> bench row)."""
    if not isinstance(doc, dict) or not doc:
        got = "an empty mapping" if isinstance(doc, dict) else f"a {type(doc).__name__}"
        raise ConfigError(f"layer mapping {path}: expected a mapping of the NPU run's rows to the bench's "
                          f"({ALLOWED}), got {got}")
    rules = []
    for key, value in doc.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"layer mapping {path}: {key!r}: {value!r}: both must be strings ({ALLOWED})")
        npu, bench = _side(path, key, key), _side(path, key, value)
        if (npu.slot is None) != (bench.slot is None):
            raise ConfigError(f"layer mapping {path}: {key!r}: {value!r}: a row maps to a row, a module to a module")
        if npu.module.split(".").count("*") != bench.module.split(".").count("*"):
            raise ConfigError(f"layer mapping {path}: {key!r}: {value!r}: the two sides need as many *")
        rules.append(Rule(npu, bench))
    return LayerMapping(path, tuple(rules))


def load_mapping(path: str) -> LayerMapping:
    """The validated rules of ``path``; ConfigError (one line) for anything else."""
    return parse_mapping(read_rules_file(path, "layer mapping"), path)


def _slots(entry: dict) -> List[Tuple[str, object]]:
    """(slot, leaf) of an entry's top-level inputs and outputs."""
    out: List[Tuple[str, object]] = []
    for i, x in enumerate(entry.get("input_args") or []):
        out.append((f"input.{i}", x))
    for k, x in (entry.get("input_kwargs") or {}).items():
        out.append((f"input.{k}", x))
    outputs = entry.get("output")
    if isinstance(outputs, dict):
        outputs = [outputs]
    for i, x in enumerate(outputs or []):
        out.append((f"output.{i}", x))
    return out


def _put(entry: dict, slot: str, leaf) -> None:
    io, arg = slot.split(".", 1)
    if io == "output":
        lst = entry.setdefault("output", [])
    elif arg.isdigit():
        lst = entry.setdefault("input_args", [])
    else:
        entry.setdefault("input_kwargs", {})[arg] = leaf
        return
    i = int(arg)
    lst.extend([None] * (i + 1 - len(lst)))
    lst[i] = leaf


@dataclass
class Projected:
    """A side's dump of the mapped rows: entries under the bench's names, and for each of its
    rows the source row (``entry.output.1``) it was taken from."""
    data: Dict[str, dict]
    source_row: Dict[str, str]
    source_entry: Dict[str, str]

    def inputless(self) -> List[str]:
        """Entries with an output mapped and no input: judged as if their inputs agreed."""
        return [n for n, e in self.data.items() if e.get("output") and not e.get("input_args") and not e.get("input_kwargs")]


def project(data: Dict[str, dict], mapping: LayerMapping, side: str) -> Projected:
    """The rows of ``data`` (one side's dump entries) that the mapping names, under the bench's
    module names. ``side``: "npu" (rules read from key to value) or "bench" (the values)."""
    out: Dict[str, dict] = {}
    source_row: Dict[str, str] = {}
    source_entry: Dict[str, str] = {}
    compiled = [(r, (r.npu if side == "npu" else r.bench).regex()) for r in mapping.rules]
    for name, entry in data.items():
        m = _MODULE_ENTRY.match(name)
        if m is None or not isinstance(entry, dict):
            continue
        slots = dict(_slots(entry))
        for rule, rx in compiled:
            own = rule.npu if side == "npu" else rule.bench
            hit = rx.match(m.group("path"))
            if hit is None:
                continue
            target = f"Module.{rule.bench.fill(hit.groups())}.forward.{m.group('n')}"
            pairs = [(own.slot, rule.bench.slot)] if own.slot is not None else [(s, s) for s in slots]
            for src, dst in pairs:
                leaf = slots.get(src or "")
                if not isinstance(leaf, dict):
                    continue
                new = out.setdefault(target, {})
                _put(new, dst or "", leaf)
                source_row[f"{target}.{dst}"] = f"{name}.{src}"
                source_entry.setdefault(target, name)
    return Projected(out, source_row, source_entry)
