"""From an alert to a dump: a ``PrecisionDebugger`` run of the next step(s), one layer only.

After a step whose first alert names module M, the next ``dump_steps`` steps are dumped
(statistics or tensors) under ``{dump_path}/step{N}/rank{R}/`` with N the monitor's step:
- ``mix``: the debugger runs the whole step with ``scope`` = [M's first call, M's first
  call], so dump.json holds M's module entries and the APIs called inside it (forward
  and backward), nothing else of the model;
- ``L1``: the debugger is started when M's forward begins and stopped when it returns:
  the APIs M's forward called (and their backward entries).
Steps are delimited by the root model's forward: a dumped step runs from its forward to
the next step's. Hooks are global module hooks installed only while a dump is armed.
``PrecisionDebugger`` is one per process (msprobe's singleton): arming closes a debugger
the user made.
"""
import json
import logging
import os

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

log = logging.getLogger(__name__)


def check_dump_options(options):
    """Refuse bad dump settings at Monitor(...), through the debugger's own config check."""
    from probe.config import load_config
    load_config(None, task=options.dump_task, level=options.dump_level, dump_path=dump_path_of(options))


def dump_path_of(options):
    return options.dump_path or os.path.join(options.output_dir, "dump")


class DumpArm:
    def __init__(self, options, model, failures):
        self.opts = options
        self.model = model
        self.failures = failures
        self.left = options.dump_max
        self.names = {m: n for n, m in model.named_modules() if n}
        self.target = None        # module to dump
        self.first = self.last = None
        self.debugger = None
        self.handles = []
        self.dumped = []          # (step, module name) of each armed dump
        self.current = None       # monitor step being dumped
        self.step_of = None       # callable: the monitor's current step

    def arm(self, alert, next_step, step_of):
        """Dump ``alert.module`` at steps ``next_step ...``; False when nothing was armed."""
        if self.left <= 0 or self.target is not None:
            return False
        module = next((m for m, n in self.names.items() if n == alert.module), None)
        if module is None:
            log.info("probe monitor: no dump for %s: not a submodule of the model", alert.module)
            return False
        self.left -= 1
        self.target = module
        self.first, self.last = next_step, next_step + self.opts.dump_steps - 1
        self.step_of = step_of
        self.handles = [register_module_forward_pre_hook(torch.compiler.disable(self._pre)),
                        register_module_forward_hook(torch.compiler.disable(self._post))]
        log.warning("probe monitor: dumping %s (%s) at step(s) %d-%d to %s", alert.module, self.opts.dump_level,
                    self.first, self.last, dump_path_of(self.opts))
        return True

    def _make_debugger(self):
        from probe.debugger import PrecisionDebugger
        opts = self.opts
        path = dump_path_of(opts)
        os.makedirs(path, exist_ok=True)
        cfg = {"task": opts.dump_task, "level": opts.dump_level, "dump_path": path}
        if opts.dump_level == "mix":
            entry = f"Module.{self.names[self.target]}.{type(self.target).__name__}.forward.0"
            cfg[opts.dump_task] = {"scope": [entry, entry]}
        cfg_path = os.path.join(path, "monitor_dump_config.json")
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        return PrecisionDebugger(config_path=cfg_path)

    def _pre(self, module, args):
        try:
            if module is self.model:
                self._step_boundary(self.step_of())
            elif module is self.target and self.current is not None and self.opts.dump_level == "L1":
                self.debugger.start()
        except Exception as exc:
            self.failures.failed("the armed dump", exc)
            self.close()

    def _post(self, module, args, output):
        if module is self.target and self.current is not None and self.opts.dump_level == "L1":
            try:
                self.debugger.stop()
            except Exception as exc:
                self.failures.failed("the armed dump", exc)
                self.close()

    def _step_boundary(self, step):
        if self.current is not None and step != self.current:
            self._end_step()
        if self.current is None and self.first <= step <= self.last:
            if self.debugger is None:
                self.debugger = self._make_debugger()
            self.debugger.current_step = step
            self.current = step
            if self.opts.dump_level == "mix":
                self.debugger.start(self.model)
        elif step > self.last:
            self.close()

    def _end_step(self):
        self.debugger.stop()
        self.debugger.step()
        self.dumped.append((self.current, self.names[self.target]))
        self.current = None

    def close(self):
        """End the armed dump (files complete on disk); called at the step after, or at exit."""
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.debugger is not None:
            try:
                if self.current is not None:
                    self._end_step()
                self.debugger.close()
            except Exception as exc:
                self.failures.failed("closing the armed dump", exc)
        self.debugger = None
        self.target = None
        self.current = None
