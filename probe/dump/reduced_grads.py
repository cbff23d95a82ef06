"""When a data-parallel model's parameter gradients are final: after its wrapper reduced them.

DDP averages gradients across ranks in C++ (its Reducer, bucket by bucket); FSDP2
(``fully_shard``) reduce-scatters them into each rank's shard and sets the sharded
parameter's ``.grad`` itself. Neither is an autograd step of the parameter, so a hook on
the parameter (what L0/mix use for a plain model) sees DDP's local gradient, before the
all-reduce, and never fires for FSDP2's shards. What the optimizer uses is ``p.grad`` once
the wrapper's work is done, and both wrappers finish it in an autograd engine callback
queued during the backward pass: DDP's ``Reducer::finalize_backward`` (queued when its last
bucket is ready; it waits for the bucket all-reduces and copies them into ``.grad``),
FSDP2's root post-backward callback. The engine runs its callbacks in order, and runs one
queued by a running callback after all those queued before. So a forward hook on the
model puts a hook on the model's outputs; the first gradient to reach one queues a callback
(the backward has begun), which, run at the end of the backward, queues the read: that
runs after the wrapper's own callback, when ``p.grad`` is the reduced gradient on every
rank. No collective and no wait are added: the wrapper waited for its own work.

    watch = ReducedGrads()
    handles = watch.attach(model, read)   # read() after each backward that reduces; [] for a plain model

A DDP forward under ``no_sync()`` prepares no reduction: its backward is not read (the
gradients accumulated there are read, reduced, after the next backward that syncs).
"""
import logging
from typing import Callable, Optional

import torch

from probe.hook_module.interceptor import guard
from probe.hook_module.torch_function_off import no_function_mode
from probe.log_once import LogOnce
from probe.tensor_tree import flat_tensors
from probe.torch_compat import FSDP2_NOT_ON_CPU, FSDP2_RUNS_ON_CPU, fsdp2_module_class, run_eagerly
from probe.torch_compat import compiling as _is_compiling

log = logging.getLogger(__name__)

DDP = "DDP"
FSDP2 = "FSDP2"

# What of each wrapper's reduction the dump sees: said once per run, at the first start().
_SEEN = {
    DDP: "probe: DistributedDataParallel model: each parameter's gradient is recorded after DDP's "
         "all-reduce, once per backward that synchronises (Module.*.parameters_grad.N, read from "
         "p.grad when the Reducer has finished); the bucket all-reduces themselves run in C++ and "
         "are not recorded as Distributed.* entries",
    FSDP2: "probe: FSDP2 (fully_shard) model: its all-gathers and reduce-scatters are recorded as "
           "Distributed.all_gather_into_tensor / Distributed.reduce_scatter_tensor entries, and each "
           "sharded parameter's gradient after the reduce-scatter (Module.*.parameters_grad.N, the "
           "rank's local shard with its DTensor layout)",
}
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback


def wrapper_kind(model) -> Optional[str]:
    """DDP, FSDP2, or None for a model whose gradients no wrapper reduces outside autograd."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return DDP
    fsdp = fsdp2_module_class()
    if fsdp is not None and isinstance(model, torch.nn.Module) and any(isinstance(m, fsdp) for m in model.modules()):
        return FSDP2
    return None


class _Backward:
    """A model's backward passes: the first gradient reaching one of its outputs starts the
    callback chain, once per backward pass (two forwards summed into one loss read once; a
    second backward through a retained graph reads again). Each forward clears ``queued``,
    so a backward that raised, whose callbacks never ran, stops nothing."""
    __slots__ = ("read", "on_error", "queued")

    def __init__(self, read, on_error):
        self.read, self.on_error = read, on_error
        self.queued = False

    def first_grad(self, grad):
        if not self.queued:
            self.queued = True
            try:
                _queue_callback(self._after_backward)
            except Exception as exc:   # no engine to queue on (a grad hook run by hand)
                self.queued = False
                self.on_error(exc)
        return None

    def _after_backward(self):
        _queue_callback(self._read)   # after the callbacks the backward queued: the wrapper's

    def _read(self):
        self.queued = False
        try:
            self.read()
        except Exception as exc:
            self.on_error(exc)


class ReducedGrads:
    """Forward hooks that call ``read()`` once a DDP / FSDP2 model's gradients are reduced."""

    def __init__(self):
        self._said = LogOnce(log)

    def attach(self, model, read: Callable[[], None]) -> list:
        """Hook ``model`` (the wrapped model, as given to ``start``) when a wrapper reduces
        its gradients; returns the handles to remove at ``stop()``."""
        kind = wrapper_kind(model)
        if kind is None:
            return []
        self._said.warning(kind, _SEEN[kind])
        if kind == FSDP2 and not FSDP2_RUNS_ON_CPU and _on_cpu(model):
            # torch's own failure, at the first forward: said so that it is not taken for probe's
            self._said.warning("fsdp2-cpu", "probe: %s: the first forward will fail inside torch's FSDP2, with or "
                               "without probe", FSDP2_NOT_ON_CPU)
        said = self._said

        def on_error(exc):
            said.warning(("failed", kind), "probe: reading the %s-reduced gradients failed (%s: %s); "
                         "training is unaffected", kind, type(exc).__name__, exc)
        backward = _Backward(read, on_error)
        return [model.register_forward_hook(run_eagerly(_forward_hook(kind, backward)))]


def _on_cpu(model) -> bool:
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "cpu"


def _forward_hook(kind, backward):
    """Hooks the outputs of each forward of the model, whose backward is then read."""
    on_error = backward.on_error

    def hook(module, args, output):
        if _is_compiling():   # inside a graph dynamo traces: probe stays out of it
            return None
        # DDP prepares its reduction in forward, not under no_sync(): then nothing to read
        if kind == DDP and not getattr(module, "require_forward_param_sync", True):
            return None
        try:
            with guard(), no_function_mode():
                backward.queued = False
                for t in flat_tensors(output, dataclasses_too=True):
                    if t.requires_grad:
                        t.register_hook(backward.first_grad)
        except Exception as exc:
            on_error(exc)
        return None
    return hook
