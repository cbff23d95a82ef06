"""Statistics collection: the hooks that see a training step and fill a ``StepBuffer``.

What is hooked, and when:
- the optimizer's step pre/post hooks (always): a step ends at ``optimizer.step()``.
  Before it: weight norms, gradient norms after the data-parallel reduction, a copy of
  the weights for the update-to-weight ratio; after it: exp_avg / exp_avg_sq norms and
  the update's norm. One ``torch._foreach_norm`` per family, no per-parameter sync.
- on logging steps only, a global module forward hook (``register_module_forward_hook``:
  nothing is put on the model, so ``torch.save(model)``/``deepcopy`` between steps are
  unaffected): the modules' completion order, activation statistics of watched modules,
  the loss of an HF-style output (``output.loss``) of the root model;
- on logging steps of a multi-rank run, ``register_post_accumulate_grad_hook`` on each
  watched parameter, from the end of the root's forward to ``optimizer.step()``: the
  local gradient before the reduction (DDP reduces in C++ between those two points).

A failure inside a hook is logged once per place and the step goes on unchanged: the
hooks only read tensors and return None.
"""
import logging
import math

import torch
import torch.distributed as dist

from probe.dump.stats import SummaryCache
from probe.hook_module.interceptor import guard
from probe.log_once import LogOnce
from probe.monitor.records import StepStats
from probe.monitor.summaries import ACT_METRICS, StepBuffer, norms
from probe.torch_compat import (
    GLOBAL_HOOKS_TAKE_KWARGS,
    dynamo_inlines_nn_modules,
    in_compile_trace,
    register_global_forward_hook,
    restore_optimizer_step_hooks,
)
from probe.torch_compat import is_compiling as _is_compiling

log = logging.getLogger(__name__)

# phases of a step, in the order things happen
FORWARD, BACKWARD, REDUCED, OPTIMIZER = 0, 1, 2, 3
ROOT = "<model>"  # name of the root module (its own parameters, its output); no submodule can have it
TRAIN = "train"    # name of the step's scalars (loss, loss_scale)


def unwrap_optimizer(optimizer):
    """The torch optimizer under wrappers (accelerate's AcceleratedOptimizer, HF's)."""
    seen = 0
    while not isinstance(optimizer, torch.optim.Optimizer) or \
            isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or seen > 8:
            break
        optimizer, seen = inner, seen + 1
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"set_monitor: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    return optimizer


def first_float(value, depth=0):
    """The first floating-point tensor in an output/args structure (HF ModelOutput too)."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if depth > 4:
        return None
    if isinstance(value, (tuple, list)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return None
    for v in items:
        t = first_float(v, depth + 1)
        if t is not None:
            return t
    return None


def _loss_of(output):
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
        return loss
    return None


class StepStatsCollector:
    """Hooks on one model and (optionally) its optimizer that gather a step's statistics
    (activations, gradients, optimizer state); calls ``on_step(StepStats)`` at the end of
    each logged step, from inside ``optimizer.step()`` or ``step()``. ``failures`` (a
    ``LogOnce``) says each failing place once; the training step never sees it."""

    def __init__(self, options, model, optimizer, scaler, loss_fn, rank, on_step, failures):
        self.opts = options
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss_fn = loss_fn
        self.rank = rank
        self.on_step = on_step
        self.failures = failures
        self.said = LogOnce(log)   # what this torch cannot give the monitor, said once each
        self.step = 0
        self.buffer = StepBuffer()
        self.cache = SummaryCache()
        self.names = {m: (n or ROOT) for n, m in model.named_modules()}
        self.watched = {}
        if options.activations:
            suffixes_in = [f"input_{m}" for m in ACT_METRICS]
            suffixes_out = [f"output_{m}" for m in ACT_METRICS]
            for m, n in self.names.items():
                if options.wants_module(n):
                    self.watched[m] = ([(n, s) for s in suffixes_in] if options.activation_inputs else None,
                                       [(n, s) for s in suffixes_out])
        self.params = []    # (name, parameter, owner module name)
        for n, p in model.named_parameters():
            owner = n.rpartition(".")[0] or ROOT
            if p.requires_grad and options.wants_module(owner):
                self.params.append((n, p, owner))
        self.owners = {n: owner for n, _, owner in self.params}
        self.weights = [p for _, p, _ in self.params]   # read under no_grad: no detach needed
        self.layouts = {}
        self.backward_seen = 0
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.grad_pre = options.gradients and (options.grad_pre_reduction is True or
                                               (options.grad_pre_reduction == "auto" and world > 1))
        self.order = {}          # module name -> completion position in the last logged forward
        self.step_order = {}     # the same, for the step being logged
        self.grad_pre_values = {}
        self.backward_order = {}
        self.grad_handles = []
        self.forward_handle = None
        self.old_weights = None
        self.old_norms = None
        self.weight_copy = None
        self.optimizer_handles = []
        self.loss_seen = False
        # under torch.compile the hook runs eagerly (a graph break), not traced and
        # recompiled for every tensor it looks at; outside it the wrapper is not paid
        # (~20 us a module call: ~0.4 ms of a logged step of the 4-block bench model)
        self._compiled_forward_hook = torch.compiler.disable(self._forward_hook)
        if optimizer is not None:
            self.optimizer_handles = [optimizer.register_step_pre_hook(self._make_hook(self.before_update)),
                                      optimizer.register_step_post_hook(self._make_hook(self.after_update))]
            restore_optimizer_step_hooks()   # torch < 2.3: a torch.compile so far took them away
        self._begin_step()

    # ---- step boundaries -------------------------------------------------------------
    def logging(self):
        return self.step % self.opts.interval == 0

    def _make_hook(self, method):
        # a closure, not a bound method: deepcopy(optimizer) must not copy the monitor
        def hook(optimizer, args, kwargs):
            method()
        return hook

    def _begin_step(self):
        """Install the logging step's forward hook (global: nothing on the model)."""
        if self.logging() and self.forward_handle is None:
            self.forward_handle = register_global_forward_hook(self._forward_hook_entry)

    def _end_forward_hooks(self):
        if self.forward_handle is not None:
            self.forward_handle.remove()
            self.forward_handle = None
        for h in self.grad_handles:
            h.remove()
        self.grad_handles = []

    def before_update(self):
        """Optimizer pre-step: weights as used by this step, gradients after reduction."""
        if not self.logging():
            return
        try:
            with guard(), torch.no_grad():
                self._end_forward_hooks()
                self._weights_and_grads()
        except Exception as exc:  # never stop training
            self.failures.failed("statistics before optimizer.step()", exc)

    def after_update(self):
        """Optimizer post-step: optimizer state, update ratio; the step ends here."""
        if self.logging():
            try:
                with guard(), torch.no_grad():
                    self._optimizer_state()
            except Exception as exc:
                self.failures.failed("statistics after optimizer.step()", exc)
        self.end_step()

    def manual_step(self):
        """``Monitor.step()`` for loops without an optimizer: weights and gradients, then the end."""
        self.before_update()
        self.end_step()

    def end_step(self):
        stats = None
        if self.logging():
            try:
                with guard():
                    self._end_forward_hooks()
                    stats = self._finish()
            except Exception as exc:
                self.failures.failed("fetching the step's statistics", exc)
            self.buffer.clear()
            self.cache.clear()
            self.old_weights = self.old_norms = None
            self.grad_pre_values = {}
            self.step_order = {}
            self.loss_seen = False
        self.step += 1
        self._begin_step()
        if stats is not None:
            self.on_step(stats)

    def close(self):
        self._end_forward_hooks()
        for h in self.optimizer_handles:
            h.remove()
        self.optimizer_handles = []
        self.weight_copy = None

    # ---- forward -----------------------------------------------------------------------
    def _forward_hook_entry(self, module, args, kwargs, output):
        if _is_compiling():    # dynamo folds this to True while it traces: a graph break
            return self._compiled_forward_hook(module, args, kwargs, output)
        if in_compile_trace():  # a module kept whole in a compiled graph, run on fake tensors
            # (dynamo runs a fake copy of it, or the module itself: watched by its class)
            if not dynamo_inlines_nn_modules() and any(type(m) is type(module) for m in self.watched):
                self.said.warning("compiled", "probe monitor: this torch.compile keeps torch.nn's modules "
                                  "whole in its graph (torch < 2.5): activations of the model's %s modules and "
                                  "the like are not recorded while it runs compiled", type(module).__name__)
            return None
        return self._forward_hook(module, args, kwargs, output)

    def _forward_hook(self, module, args, kwargs, output):
        if not torch.is_grad_enabled():
            return   # an evaluation forward (no_grad / inference_mode) between training steps
        if module is self.loss_fn:
            self.add_loss(output, (FORWARD, math.inf, 0))
            return
        name = self.names.get(module)
        if name is None:
            return
        try:
            with guard():
                order = self.step_order
                seq = order.get(name)
                if seq is None:
                    seq = order[name] = len(order)
                keys = self.watched.get(module)
                if keys is not None:
                    in_keys, out_keys = keys
                    out = first_float(output)
                    if out is not None:
                        self.buffer.add_tensor_summary(out_keys, (FORWARD, seq, 2), out, self.cache)
                    if in_keys is not None:
                        inp = first_float(args) if args else None
                        if inp is None and kwargs:
                            inp = first_float(kwargs)
                        if not args and not GLOBAL_HOOKS_TAKE_KWARGS:
                            self.said.warning("kwargs", "probe monitor: this torch (< 2.6) does not pass "
                                              "keyword arguments to global module hooks; input statistics of "
                                              "modules called with keyword arguments only (first: %s) are not "
                                              "recorded", name)
                        if inp is not None:
                            self.buffer.add_tensor_summary(in_keys, (FORWARD, seq, 1), inp, self.cache)
                if module is self.model:
                    if self.optimizer_handles:   # torch < 2.3: a torch.compile since may have taken them away
                        restore_optimizer_step_hooks()
                    loss = _loss_of(output)
                    if loss is not None:
                        self.add_loss(loss, (FORWARD, seq, 3))
                    if self.grad_pre and not self.grad_handles:
                        self._hook_grads()
        except Exception as exc:
            self.failures.failed(f"forward hook of {name}", exc)

    def add_loss(self, loss, order=(FORWARD, math.inf, 0)):
        """The step's loss (first one given: the model's output.loss, loss_fn's, log_loss)."""
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and not self.loss_seen:
            self.loss_seen = True
            self.buffer.add_block([(TRAIN, "loss")], [order], loss.detach().reshape(1))

    # ---- gradients before the reduction -----------------------------------------------
    def _hook_grads(self):
        values, bwd = self.grad_pre_values, self.backward_order

        def make(i):
            @torch.compiler.disable
            def hook(p):
                try:
                    with guard(), torch.no_grad():
                        if p.grad is not None:
                            values[i] = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32)
                            if i not in bwd:
                                bwd[i] = len(bwd)
                except Exception as exc:
                    self.failures.failed("gradient hook", exc)
            return hook
        self.grad_handles = [p.register_post_accumulate_grad_hook(make(i)) for i, (_, p, _) in enumerate(self.params)]

    # ---- optimizer step -----------------------------------------------------------------
    def _fwd_pos(self, owner):
        return self.order.get(owner, math.inf)

    def _bwd_pos(self, i):
        pos = self.backward_order.get(i)
        if pos is not None:
            return pos
        return -self._fwd_pos(self.params[i][2])   # backward runs the forward in reverse

    def _layout(self, metric, phase, sub, idx, backward=False):
        """Keys and order keys of a family of parameter statistics, built once per call order."""
        hit = self.layouts.get((metric, idx))
        if hit is None:
            params = self.params
            ids = range(len(params)) if idx is None else idx
            keys = [(params[i][0], metric) for i in ids]
            order = [(phase, self._bwd_pos(i) if backward else self._fwd_pos(params[i][2]), sub) for i in ids]
            hit = self.layouts[(metric, idx)] = (keys, order)
        return hit

    def _weights_and_grads(self):
        if self.step_order and self.step_order != self.order:
            self.order = dict(self.step_order)
            self.layouts = {}
        if len(self.backward_order) != self.backward_seen:
            self.backward_seen = len(self.backward_order)
            self.layouts = {}
        opts, buf = self.opts, self.buffer
        params = self.params
        if not params:
            return
        weights = self.weights
        w_norms = None
        if opts.weights or opts.update_ratio:
            w_norms = norms(weights)
        if opts.weights:
            buf.add_block(*self._layout("weight_norm", FORWARD, 0, None), w_norms)
        if opts.gradients:
            grads = [p.grad for p in weights]
            idx = None
            if any(g is None for g in grads):
                idx = tuple(i for i, g in enumerate(grads) if g is not None)
                grads = [grads[i] for i in idx]
            if grads:
                phase = REDUCED if self.grad_pre else BACKWARD
                buf.add_block(*self._layout("grad_norm", phase, 1, idx, backward=True), norms(grads))
            if self.grad_pre and self.grad_pre_values:
                pre_idx = tuple(sorted(self.grad_pre_values))
                buf.add_block(*self._layout("grad_norm_pre", BACKWARD, 0, pre_idx, backward=True),
                              [self.grad_pre_values[i] for i in pre_idx])
        if opts.update_ratio and self.optimizer is not None:
            # a copy of the weights kept between logged steps: refilled in place, since a
            # fresh allocation per step (page faults on the CPU) costs more than the copy
            if self.weight_copy is None:
                self.weight_copy = [w.detach().clone() for w in weights]
            else:
                torch._foreach_copy_(self.weight_copy, weights)
            self.old_weights = self.weight_copy
            self.old_norms = w_norms
        if self.scaler is not None:
            scale = getattr(self.scaler, "_scale", None)
            if isinstance(scale, torch.Tensor):
                buf.add_block([(TRAIN, "loss_scale")], [(OPTIMIZER, -1, 0)], scale.detach().reshape(1))
            elif self.scaler.is_enabled():
                buf.add_host((TRAIN, "loss_scale"), (OPTIMIZER, -1, 0), self.scaler.get_scale())

    def _optimizer_state(self):
        opts, buf = self.opts, self.buffer
        if opts.optimizer and self.optimizer is not None:
            state = self.optimizer.state
            states = [state.get(p) for p in self.weights]
            for key in ("exp_avg", "exp_avg_sq"):
                found = [s.get(key) if s else None for s in states]
                idx = None
                if not all(isinstance(t, torch.Tensor) for t in found):
                    idx = tuple(i for i, t in enumerate(found) if isinstance(t, torch.Tensor))
                    found = [found[i] for i in idx]
                if found:
                    buf.add_block(*self._layout(f"{key}_norm", OPTIMIZER, 0, idx), norms(found))
        if self.old_weights is not None:
            torch._foreach_sub_(self.old_weights, self.weights)   # old - new = -update
            upd = norms(self.old_weights)
            w = self.old_norms
            # -1 marks a weight that was all zeros (no ratio); dropped when fetched
            ratio = torch.where(w > 0, upd / w.clamp_min(torch.finfo(torch.float32).tiny), torch.full_like(w, -1.0))
            buf.add_block(*self._layout("update_ratio", OPTIMIZER, 1, None), ratio)
            self.old_weights = None

    # ---- the step's numbers ----------------------------------------------------------------
    def _finish(self):
        keys, values, order = self.buffer.fetch()
        if not keys:
            return None
        if len(set(keys)) != len(keys) or any(v == -1.0 and k[1] == "update_ratio" for k, v in zip(keys, values)):
            keys, values, order = _merge(keys, values, order)
        return StepStats(self.step, self.rank, keys, values, order, self.owners)


def _merge(keys, values, order):
    """A module called several times in a step (micro-batches): one value per key.

    norm and max|x|: the largest call; mean: the calls' average; NaN/Inf counts: summed.
    """
    merged, count, first = {}, {}, {}
    for k, v, o in zip(keys, values, order):
        if k[1] == "update_ratio" and v == -1.0:
            continue
        if k not in merged:
            merged[k], count[k], first[k] = v, 1, o
            continue
        metric = k[1]
        count[k] += 1
        if metric.endswith("nonfinite"):
            merged[k] += v
        elif metric.endswith("mean"):
            merged[k] += (v - merged[k]) / count[k]
        elif not math.isnan(merged[k]) and (math.isnan(v) or v > merged[k]):   # max; NaN wins
            merged[k] = v
    ks = list(merged)
    return ks, [merged[k] for k in ks], [first[k] for k in ks]
