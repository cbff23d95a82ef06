"""The layout file: how plain tensors of a tensor-parallel run are split across its ranks.

A DTensor's entry records its layout (``placements``, ``global_offset``: see
probe/dump/dtensor_layout.py). Megatron-style code shards plain tensors by hand, and its
dump holds each rank's local shape and nothing more: which dimension was split is known
only to the code. This file says it, per row name (entry name + ``.input.N`` /
``.output.N`` / ``.parameters.NAME``, as the compare's rows are named), with glob patterns
(``*``, ``?``, ``[01]``); the first pattern that matches a row wins, in file order:

    {"Functional.linear.0.forward.output.0": {"shard_dim": 1},     # concatenated along dim 1, rank order
     "Functional.linear.*.backward.output.0": {"partial": "sum"},  # each rank holds a term of a sum
     "Functional.dropout.*": {"replicate": true},                  # every rank holds the whole
     "Functional.linear.*.backward.input.0": {"shard_dim": 0, "scale": 0.5}}   # and times 0.5

``scale`` (with any of the three) multiplies the merged tensor of a float row: in data
parallelism with a mean loss, a rank's activation gradients are the world size times the
one device's (each rank's loss is the mean over its own rows, the one device's over all).

JSON, or YAML when the name does not end in ``.json``. A recorded DTensor layout is the
truth and is never overridden by a rule. A bad file is one ``ConfigError`` line naming the
file, the key and the value, before any compare starts.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import logging
import math
import re
from dataclasses import dataclass

from probe.errors import ConfigError
from probe.untrusted import read_rules_file

log = logging.getLogger(__name__)

REDUCE_OPS = ("sum", "avg", "max", "min")     # Partial's reductions (torch's Partial(reduce_op))
ALLOWED = ('{"shard_dim": <int>}, {"partial": "sum"|"avg"|"max"|"min"} or {"replicate": true}, '
           'each with an optional "scale": <number>')


@dataclass(frozen=True)
class LayoutRule:
    """One pattern of the file and the layout it gives the rows it matches."""
    pattern: str
    kind: str                    # "shard", "partial" or "replicate"
    shard_dim: int | None = None
    reduce: str | None = None    # Partial's reduction
    scale: float = 1.0           # the merged tensor multiplied by it (float rows)

    def matches(self, row_name: str) -> bool:
        return self._regex().match(row_name) is not None

    def _regex(self):
        return _compiled(self.pattern)


_PATTERNS: dict = {}


def _compiled(pattern: str):
    """fnmatch's translation, compiled once per pattern (case-sensitive on every platform)."""
    regex = _PATTERNS.get(pattern)
    if regex is None:
        regex = _PATTERNS[pattern] = re.compile(fnmatch.translate(pattern))
    return regex


@dataclass(frozen=True)
class LayoutRules:
    """The rules of one file, in file order (plain data: sent to worker processes as is)."""
    path: str
    rules: tuple = ()

    def find(self, row_name: str) -> LayoutRule | None:
        for rule in self.rules:
            if rule.matches(row_name):
                return rule
        return None


def load_layout_file(path: str) -> LayoutRules:
    """The validated rules of ``path``; ConfigError (one line) for anything else."""
    return parse_layout(read_rules_file(path, "layout file"), path)


def parse_layout(doc, path: str = "<layout>") -> LayoutRules:
    """Rules from an already parsed document (a mapping pattern -> layout)."""
    if not isinstance(doc, dict) or not doc:
        got = "an empty mapping" if isinstance(doc, dict) else f"a {type(doc).__name__}"
        raise ConfigError(f"layout file {path}: expected a mapping of row-name patterns to layouts "
                          f"({ALLOWED}), got {got}")
    rules = []
    for key, value in doc.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"layout file {path}: key {key!r}: a row-name pattern must be a non-empty string")
        rules.append(_rule(path, key, value))
    log.debug("layout file %s: %d rule(s)", path, len(rules))
    return LayoutRules(path, tuple(rules))


def _rule(path: str, key: str, value) -> LayoutRule:
    where = f"layout file {path}: key {key!r}"
    if not isinstance(value, dict) or len(value) != 1 + ("scale" in value):
        raise ConfigError(f"{where}: value {value!r} must be exactly one of {ALLOWED}")
    layout = {k: v for k, v in value.items() if k != "scale"}
    scale = value.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
        raise ConfigError(f"{where}: scale {scale!r} must be a finite non-zero number")
    rule = _layout_rule(where, key, layout)
    return dataclasses.replace(rule, scale=float(scale)) if scale != 1 else rule


def _layout_rule(where: str, key: str, layout: dict) -> LayoutRule:
    (name, arg), = layout.items()
    if name == "shard_dim":
        if not isinstance(arg, int) or isinstance(arg, bool):
            raise ConfigError(f"{where}: shard_dim {arg!r} must be an integer (a dimension, negative from the end)")
        return LayoutRule(key, "shard", shard_dim=arg)
    if name == "partial":
        if arg not in REDUCE_OPS:
            raise ConfigError(f"{where}: partial {arg!r} must be one of {', '.join(REDUCE_OPS)}")
        return LayoutRule(key, "partial", reduce=arg)
    if name == "replicate":
        if arg is not True:
            raise ConfigError(f"{where}: replicate {arg!r} must be true")
        return LayoutRule(key, "replicate")
    raise ConfigError(f"{where}: unknown layout {name!r}; allowed: {ALLOWED}")
