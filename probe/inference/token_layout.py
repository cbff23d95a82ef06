"""The token layout of one inference step: which request and position each token row is.

Written as ``token_layout.json`` next to the step's dump.json::

    {"source": "hf",                       # or "vllm": who recorded it
     "token_shape": [2, 5],                # the leading dims of the step's token tensors:
                                           # [batch, seq] for HF, [num_tokens] for vLLM
     "rows": [["r0", 0, 101, false], ...], # per token row, in the flattened order of
                                           # token_shape: request, position, input token id, padding
     "produced": {"r0": 307},              # the token the step chose for each request (if known)
     "prompts": {"r0": [101, 7, 9]}}       # the prompt of each request first seen in this step

Rows are lists, not objects: a prefill of thousands of tokens stays a small file. Padding rows
carry the request of their batch row and position -1. Requests are the run's own ids (vLLM's
request ids, HF's batch rows numbered across ``generate`` calls); the compare matches requests
of two runs by their prompts, never by id.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import orjson

from probe.errors import ConfigError

FILE_NAME = "token_layout.json"
SOURCES = ("hf", "vllm")


@dataclass(frozen=True)
class TokenRow:
    """One row of a step's token dimension."""
    request: str
    position: int       # the token's index in its request's sequence (prompt + generated); -1: padding
    token: int          # the input token id at this row
    pad: bool = False


@dataclass
class StepLayout:
    """What one inference step computed, row by row. ``rows`` follows ``token_shape`` flattened."""
    source: str
    token_shape: Tuple[int, ...]
    rows: List[TokenRow]
    produced: Dict[str, int] = field(default_factory=dict)
    prompts: Dict[str, List[int]] = field(default_factory=dict)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ConfigError(f"token layout: source {self.source!r}; allowed: {', '.join(SOURCES)}")
        if math.prod(self.token_shape) != len(self.rows):
            raise ConfigError(f"token layout: token_shape {list(self.token_shape)} holds "
                              f"{math.prod(self.token_shape)} rows, {len(self.rows)} given")

    def to_json(self) -> bytes:
        return orjson.dumps({"source": self.source, "token_shape": list(self.token_shape),
                             "rows": [[r.request, r.position, r.token, r.pad] for r in self.rows],
                             "produced": self.produced, "prompts": self.prompts})


def write_layout(rank_dir: str, layout: StepLayout) -> str:
    """Write ``layout`` into ``rank_dir`` (made if missing) under a temporary name, then rename:
    a reader never sees half a file. Returns the path."""
    path = os.path.join(rank_dir, FILE_NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    data = layout.to_json()
    try:
        f = open(tmp, "wb")
    except FileNotFoundError:   # the folder is made only when missing: a step's is there twice a step
        os.makedirs(rank_dir, exist_ok=True)
        f = open(tmp, "wb")
    with f:
        f.write(data)
    os.replace(tmp, path)
    return path
