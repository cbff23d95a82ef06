"""Draw replay: a bench run takes the NPU run's random draws, call by call.

Two runs of a model with dropout never compare: each device draws its own masks, so
every call after the first dropout differs and the compare names the dropout. Here the
NPU side records each random call's draw next to its dump (in every task, statistics
included), and a bench run given ``random_from=NPU_DUMP_ROOT`` makes each random call
return the NPU's draw for the same call (same step, rank folder, entry name and shape):

* dropout family (``DROPOUT_ARGS``: F.dropout/1d/2d/3d, alpha_dropout,
  feature_alpha_dropout, torch.dropout, torch.native_dropout) in training with 0 < p < 1:
  the NPU's mask is applied to the bench's own input, by the bench's own kernel (its
  draw is replaced by the mask, below autograd), so the result and the gradient are
  bitwise what torch computes for that mask;
* every other API of ``RANDOM`` whose output is the draw (rand, randn, randint,
  randperm, bernoulli(_), multinomial, normal(_), uniform_, exponential_, ...): the
  NPU's values, converted to the dtype and device the bench's call asked for.

The bench's generators move on as torch leaves them after the real call (the real draw
is made and then replaced), so code outside ``start()``/``stop()`` draws as it would.

A call that does not fit (another call sequence, another shape or p) raises one
:class:`~probe.errors.DrawMismatch` naming the call, the step and what differs: this is
raised into the user's script, because the user asked for an exact replay and a run that
goes on with its own draws would compare as a false culprit. Draws that cannot be taken
are said once in the log, on both sides, with what to do instead: a fused attention's
internal dropout (``scaled_dot_product_attention`` with ``dropout_p > 0``,
``multi_head_attention_forward`` in training), and APIs whose draw happens inside their
own computation (``gumbel_softmax``, ``rrelu`` in training).

The handler sits first in the interceptor's chain (``DrawHandler(forensics -> collector)``),
so it sees every registered call at every level and task; it counts the calls of random
APIs per step as the collector names entries. It runs only while a step is dumped, so
draws respect the ``step``/``rank`` filters; ``list``/``scope``/``data_mode`` do not apply
(the bench needs every draw). Recording never alters the result the user gets and never
raises into training: a failure is logged once and the call goes on.

Limits: random calls inside a compiled graph, or inside another registered API (only the
outermost call is seen), are neither recorded nor replayed; at level L2 the kernel entry
of the draw itself (``aten.bernoulli_`` inside a CPU dropout) shows the bench's own draw,
the kernels after it the NPU's.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from probe.dump import draw_files as files
from probe.dump.draw_files import MASK, VALUES, DrawRecord
from probe.dump.modules import OwnWork
from probe.errors import ConfigError, DrawMismatch
from probe.log_once import LogOnce
from probe.precheck.entries import DROPOUT_ARGS, RANDOM

log = logging.getLogger(__name__)

# Recording is on for every dump; bench/draws.py turns it off to measure what it costs.
RECORD = True

FUSED = "fused"     # random only through a dropout_p, drawn inside a fused attention kernel
INSIDE = "inside"   # draws inside its own computation: its output is not the draw
_INSIDE = frozenset({"gumbel_softmax", "rrelu", "rrelu_"})
# leaf -> (dropout_p position, training position or None, default training)
_FUSED = {"scaled_dot_product_attention": (4, None, True),
          "multi_head_attention_forward": (10, 13, True)}
# leaf -> training position (rrelu is random only in training; gumbel_softmax always)
_INSIDE_TRAINING = {"rrelu": 3, "rrelu_": 3}
_ALPHA = frozenset({"alpha_dropout", "feature_alpha_dropout"})


def kind_of(leaf: str) -> Optional[str]:
    """What a registered API named ``leaf`` draws: MASK, VALUES, INSIDE, FUSED or None."""
    if leaf in DROPOUT_ARGS:
        return MASK
    if leaf in _INSIDE:
        return INSIDE
    if leaf in RANDOM:
        return VALUES
    if leaf in _FUSED:
        return FUSED
    return None


class _Kinds(dict):
    """API name ("Functional.dropout") -> kind, decided once per name: the handler looks
    every registered call up with one subscript."""

    def __missing__(self, name):
        kind = self[name] = kind_of(name.rsplit(".", 1)[-1])
        return kind


def _arg(args, kwargs, pos, key, default):
    if len(args) > pos:
        return args[pos]
    return kwargs.get(key, default)


class _Dropout:
    """A dropout call that draws: its input, p, how to redo it, and (``prepare``, before
    the call) the generator state it starts from."""
    __slots__ = ("x", "p", "inplace", "functional", "leaf", "state")

    def __init__(self, x, p, inplace, functional, leaf):
        self.x, self.p, self.inplace, self.functional, self.leaf = x, p, inplace, functional, leaf
        self.state = None        # (generator, its state before the call): the mask is redrawn

    def prepare(self):
        """Before the call: the generator state a redraw needs. None is needed where the
        mask is an output (native_dropout) or will be read where autograd saves it (a plain
        dropout of an input that requires grad, ``_saved_mask``)."""
        if self.leaf == "native_dropout" or (self.leaf == "dropout" and _saves_mask(self.x)):
            return
        gen = _generator(self.x.device)
        if gen is not None:
            self.state = (gen, gen.get_state())


class _Saved:
    """A mask autograd saved for a dropout's backward, held until the step ends (it is
    alive until the backward anyway; a step's optimizer runs with them still held)."""
    __slots__ = ("_record", "_mask")

    def __init__(self, record, mask):
        self._record, self._mask = record, mask

    def record(self):
        return self._record

    def mask(self):
        return self._mask


class _Redraw:
    """A dropout call drawn again from the generator state it started with: the same kernel
    from the same state draws the same mask. Holds no tensor of the run, so that it can
    wait for the end of the step.

    In general the API itself runs again, on ones laid out as its input. The CPU's plain
    dropout (``_FAST``) draws its mask as ``noise = empty_like(input); noise.bernoulli_(1 - p)``
    (aten's Dropout.cpp, ``_dropout_impl``): that alone is run again, two kernels of the
    dropout's four, checked against the output on the first call of the process.
    """
    __slots__ = ("func", "p", "inplace", "functional", "size", "stride", "dtype", "device", "state", "fast")

    def __init__(self, call, func):
        x = call.x
        self.func, self.p, self.inplace, self.functional = func, call.p, call.inplace, call.functional
        self.size, self.stride, self.dtype, self.device = tuple(x.shape), x.stride(), x.dtype, x.device
        self.state = call.state
        self.fast = x.device.type == "cpu" and call.leaf in _FAST and _FAST[call.leaf]

    def record(self):
        return DrawRecord(MASK, self.size, str(self.dtype), self.p)

    def mask(self):
        """A tensor whose nonzero elements are the kept ones (alpha dropouts, through the
        API: a kept element is a + b > 0, a dropped one < 0); the generator is left as it
        was found."""
        gen, before = self.state
        after = gen.get_state()
        gen.set_state(before)
        try:
            if self.fast:
                noise = _laid_out(self.size, self.stride, self.dtype, self.device)
                return noise.bernoulli_(1 - self.p)
            ones = _laid_out(self.size, self.stride, self.dtype, self.device).fill_(1)
            out = self.func(ones, self.p, True, self.inplace) if self.functional else self.func(ones, self.p, True)
        finally:
            gen.set_state(after)
        return out > 0


# torch >= 2.2 (a torch without it never reads a saved mask): the saved-tensor hooks in force
_top_saved_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
# the autograd node a dropout's output comes from -> its saved tensor that is the mask (the
# CPU's dropout multiplies its input by the noise mask / (1 - p); CUDA's returns the mask)
_MASK_SAVED = {"MulBackward0": "_saved_other", "NativeDropoutBackward0": "_saved_result1"}


def _saves_mask(x):
    """Will autograd save the mask of a dropout of ``x`` where ``_saved_mask`` reads it?"""
    return x.requires_grad and torch.is_grad_enabled() and _top_saved_hooks is not None and _no_saved_hooks()


def _no_saved_hooks():
    try:
        return _top_saved_hooks(False) is None
    except TypeError:
        return _top_saved_hooks() is None


def _saved_mask(call, out):
    """The mask autograd saved for the call's backward, broadcast to the input's shape,
    or None: no graph (no input requiring grad, no_grad), another node (an unbatched
    dropout1d's squeeze, an alpha dropout's add), or saved-tensor hooks in force (reading
    a saved tensor would run their unpack hook, e.g. a checkpoint's recomputation)."""
    fn = getattr(out, "grad_fn", None)
    attr = _MASK_SAVED.get(type(fn).__name__) if fn is not None else None
    if attr is None or call.leaf in _ALPHA or _top_saved_hooks is None or not _no_saved_hooks():
        return None
    saved = getattr(fn, attr, None)
    shape = call.x.shape
    if not isinstance(saved, torch.Tensor) or saved.dim() != len(shape) or saved.device != call.x.device:
        return None
    try:
        return saved.expand(shape)
    except RuntimeError:
        return None


# leaf -> draw its mask alone on the CPU (True until a check against an output fails)
_FAST = {"dropout": True}
_fast_checked: set = set()


def _laid_out(size, stride, dtype, device):
    """An empty tensor with the input's strides (a kernel may draw in memory order),
    contiguous where those overlap (as empty_like makes it for such an input)."""
    if all(st or n <= 1 for n, st in zip(size, stride)):
        try:
            return torch.empty_strided(size, stride, dtype=dtype, device=device)
        except RuntimeError:
            pass
    return torch.empty(size, dtype=dtype, device=device)


def _dropout_call(name, leaf, args, kwargs):
    """The call as a ``_Dropout`` when it draws (training, 0 < p < 1, elements), else
    ``(p, training)`` for the message of a call that does not."""
    p_pos, t_pos, default_train = DROPOUT_ARGS[leaf]
    p = _arg(args, kwargs, p_pos, "p", 0.5)
    train = _arg(args, kwargs, t_pos, "training", kwargs.get("train", default_train))
    if train is None:      # native_dropout's train=None means training
        train = True
    x = args[0] if args else kwargs.get("input")
    p = float(p)
    if not train or not 0 < p < 1 or not isinstance(x, torch.Tensor) or x.numel() == 0:
        return p, bool(train)
    functional = name.startswith("Functional.")
    inplace = bool(_arg(args, kwargs, 3, "inplace", False)) if functional else False
    return _Dropout(x, p, inplace, functional, leaf)


def _generator(device):
    """The default generator that draws for kernels on ``device`` (None: unknown)."""
    if device.type == "cpu":
        return _CPU_GENERATOR
    module = getattr(torch, device.type, None)
    generators = getattr(module, "default_generators", None)
    if not generators:
        return None
    index = device.index if device.index is not None else module.current_device()
    return generators[index]


_CPU_GENERATOR = torch.default_generator


class DrawHandler:
    """Interceptor handler: records (NPU side) or replays (bench side) random calls and
    hands every call to ``inner`` (the forensics handler, then the collector).

        handler = DrawHandler(inner, random_from=None)   # records
        handler.open_step(step, rank_dir)                # the step's dump folder is opened
        ...                                              # calls go through handler(...)
        handler.end_step()                               # files written / replay checked
    """

    def __init__(self, inner, random_from=None, record=None):
        self.inner = inner
        self.kinds = _Kinds()
        self.counters: dict = {}
        self.step = None
        self._said = LogOnce(log)
        record = RECORD if record is None else record
        self.recorder = _Recorder(self._said) if record and not random_from else None
        self.source = _Source(random_from) if random_from else None
        # neither (bench/draws.py's "recording off"): the debugger leaves the handler out
        self.active = self.recorder is not None or self.source is not None

    # ---- steps ------------------------------------------------------------------
    def open_step(self, step, rank_dir):
        """A dumped step begins: its draws go to (or come from) ``rank_dir``'s twin."""
        if self.step != step:
            self.counters.clear()
        self.step = step
        if self.recorder is not None:
            self.recorder.open_step(rank_dir)
        if self.source is not None:
            self.source.open_step(step, rank_dir)

    def end_step(self):
        """The step ends: its draws are written; on the bench, every NPU draw of the step
        must have been taken (DrawMismatch naming the first that was not)."""
        self.counters.clear()
        step, self.step = self.step, None
        if self.recorder is not None:
            self.recorder.end_step()
        if self.source is not None:
            left = self.source.end_step()
            if left:
                more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
                raise DrawMismatch(f"random_from: step {step}: the NPU run drew at {left[0]}{more}, and this run made "
                                   f"no such call: it makes fewer random calls than the NPU run")

    def close(self):
        """Write what is pending (the bench side checks nothing here)."""
        if self.recorder is not None:
            self.recorder.end_step()
        if self.source is not None:
            self.source.end_step()

    # ---- the handler ----------------------------------------------------------------
    def __call__(self, name, func, args, kwargs):
        # The inner handler is called from here on every path: the collector finds the
        # API's caller by walking a few frames up (call_site.as_called), so this handler
        # adds one frame, never more.
        kind = self.kinds[name]
        if kind is None:
            return self.inner(name, func, args, kwargs)
        if kind == FUSED or kind == INSIDE:
            self._say_not_taken(kind, name, args, kwargs)
            return self.inner(name, func, args, kwargs)
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        entry = f"{name}.{n}.forward"
        if self.source is not None:
            take = self._take(kind, name, entry, args, kwargs)
            if take is None:   # this call draws nothing, nor did the NPU's
                return self.inner(name, func, args, kwargs)
            with take:
                out = self.inner(name, func, args, kwargs)
            self._taken(take, name, entry)
            return out
        if self.recorder is None:
            return self.inner(name, func, args, kwargs)
        call = self._before(kind, name, args, kwargs)
        if call is False:
            return self.inner(name, func, args, kwargs)
        out = self.inner(name, func, args, kwargs)
        self._after(kind, name, entry, func, call, out)
        return out

    def _fail(self, name, exc):
        self._said.warning(("record", name), "probe: recording the draw of %s failed (%s: %s); the API's result "
                           "is unaffected, a bench run replaying this dump will stop at that call",
                           name, type(exc).__name__, exc)

    # ---- NPU side -----------------------------------------------------------------
    def _before(self, kind, name, args, kwargs):
        """Before a random call: a dropout's ``_Dropout`` (prepared), None for values,
        False when there is nothing to record (no draw, or the call cannot be read)."""
        if kind != MASK:
            return None
        try:
            with OwnWork():
                call = _dropout_call(name, name.rsplit(".", 1)[-1], args, kwargs)
                if not isinstance(call, _Dropout):
                    return False
                call.prepare()
                return call
        except Exception as exc:
            self._fail(name, exc)
            return False

    def _after(self, kind, name, entry, func, call, out):
        try:
            with OwnWork():
                if kind == MASK:
                    drawn = self._mask_of(name, func, call, out)
                    if not isinstance(drawn, tuple):   # a _Saved or _Redraw: packed when the step ends
                        self.recorder.add_pending(entry, drawn)
                        return
                    rec, data = drawn
                else:
                    if not isinstance(out, torch.Tensor):
                        raise TypeError(f"returned {type(out).__name__}, not a tensor")
                    rec, data = DrawRecord(VALUES, tuple(out.shape), str(out.dtype)), files.values_array(out)
            self.recorder.add(entry, rec, data)
        except Exception as exc:
            self._fail(name, exc)

    def _mask_of(self, name, func, call, out):
        """The mask the call drew: (record, bit-packed mask), or a ``_Redraw`` to run when
        the step ends.

        ``output != 0`` cannot tell a dropped element from a kept one whose input was 0
        (the zeros of a causal attention's probabilities are half of them), and the
        gradient there depends on it; nor can it read an alpha dropout. Where autograd
        saved the call's mask for its backward (``_saved_mask``), that is it, read for the
        cost of packing it. Otherwise the call is drawn again from the generator state it
        started with (``_Redraw``) and the generator put back: on the CPU when the step
        ends (the redraws of a step one after another, not between the dump's own work),
        elsewhere at once and checked against the output (a device whose generator probe
        does not know, or a redraw its output contradicts, falls back to ``output != 0``,
        said once: an element whose input was 0 is then recorded as dropped).
        """
        x = call.x
        record = DrawRecord(MASK, tuple(x.shape), str(x.dtype), call.p)
        if call.leaf == "native_dropout":
            return record, files.pack_nonzero(out[1])
        saved = _saved_mask(call, out)
        if saved is not None:
            return _Saved(record, saved)
        if call.state is None:
            if call.leaf == "dropout" and _saves_mask(x):
                self._said.warning(("not saved", name), "probe: autograd did not save the mask of %s where probe "
                                   "reads it (%s); recorded as output != 0 (an element whose input was 0 counts as "
                                   "dropped)", name, type(getattr(out, "grad_fn", None)).__name__)
            else:
                self._said.warning(("no generator", x.device.type), "probe: no default generator known for %s: "
                                   "dropout masks are recorded as output != 0 (an element whose input was 0 "
                                   "counts as dropped)", x.device.type)
            return record, files.pack_nonzero(out)
        redraw = _Redraw(call, func)
        fast_unchecked = redraw.fast and call.leaf not in _fast_checked
        if x.device.type == "cpu" and not fast_unchecked:   # the CPU's redraw is exact (tests/test_draw_replay.py)
            return redraw
        mask = redraw.mask() != 0
        if call.leaf not in _ALPHA:
            kept = out != 0
            fits = torch.equal(kept, mask & (x != 0)) if not call.inplace else torch.equal(kept & mask, kept)
            if fast_unchecked:
                _fast_checked.add(call.leaf)
                if not fits:   # this torch's CPU dropout draws otherwise: through the API from now on
                    _FAST[call.leaf] = False
                    redraw.fast = False
                    mask = redraw.mask() != 0
                    fits = torch.equal(kept, mask & (x != 0)) if not call.inplace else torch.equal(kept & mask, kept)
            if not fits:
                self._said.warning(("redraw", name), "probe: %s: drawing the mask again did not reproduce the "
                                   "call's; recorded as output != 0 (an element whose input was 0 counts as "
                                   "dropped)", name)
                mask = kept
        return record, files.pack_mask(mask)

    # ---- bench side ---------------------------------------------------------------
    def _take(self, kind, name, entry, args, kwargs):
        """The dispatch mode that gives this call the NPU's draw, after checking that the
        draw fits (DrawMismatch otherwise); None when neither side draws here."""
        draws = self.source.step_draws()
        rec = draws.records.get(entry)
        if kind == MASK:
            call = _dropout_call(name, name.rsplit(".", 1)[-1], args, kwargs)
            if not isinstance(call, _Dropout):
                if rec is not None:
                    p, train = call
                    raise self._mismatch(entry, f"this call draws nothing (p={p}, training={train}), the NPU's "
                                                f"drew with p={rec.p}")
                return None
            self._check(entry, rec, MASK)
            if tuple(call.x.shape) != rec.shape:
                raise self._mismatch(entry, f"input shape {list(call.x.shape)} here, {list(rec.shape)} in the NPU run")
            if call.p != rec.p:
                raise self._mismatch(entry, f"p={call.p} here, p={rec.p} in the NPU run")
            with OwnWork():
                take = _TakeDraw(mask=draws.mask(entry).to(call.x.device), p=call.p)
        else:
            self._check(entry, rec, VALUES)
            with OwnWork():
                take = _TakeDraw(values=draws.values(entry))
        self.source.taken.add(entry)
        return take

    def _taken(self, take, name, entry):
        if take.error:
            raise self._mismatch(entry, take.error)
        if not take.taken:
            self._said.warning(("not taken", name), "probe: %s: no kernel of this device that probe can give the "
                               "NPU's draw to ran (saw %s); its own draw stays and the two runs differ from here",
                               entry, take.seen or "no random kernel")

    def _check(self, entry, rec, kind):
        if rec is None:
            api, n, _ = entry.rsplit(".", 2)
            made = sum(1 for e in self.source.draws.records if e.rsplit(".", 2)[0] == api)
            raise self._mismatch(entry, f"the NPU run drew at {made} {api} calls of this step, this is call "
                                        f"{int(n) + 1}: another call sequence")
        if rec.kind != kind:
            raise self._mismatch(entry, f"a {kind} draw here, a {rec.kind} draw in the NPU run")

    def _mismatch(self, entry, what):
        draws = self.source.draws
        where = (f"{draws.path} does not exist: the NPU run made no random call at this step, or its probe does "
                 f"not record draws") if draws.missing else draws.path
        return DrawMismatch(f"random_from: {entry} at step {self.step} does not take the NPU run's draw: {what} "
                            f"({where})")

    # ---- what cannot be taken -----------------------------------------------------
    def _say_not_taken(self, kind, name, args, kwargs):
        leaf = name.rsplit(".", 1)[-1]
        if kind == FUSED:
            p_pos, t_pos, default_train = _FUSED[leaf]
            p = _arg(args, kwargs, p_pos, "dropout_p", 0.0)
            train = default_train if t_pos is None else _arg(args, kwargs, t_pos, "training", default_train)
            if not train or not p:
                return
            self._said.warning(("fused", name), "probe: %s runs with dropout_p=%s: its dropout is drawn inside the "
                               "fused attention kernel, where probe can neither record nor replay it, so the two runs "
                               "differ from this call on. For the check run use eager attention (HF: "
                               "attn_implementation=\"eager\") or dropout_p=0 (HF: attn_pdrop=0 / attention_dropout=0) "
                               "on both sides", name, p)
            return
        t_pos = _INSIDE_TRAINING.get(leaf)
        if t_pos is not None and not _arg(args, kwargs, t_pos, "training", False):
            return
        self._said.warning(("inside", name), "probe: %s draws inside its own computation (its output is not the "
                           "draw), where probe can neither record nor replay it, so the two runs differ from this "
                           "call on. For the check run use it in eval mode or a deterministic stand-in", name)


class _TakeDraw(TorchDispatchMode):
    """Below autograd, for one API call: the first random kernel the call runs is run (the
    bench's generator moves on as it would) and its result replaced by the NPU's draw.

    Dropout: ``bernoulli_`` on the noise tensor (the CPU's dropout and every alpha or
    feature dropout) gets the mask, and torch's own arithmetic applies it; a fused
    ``native_dropout`` (CUDA, and torch.native_dropout) returns the mask and the output
    computed as its kernel does (``_masked_output``). Values: the result is overwritten.
    Other operators (the collector's own statistics included) pass straight through.
    """

    def __init__(self, mask=None, p=None, values=None):
        super().__init__()
        self.mask, self.p, self.values = mask, p, values
        self.taken = False
        self.error = None
        self.seen = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.taken or self.error is not None or func.overloadpacket not in _random_kernels():
            return func(*args, **kwargs)
        out = func(*args, **kwargs)   # the bench's own draw, so that its generator moves on
        with OwnWork():             # (at L2 the kernel dumper records the real call, not this)
            if self.mask is not None:
                if func is torch.ops.aten.bernoulli_.float:
                    out.copy_(_fit(self.mask, out))
                elif func is torch.ops.aten.native_dropout.default:
                    out = (_masked_output(args[0], self.mask, self.p), self.mask.to(out[1].dtype))
                else:
                    self.seen = str(func)
                    return out
            else:
                if not isinstance(out, torch.Tensor):
                    self.seen = str(func)
                    return out
                if tuple(out.shape) != tuple(self.values.shape):
                    self.error = f"output shape {list(out.shape)} here, {list(self.values.shape)} in the NPU run"
                    return out
                out.copy_(self.values)
        self.taken = True
        return out


_RANDOM_KERNELS: Optional[frozenset] = None
_KERNEL_NAMES = ("bernoulli", "bernoulli_", "native_dropout", "rand", "randn", "randint", "randperm", "rand_like",
                 "randn_like", "randint_like", "multinomial", "normal", "normal_", "uniform_", "exponential_",
                 "random_", "geometric_", "cauchy_", "log_normal_", "poisson")


def _random_kernels():
    global _RANDOM_KERNELS
    if _RANDOM_KERNELS is None:
        aten = torch.ops.aten
        _RANDOM_KERNELS = frozenset(getattr(aten, n) for n in _KERNEL_NAMES if hasattr(aten, n))
    return _RANDOM_KERNELS


def _fit(mask, noise):
    """The mask in the noise tensor's shape: the input's, or a feature dropout's (N, C, 1, ...),
    whose every element's mask is that of the first element of its channel."""
    if noise.numel() == mask.numel():
        return mask.reshape(noise.shape)
    lead = noise.shape[0] * noise.shape[1] if noise.dim() >= 2 else 0
    if lead and noise.numel() == lead and mask.numel() % lead == 0:
        return mask.reshape(lead, -1)[:, 0].reshape(noise.shape)
    raise RuntimeError(f"probe: a dropout noise of shape {list(noise.shape)} does not fit a mask of {list(mask.shape)}")


def _masked_output(x, mask, p):
    """native_dropout's output for ``mask``, computed as its kernel does.

    CPU: ``x * (mask / (1 - p))`` in x's dtype (checked bitwise against torch's own).
    Elsewhere the fused kernel's formula (Dropout.cu: ``x * mask * (1 / (1 - p))`` in
    float32, float64 for double), not checked on a GPU here.
    """
    if x.device.type == "cpu":
        noise = mask.to(x.dtype)
        noise.div_(1 - p)
        return x * noise
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    scale = 1.0 / float(torch.tensor(1 - p, dtype=acc))
    return (x.to(acc) * mask.to(acc) * scale).to(x.dtype)


class _Recorder:
    """NPU side: one step's draws, written next to its dump.json when the step ends, by the
    training thread (complete when ``step()`` returns, like the step's other files). A
    helper thread creating the file ahead measured no cheaper on bench/draws.py: handing it
    the work cost a GIL round trip as long as the create it saved (0.2-0.6 ms on the ext4
    disk of this project's test machine)."""

    def __init__(self, said):
        self._said = said
        self.rank_dir = None
        self.draws: dict = {}
        # (entry, _Saved or _Redraw): masks packed when the step ends, one after another
        # rather than each between the dump's own work (~3x the cost there: cold caches)
        self.pending: list = []

    def open_step(self, rank_dir):
        if rank_dir != self.rank_dir:
            self.end_step()
            self.rank_dir = rank_dir

    def add(self, entry, record, array):
        if self.rank_dir is not None:
            self.draws[entry] = (record, array)

    def add_pending(self, entry, mask):
        if self.rank_dir is not None:
            self.pending.append((entry, mask))

    def end_step(self):
        rank_dir, draws, pending = self.rank_dir, self.draws, self.pending
        self.rank_dir, self.draws, self.pending = None, {}, []
        if rank_dir is None or not (draws or pending):   # a step that drew nothing has no file
            return
        try:
            with OwnWork():
                for entry, mask in pending:
                    draws[entry] = (mask.record(), files.pack_nonzero(mask.mask()))
            files.write_step(rank_dir, draws)
        except Exception as exc:   # never into the training script
            self._said.error("write", "probe: writing the draws of %s failed (%s: %s); training goes on, a bench "
                             "run cannot replay that step", rank_dir, type(exc).__name__, exc)


class _Source:
    """Bench side: the NPU dump's draws of the step being run, read on first use."""

    def __init__(self, root):
        self.root = root
        self.step = None
        self.rank_name = None
        self.draws: Optional[files.StepDraws] = None
        self.taken: set = set()

    def open_step(self, step, rank_dir):
        if step != self.step:
            self.end_step()
        self.step = step
        self.rank_name = os.path.basename(rank_dir)

    def step_draws(self) -> files.StepDraws:
        if self.draws is None:
            self.draws = files.StepDraws(self._folder(), missing_ok=True)
            self.taken = set()
        return self.draws

    def _folder(self):
        step_dir = os.path.join(self.root, f"step{self.step}")
        if not os.path.isdir(step_dir):
            raise ConfigError(f"random_from: {self.root} has no step{self.step}: the NPU run did not dump step "
                              f"{self.step} (its step list?), so its draws cannot be replayed")
        folder = os.path.join(step_dir, self.rank_name)
        if os.path.isdir(folder):
            return folder
        ranks = sorted(d for d in os.listdir(step_dir) if d.startswith("rank") and os.path.isdir(os.path.join(step_dir, d)))
        if len(ranks) == 1:    # a single-process bench replaying a one-rank NPU dump named rank0
            return os.path.join(step_dir, ranks[0])
        raise ConfigError(f"random_from: {step_dir} has no {self.rank_name} folder (it has: {', '.join(ranks) or 'none'})")

    def end_step(self):
        """Entries of the step's NPU draws this run did not take (read now when no call
        needed them; a step the NPU dump lacks, or dumped without draws, has none)."""
        left = []
        if self.step is not None and self.draws is None:
            try:
                folder = self._folder()
            except ConfigError:   # no such NPU step: nothing to take
                folder = None
            if folder is not None:
                self.draws = files.StepDraws(folder, missing_ok=True)
        if self.draws is not None:
            left = [e for e in self.draws.records if e not in self.taken]
        self.draws = None
        self.taken = set()
        self.step = None
        return left
