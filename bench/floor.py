"""The least a statistics dump that behaves as the core issue asks can cost, per model and level.

    python bench/floor.py [--quick]

A stand-in dumper does only the work no design can leave out, and nothing else:

- at L1 and mix, interception by a TorchFunctionMode filtered by the registry (the only
  way to see functions imported before ``start()`` while ``act is F.gelu`` stays true;
  probe keeps it at L0 too, for crash dumps, which this floor leaves out);
- one statistics pass per distinct tensor a step (probe's compiled kernel and its
  per-step cache, so a tensor seen twice unchanged is summarised once);
- one hook on the autograd node of a call's outputs, summarising the gradients it sees
  (a backward entry needs at least that); at L0 and mix, a pre and post forward hook per
  module and one hook per parameter, made at ``start()`` and removed at ``stop()`` as
  probe does (hooks left on a model break pickling and copying it between steps).

No names, counters, call stacks, records, JSON or files, and no statistics for tensors
the compiled summary does not take (non-contiguous ones), which only lowers the floor.
Its step time over the plain
step is a floor for probe's ratio on the same machine: the targets below it cannot be met
by tuning probe's own code. Timed as ``overhead.py`` times probe (blocks of steps off and
on, medians). This is a measurement, not a test.

The ``L1+rec`` row adds, at its cheapest, the per-entry work of a file in msprobe's
format: a counted name, the call stack (probe's ``StackTable``), a dict per entry, one
orjson encode per entry and one file write per step (dump.json and stack.json, in
``/dev/shm`` where it exists). It still leaves out filters, crash bookkeeping, argument
names and in-place handling. Its backward entries attribute gradients to each input in
argument order, as the dump must (issue #2): probe's walk of the call's autograd nodes,
the only way to do so without wrapping inputs. What probe spends beyond this row is its
own machinery and those features.
"""
import argparse
import os
import shutil
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import orjson  # noqa: E402
import overhead  # noqa: E402  (bench/overhead.py: models, train step, timing)

from probe.dump import (
    _cstats,  # noqa: E402
    stats,  # noqa: E402,F401  (sets up the compiled kernel)
)
from probe.dump.encode import stack_text  # noqa: E402
from probe.dump.records import describe_value  # noqa: E402
from probe.dump.stack import StackTable  # noqa: E402
from probe.hook_module import grad_capture  # noqa: E402
from probe.hook_module.interceptor import Interceptor, state  # noqa: E402
from probe.hook_module.registry import load_registry, resolve  # noqa: E402

TARGETS = {"L1": 1.3, "L0": 1.2, "mix": 1.4, "L1+rec": 3.0}   # issues #2, #3 (#22 for L1+rec), statistics, mid model


class FloorDumper:
    """``start(model)`` / ``stop()`` / ``step()`` like a debugger, doing only the floor's work."""

    def __init__(self, level):
        self.level = level
        self.cache = {}
        self.handles = []
        self.interceptor = Interceptor(resolve(load_registry()), self._api) if level != "L0" else None

    # ---- a debugger's interface -----------------------------------------------------
    def start(self, model=None):
        if self.level in ("L0", "mix"):
            self._hook_modules(model)
        if self.interceptor is not None:
            self.interceptor.start()

    def stop(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.interceptor is not None:
            self.interceptor.stop(keep_patches=True)

    def step(self):
        self.cache.clear()

    # ---- the work ------------------------------------------------------------------
    def _summarise(self, value):
        if isinstance(value, torch.Tensor):
            _cstats.summary(value, self.cache)

    def _hook_outputs(self, outputs):
        node = None
        for out in outputs:
            self._summarise(out)
            if isinstance(out, torch.Tensor) and out.grad_fn is not None and out.grad_fn is not node:
                node = out.grad_fn
                node.register_hook(self._grads)

    def _grads(self, grad_inputs, grad_outputs):
        state.depth += 1
        try:
            for g in grad_inputs + grad_outputs:
                self._summarise(g)
        finally:
            state.depth -= 1

    def _api(self, name, func, args, kwargs):
        out = func(*args, **kwargs)
        for a in args:
            self._summarise(a)
        for a in kwargs.values():
            self._summarise(a)
        self._hook_outputs(out if isinstance(out, tuple) else (out,))
        return out

    def _hook_modules(self, model):
        def pre(module, args, kwargs):
            if not state.depth:
                state.depth += 1
                for a in args:
                    self._summarise(a)
                for p in module._parameters.values():
                    self._summarise(p)
                state.depth -= 1

        def post(module, args, kwargs, out):
            if not state.depth:
                state.depth += 1
                self._hook_outputs(out if isinstance(out, tuple) else (out,))
                state.depth -= 1

        def param(grad):
            self._summarise(grad)

        for path, module in model.named_modules():
            if path:
                self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                self.handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
        self.handles += [p.register_hook(param) for p in model.parameters()]


class RecordsFloorDumper(FloorDumper):
    """The L1 floor plus what every entry of an msprobe-format dump costs (see the top)."""

    def __init__(self):
        super().__init__("L1")
        self.counters = {}
        self.entries = []
        self.stacks = StackTable()
        root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.folder = tempfile.mkdtemp(prefix="probe_floor_", dir=root)

    def step(self):
        super().step()
        data = b",\n".join(orjson.dumps(name) + b": " + orjson.dumps(body) for name, body in self.entries)
        with open(os.path.join(self.folder, "dump.json"), "wb") as f:
            f.write(b'{"task": "statistics", "level": "L1", "data": {\n' + data + b"\n}}\n")
        with open(os.path.join(self.folder, "stack.json"), "wb") as f:
            f.write(stack_text(self.stacks.parts()))
        self.entries = []
        self.counters.clear()
        self.stacks.clear()

    def _describe(self, value):
        if isinstance(value, torch.Tensor):
            return _cstats.summary(value, self.cache)
        if isinstance(value, (list, tuple)):
            return [self._describe(v) for v in value]
        return describe_value(value)

    def _api(self, name, func, args, kwargs):
        n = self.counters.get(name, 0)
        self.counters[name] = n + 1
        base = f"{name}.{n}"
        entry = {"input_args": [self._describe(a) for a in args],
                 "input_kwargs": {k: self._describe(v) for k, v in kwargs.items()}}
        self.stacks.capture(base + ".forward")
        before = None
        if torch.is_grad_enabled():
            inputs = grad_capture.input_slots(args, kwargs)
            if any(t is not None and t.requires_grad for t in inputs):
                before = grad_capture.edges_before(inputs)
        out = func(*args, **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        entry["output"] = [self._describe(o) for o in outs]
        self.entries.append((base + ".forward", entry))
        if before is not None:
            bwd = base + ".backward"
            grad_capture.hook_call(before, grad_capture.output_slots(out), len(inputs), self._grad_summary,
                                   lambda out_grads, in_grads: self.entries.append(
                                       (bwd, {"input": out_grads, "output": in_grads})))
        return out

    def _grad_summary(self, grad):
        return _cstats.summary(grad, self.cache)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the 2-block model only, fewer steps")
    args = ap.parse_args()
    models = ["mid d256 2blk b8"] if args.quick else list(overhead.MODELS)[:3]
    warmup, steps = (9, 45) if args.quick else (9, 90)
    print(f"{'model':<24}{'level':<6}{'off ms':>8}{'floor ms':>9}{'floor':>7}{'target':>8}")
    for model_name in models:
        for level in ("L1", "L1+rec", "L0", "mix"):
            make = RecordsFloorDumper if level == "L1+rec" else (lambda: FloorDumper(level))
            off, on, dumper = overhead.time_steps(model_name, make, warmup, steps, level.split("+")[0])
            if isinstance(dumper, RecordsFloorDumper):
                shutil.rmtree(dumper.folder, ignore_errors=True)
            target = f"x{TARGETS[level]}" if model_name.startswith("mid d256 2blk") else "-"
            print(f"{model_name:<24}{level:<6}{off * 1e3:>8.2f}{on * 1e3:>9.2f}{on / off:>7.2f}{target:>8}", flush=True)


if __name__ == "__main__":
    main()
