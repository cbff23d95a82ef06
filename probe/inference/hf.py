"""HF models under ``PrecisionDebugger(..., inference=True)``: each forward of the model is a step.

The user calls ``start(model)`` once, ``model.generate()`` any number of times, then
``stop()``. ``start`` only installs this hook: a forward pre-hook on the model (first
among its pre-hooks) opens a step, its forward hook (``always_call``: also when the
forward raises) ends it, so what ``generate`` does between forwards (the argmax, the cache
and mask updates) is not dumped and each dumped step is exactly one forward. Steps are
numbered on across ``generate`` calls; the config's ``step`` filters them as in training.

Each forward's token layout (``hf_layout``) is given to the debugger at the start of the
step, so its per-token statistics can be taken. ``model.generate`` is wrapped (an instance
attribute, removed at ``stop()``) to learn the end-of-sequence ids of each call and the
tokens its last forward chose, which no later forward shows.

A failure in this bookkeeping is said once and never reaches ``generate``.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, List, Optional

import torch

from probe.inference.hf_layout import ForwardInputs, HfLayouts, eos_ids
from probe.log_once import LogOnce

log = logging.getLogger(__name__)


class HfGenerateHook:
    """The hooks of one debugger on the model given to ``start(model)``.

    ``begin``/``end`` open and end one dumped step (the debugger's step machinery);
    ``set_layout`` is ``PrecisionDebugger.set_step_layout``; ``current_step`` and
    ``wants_step`` read the debugger's step number and step filter.
    """

    def __init__(self, begin: Callable[[], None], end: Callable[[], None],
                 set_layout: Callable[..., None], current_step: Callable[[], int],
                 wants_step: Callable[[int], bool]):
        self._begin, self._end = begin, end
        self._set_layout = set_layout
        self._current_step, self._wants_step = current_step, wants_step
        self.layouts = HfLayouts()        # kept across start/stop: request ids stay unique
        self._model: Any = None
        self._handles: List[Any] = []
        self._generate: Optional[Callable] = None   # the wrapper installed on the model
        self._previous: Optional[Callable] = None   # the model's own instance attribute it replaced
        self._depth = 0                   # forwards of the model under way (a nested one is part of its caller's step)
        self._generating = False
        self._said = LogOnce(log)

    @property
    def attached(self) -> bool:
        return self._model is not None

    def attach(self, model) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"inference: start(model) needs a torch.nn.Module, got {type(model).__name__}")
        self._model = model
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=True),
                         model.register_forward_hook(self._post, with_kwargs=True, always_call=True)]
        original = getattr(model, "generate", None)
        if callable(original):
            self._previous = model.__dict__.get("generate")   # another tool's instance attribute, kept
            self._generate = self._wrap(original)
            model.__dict__["generate"] = self._generate

    def detach(self) -> None:
        """Remove the hooks and the wrapper; a step still open (a forward that never
        returned) is ended."""
        for h in self._handles:
            h.remove()
        self._handles = []
        model, self._model = self._model, None
        if model is not None and self._generate is not None and model.__dict__.get("generate") is self._generate:
            if self._previous is None:
                del model.__dict__["generate"]
            else:
                model.__dict__["generate"] = self._previous
        self._generate = self._previous = None
        if self._depth:
            self._depth = 0
            self._end()
        self._rewrite(self.layouts.end_call(None))

    # ---- the forward hooks ----------------------------------------------------
    def _pre(self, module, args, kwargs):
        self._depth += 1
        if self._depth > 1:
            return None
        step = self._current_step()
        layout = None
        try:
            layout, rewrites = self.layouts.forward(step, self._wants_step(step), _inputs(args, kwargs))
            self._rewrite(rewrites)
        except Exception as exc:   # never into the user's forward
            self._fail(exc)
        self._begin()
        if layout is not None:
            self._set_layout(layout)
        return None

    def _post(self, module, args, kwargs, output):
        if not self._depth:      # a forward that began before attach()
            return None
        self._depth -= 1
        if self._depth == 0:
            self._end()
        return None

    # ---- generate ---------------------------------------------------------------
    def _wrap(self, original):
        hook = self

        @functools.wraps(original)
        def generate(*args, **kwargs):
            if hook._generating:            # generate inside generate: one call
                return original(*args, **kwargs)
            hook._generating = True
            out = None
            try:
                hook._guarded(lambda: hook.layouts.begin_call(*_call_settings(hook._model, kwargs)))
                out = original(*args, **kwargs)
            finally:
                hook._generating = False
                result = out
                hook._guarded(lambda: hook.layouts.end_call(_sequences(result)))
            return out
        return generate

    def _guarded(self, work) -> None:
        try:
            self._rewrite(work())
        except Exception as exc:
            self._fail(exc)

    def _rewrite(self, rewrites) -> None:
        for step, layout in rewrites:
            self._set_layout(layout, step=step)

    def _fail(self, exc) -> None:
        self._said.warning("layout", "probe: recording the token layout failed (%s: %s); "
                                     "generation is unaffected", type(exc).__name__, exc)


def _inputs(args, kwargs) -> ForwardInputs:
    ids = kwargs.get("input_ids", args[0] if args else None)
    mask = kwargs.get("attention_mask")
    cache_position = kwargs.get("cache_position")
    seq = None
    for t in (ids, kwargs.get("inputs_embeds")):
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            seq = t.shape[1]
            break
    past = None
    if isinstance(cache_position, torch.Tensor) and cache_position.numel():
        past = int(cache_position.reshape(-1)[0])
    elif isinstance(mask, torch.Tensor) and mask.dim() == 2 and seq is not None:
        past = mask.shape[1] - seq
    else:
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        length = getattr(cache, "get_seq_length", None)
        past = int(length()) if callable(length) else (0 if cache is None else None)
    return ForwardInputs(ids, mask, kwargs.get("position_ids"), cache_position,
                         kwargs.get("inputs_embeds"), past)


def _call_settings(model, kwargs):
    """(end-of-sequence ids, beams) of a generate call: its arguments, else the model's
    generation config."""
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    eos = kwargs["eos_token_id"] if "eos_token_id" in kwargs else getattr(config, "eos_token_id", None)
    beams = kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
    return eos_ids(eos), int(beams)


def _sequences(out) -> Optional[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return out
    seqs = getattr(out, "sequences", None)
    return seqs if isinstance(seqs, torch.Tensor) else None
