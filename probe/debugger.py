"""PrecisionDebugger: the three lines a user adds to a training script.

    from probe import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="config.json")
    for batch in loader:
        debugger.start()
        loss = model(batch).sum(); loss.backward(); optimizer.step()
        debugger.stop()
        debugger.step()

Files go to ``{dump_path}/step{N}/rank{R}/`` (``rank`` without torch.distributed). The
config is checked here, at construction; during training a failure inside probe is
logged and never reaches the user's code.
"""
import atexit
import logging
import os
import weakref

from probe.config import load_config
from probe.dump.collector import ApiCollector
from probe.dump.writer import DumpWriter
from probe.hook_module.interceptor import Interceptor
from probe.hook_module.registry import load_registry, resolve
from probe.seed import seed_all

log = logging.getLogger("probe")


def _current_rank():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


class PrecisionDebugger:
    """Dump every registered API call between ``start()`` and ``stop()``.

    Keyword arguments override the config file's values (``task``, ``dump_path``,
    ``level``, ``step``, ``rank``, ...). A new debugger replaces the previous one, as
    msprobe's singleton does.
    """
    _current = None

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, model=None,
                 step=None, **overrides):
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level,
                                  step=step, **overrides)
        self.registry = resolve(load_registry(self.config.wrap_ops_yaml))
        if self.config.seed is not None or self.config.is_deterministic:
            # Only when asked: reseeding silently would change the user's run.
            seed_all(1234 if self.config.seed is None else self.config.seed, self.config.is_deterministic)
        self.model = model
        self.current_step = 0
        self._writer = None
        self._collector = None
        self._interceptor = None
        self._dir_step = None
        previous = PrecisionDebugger._current and PrecisionDebugger._current()
        if previous is not None:
            previous.close()
        PrecisionDebugger._current = weakref.ref(self)
        atexit.register(_close_at_exit, weakref.ref(self))

    # ---- msprobe's interface -------------------------------------------------
    def start(self, model=None):
        """Begin (or resume) dumping the current step."""
        if model is not None:
            self.model = model
        rank = _current_rank()
        if not self.config.wants_step(self.current_step) or (rank is not None and not self.config.wants_rank(rank)):
            return
        if self._writer is None:
            self._writer = DumpWriter(self.config.task, self.config.level)
            self._collector = ApiCollector(self.config, self._writer)
            self._interceptor = Interceptor(self.registry, self._collector)
        if self._dir_step != self.current_step:
            self._dir_step = self.current_step
            rank_dir = "rank" if rank is None else f"rank{rank}"
            step = self.current_step
            nxt = step + 1 if self.config.wants_step(step + 1) else None
            self._writer.open_dir(self._step_dir(step, rank_dir), self.config.task == "tensor",
                                  None if nxt is None else self._step_dir(nxt, rank_dir))
        self._interceptor.start()

    def stop(self):
        """Pause dumping; nothing is intercepted until the next ``start()``."""
        if self._interceptor is not None and self._interceptor.active:
            self._interceptor.stop()
            self._write_meta()

    def step(self):
        """End the step: its files are complete on disk when this returns."""
        self.stop()
        if self._writer is not None and self._dir_step == self.current_step:
            self._writer.sync()
        if self._collector is not None:
            self._collector.reset_step()
        self.current_step += 1

    # ---- internals -----------------------------------------------------------
    def _step_dir(self, step, rank_dir):
        return os.path.join(self.config.dump_path, f"step{step}", rank_dir)

    def _write_meta(self):
        if self._dir_step == self.current_step:
            self._writer.write_meta(self._collector.stacks.to_json(), {})

    def close(self):
        """Finish writing and remove every patch probe installed."""
        self.stop()
        if self._interceptor is not None:
            self._interceptor.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _close_at_exit(ref):
    debugger = ref()
    if debugger is not None:
        try:
            debugger.close()
        except Exception as exc:  # at exit, report and move on
            log.warning("probe: closing the dump failed: %s", exc)
