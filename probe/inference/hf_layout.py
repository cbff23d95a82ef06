"""The token layouts of HF ``generate``: which request and position each row of a forward is.

A forward's ``input_ids`` is ``[batch, seq]``: the whole (left-padded) prompts at the
prefill, one new token per row at each decode step (the whole sequence again without a
cache). HF keeps a batch's rows in place from the prefill to the end of ``generate``, so
batch row ``b`` of generate call ``c`` is one request, ``"g{c}r{b}"``; calls are numbered
from 0 across the debugger's life (a forward run outside ``generate`` on an empty cache
starts a call of its own), so request ids never repeat within a dump.

- **Positions** are the index of the token in its request's sequence: the running count of
  the row's attention mask (``cumsum - 1``: left padding does not count), else
  ``position_ids``, else ``cache_position``, else ``0..seq-1``. Padding (mask 0) is marked,
  position -1.
- **Produced tokens.** The token a step chose for each row is the last input id of that row
  at the batch's next forward, or the last column of ``generate``'s returned sequences after
  its last forward: the previous step's layout is completed then and rewritten.
- **Finished requests.** A row whose produced token is an end-of-sequence id is finished:
  ``generate`` goes on feeding it padding, which is marked as padding and produces nothing.
- **Prompts** are the prefill's non-padding input ids of each row, recorded in the prefill's
  layout (or in the first dumped step of the batch when the prefill is not dumped).

Beam search reorders rows between steps: the layout then follows batch rows, not beams
(said once).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import torch

from probe.inference.token_layout import StepLayout, TokenRow
from probe.log_once import LogOnce

log = logging.getLogger(__name__)
_said = LogOnce(log)


@dataclass
class ForwardInputs:
    """What one forward of the model was given (the kwargs ``generate`` passes)."""
    input_ids: Optional[torch.Tensor]
    attention_mask: Optional[torch.Tensor] = None
    position_ids: Optional[torch.Tensor] = None
    cache_position: Optional[torch.Tensor] = None
    inputs_embeds: Optional[torch.Tensor] = None
    past_length: Optional[int] = None     # tokens already in the cache, when known


@dataclass
class _Batch:
    """One generate call's batch, from its prefill on."""
    call: int
    requests: List[str]
    eos: Set[int]
    finished: List[bool]
    unrecorded_prompts: Dict[str, List[int]] = field(default_factory=dict)  # not yet in a dumped layout
    last_step: Optional[int] = None
    last_layout: Optional[StepLayout] = None


class HfLayouts:
    """Builds each forward's ``StepLayout`` and completes the previous one's produced tokens.

    ``forward`` returns the layout of the step (None when it is not dumped) and the earlier
    steps' layouts to rewrite (``(step, layout)``); ``end_call`` the latter.
    """

    def __init__(self):
        self.calls = 0                      # generate calls (and bare forward batches) so far
        self._batch: Optional[_Batch] = None
        self._in_call = False               # inside generate
        self._call_started = False          # generate's first forward seen
        self._eos: Set[int] = set()

    # ---- generate ------------------------------------------------------------
    def begin_call(self, eos: Set[int], beams: int = 1) -> List[Tuple[int, StepLayout]]:
        """A ``generate`` call starts: its first forward is a new batch's prefill."""
        rewrites = self._close_batch(None)
        self._in_call, self._call_started, self._eos = True, False, set(eos)
        if beams > 1:
            _said.warning("beams", "probe: beam search reorders the batch's rows between steps: "
                                   "the token layout follows batch rows, not beams")
        return rewrites

    def end_call(self, sequences: Optional[torch.Tensor]) -> List[Tuple[int, StepLayout]]:
        """``generate`` returned ``sequences`` (None: it raised): its last step's tokens."""
        self._in_call = False
        return self._close_batch(sequences)

    # ---- each forward --------------------------------------------------------
    def forward(self, step: int, dumped: bool, inputs: ForwardInputs
                ) -> Tuple[Optional[StepLayout], List[Tuple[int, StepLayout]]]:
        tokens, shape = _tokens(inputs)
        if shape is None:
            return None, []
        rewrites: List[Tuple[int, StepLayout]] = []
        batch = self._batch
        new = (batch is None or len(batch.requests) != shape[0]
               or (self._in_call and not self._call_started)
               or (not self._in_call and inputs.past_length == 0))
        if new or batch is None:
            rewrites = self._close_batch(None)
            batch = self._new_batch(shape[0])
        elif tokens is not None:
            if shape[1] > 1 and inputs.past_length:
                _said.warning("chunks", "probe: a forward of several new tokens per row after the prefill "
                                        "(chunked prefill, assisted decoding): the token layout takes the "
                                        "last one for the token the previous step produced")
            self._produced(batch, [row[-1] for row in tokens], rewrites)
        self._call_started = True
        positions, pads = _positions(inputs, shape)
        if new:
            for b, request in enumerate(batch.requests):
                toks = tokens[b] if tokens is not None else [-1] * shape[1]
                batch.unrecorded_prompts[request] = [t for t, p in zip(toks, pads[b]) if not p]
        layout = None
        if dumped:
            layout = self._layout(batch, shape, tokens, positions, pads)
        batch.last_step, batch.last_layout = step, layout
        return layout, rewrites

    # ---- internals -----------------------------------------------------------
    def _new_batch(self, rows: int) -> _Batch:
        call = self.calls
        self.calls += 1
        eos = set(self._eos) if self._in_call else set()   # a bare forward's batch knows none
        self._batch = _Batch(call, [f"g{call}r{b}" for b in range(rows)], eos, [False] * rows)
        return self._batch

    def _layout(self, batch, shape, tokens, positions, pads) -> StepLayout:
        rows = []
        for b, request in enumerate(batch.requests):
            done = batch.finished[b]
            toks = tokens[b] if tokens is not None else [-1] * shape[1]
            for tok, pos, pad in zip(toks, positions[b], pads[b]):
                if pad or done:
                    rows.append(TokenRow(request, -1, tok, True))
                else:
                    rows.append(TokenRow(request, pos, tok, False))
        prompts, batch.unrecorded_prompts = batch.unrecorded_prompts, {}
        return StepLayout("hf", tuple(shape), rows, prompts=prompts)

    def _produced(self, batch: _Batch, chosen: List[int], rewrites) -> None:
        """The previous step of ``batch`` chose ``chosen`` (one token per row)."""
        layout = batch.last_layout
        for b, tok in enumerate(chosen):
            if batch.finished[b]:
                continue
            if layout is not None:
                layout.produced[batch.requests[b]] = tok
            if tok in batch.eos:
                batch.finished[b] = True
        if layout is not None and batch.last_step is not None:
            rewrites.append((batch.last_step, layout))
        batch.last_layout = None

    def _close_batch(self, sequences) -> List[Tuple[int, StepLayout]]:
        batch, self._batch = self._batch, None
        rewrites: List[Tuple[int, StepLayout]] = []
        if batch is None or sequences is None:
            return rewrites
        if sequences.dim() == 2 and sequences.shape[0] == len(batch.requests) and sequences.shape[1]:
            self._produced(batch, sequences[:, -1].tolist(), rewrites)
        return rewrites


def _tokens(inputs: ForwardInputs):
    """(input ids as lists or None, [batch, seq] or None when the forward has no token rows)."""
    ids = inputs.input_ids
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return ids.tolist(), (ids.shape[0], ids.shape[1])
    embeds = inputs.inputs_embeds
    if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        return None, (embeds.shape[0], embeds.shape[1])
    if isinstance(ids, torch.Tensor) and ids.dim() == 1:   # one unbatched sequence
        return [ids.tolist()], (1, ids.shape[0])
    return None, None


def _positions(inputs: ForwardInputs, shape) -> Tuple[List[List[int]], List[List[bool]]]:
    """Each row's token positions and padding marks, [batch][seq]."""
    rows, seq = shape
    mask = inputs.attention_mask
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[0] == rows and mask.shape[1] >= seq:
        m = mask.to(torch.long)
        pos = (m.cumsum(-1) - 1)[:, -seq:]
        return pos.tolist(), (m[:, -seq:] == 0).tolist()
    pads = [[False] * seq for _ in range(rows)]
    pid = inputs.position_ids
    if isinstance(pid, torch.Tensor) and pid.dim() == 2 and pid.shape[1] == seq and pid.shape[0] in (1, rows):
        return pid.expand(rows, seq).tolist(), pads
    cp = inputs.cache_position
    if isinstance(cp, torch.Tensor) and cp.dim() == 1 and cp.shape[0] == seq:
        return [cp.tolist()] * rows, pads
    start = inputs.past_length or 0
    return [list(range(start, start + seq))] * rows, pads


def eos_ids(value) -> Set[int]:
    """End-of-sequence ids from a config value: an int, a list of ints, a tensor, or None."""
    if value is None:
        return set()
    if isinstance(value, torch.Tensor):
        value = value.reshape(-1).tolist()
    if isinstance(value, int):
        return {value}
    try:
        return {int(v) for v in value}
    except (TypeError, ValueError):
        return set()
