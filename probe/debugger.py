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
from dataclasses import dataclass
from typing import Any, Optional

from probe.config import load_config
from probe.dump.collector import ApiCollector
from probe.dump.compiled_graphs import CompiledGraphs, CompileHook
from probe.dump.construct import Construct
from probe.dump.draws import DrawHandler
from probe.dump.folder_lock import FolderLock
from probe.dump.writer import DumpWriter
from probe.errors import ConfigError
from probe.hook_module.interceptor import Interceptor
from probe.hook_module.registry import load_registry, resolve
from probe.inference.token_layout import write_layout
from probe.log_once import LogOnce
from probe.rank import current_rank
from probe.seed import seed_all

log = logging.getLogger(__name__)


@dataclass
class _WholeModule:
    """A ``module_dump`` request: the module is dumped as one entry while hooked."""
    module: Any
    name: str
    handles: Optional[list] = None   # its hooks while dumping is on


class PrecisionDebugger:
    """Dump between ``start()`` and ``stop()`` at the config's level.

    L1: registered APIs (and, for a DDP or FSDP2 model given to ``start(model)``, its
    parameter gradients after the data-parallel reduction). L0: the modules of the model
    given to ``start(model)`` (or to the constructor). mix: both, with construct.json
    mapping each entry to its module. L2: aten kernels (forward and backward) via a
    dispatch mode.

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
        self._draws = None        # DrawHandler: records random draws, or replays random_from's
        self._modules = None
        self._kernels = None
        self._tracker = None
        self._construct = None
        self._graphs = None         # CompiledGraphs: the dump of compiled graphs' APIs (L1/mix)
        self._compile_hook = None   # CompileHook: inductor's compiles instrumented while it is installed
        self.forensics = None
        self._active = False
        self._started = False     # start() called and no stop() since (even on a step not dumped)
        self._step_started = False
        self._misuse_said = LogOnce(log)      # misuse kinds already said once
        self._whole = []          # module_dump requests (_WholeModule)
        self._meta_mark = None
        self._dir_step = None
        self._layout = None       # StepLayout of the current step (inference), written at step()
        self._inference = None    # inference.hf.HfGenerateHook: each forward of the model is a step
        self._folder_lock = None  # FolderLock: this process owns {dump_path}/step*/rank{R} until close()
        previous = PrecisionDebugger._current and PrecisionDebugger._current()
        if previous is not None:
            previous.close()
        PrecisionDebugger._current = weakref.ref(self)
        atexit.register(_close_at_exit, weakref.ref(self))
        self._make_dumpers()

    # ---- msprobe's interface -------------------------------------------------
    def start(self, model=None):
        """Begin (or resume) dumping the current step.

        With ``inference`` on, begin dumping ``model``'s inference instead: from here to
        ``stop()`` each forward of the model is one step (``probe.inference.hf``)."""
        if self._started:
            self._misuse("start", "start() called again without stop(): the dump goes on as one")
            if self._inference is not None and self._inference.attached:
                return
        self._started = self._step_started = True
        if model is not None:
            self.model = model
        level = self.config.level
        if self.config.inference:
            self._start_inference()
            return
        if level in ("L0", "mix") and self.model is None:
            raise ConfigError(f"{self.config.source}: level: {level} dumps modules: pass the model, "
                              f"start(model) or PrecisionDebugger(..., model=model)")
        self._open_step()

    def _open_step(self):
        if self._active:
            return
        rank = current_rank()
        if not self.config.wants_step(self.current_step) or (rank is not None and not self.config.wants_rank(rank)):
            return
        if self._writer is None:   # started again after close(): a fresh chain, the same features
            self._make_dumpers()
        if self._dir_step != self.current_step:
            self._own_folder(rank)
            self._dir_step = self.current_step
            rank_dir = self._step_dir(self.current_step, rank)
            # an inference step (one forward) is short: its folder is made at once, here
            self._writer.open_dir(rank_dir, self._with_tensors, here=self.config.inference)
            self._draws.open_step(self.current_step, rank_dir)
        self._attach()

    def stop(self):
        """Pause dumping; nothing is recorded or hooked until the next ``start()``.

        The attributes probe patches (three Tensor dunders, torch_npu functions, collectives
        once a process group exists) stay in place, passing calls straight through, until
        ``close()`` or a ``step()`` after which no step is dumped: re-patching them at every
        step costs ~50 us.
        """
        if not self._started:
            self._misuse("stop", "stop() called without start(): nothing to stop")
        if self._inference is not None:
            self._inference.detach()
        self._stop()

    def _stop(self):
        self._started = False
        self._pause()

    def _pause(self):
        if self._active:
            self._active = False
            self._detach()
            self._write_meta()

    def step(self):
        """End the step: its files are complete on disk when this returns."""
        if self.config.inference:
            self._misuse("step-inference", "inference: true: each forward of the model is a step; "
                                           "step() is not needed and does nothing")
            return
        if self._started:
            self._misuse("step", "step() called between start() and stop(): the dump stopped at "
                                 "step(); calls until the next start() are not recorded")
        elif not self._step_started:
            self._misuse("step-idle", f"step() without start() during step {self.current_step}: nothing was dumped")
        self._step_started = False
        self._stop()
        self._finish_step()

    def _end_forward_step(self):
        """Inference: the model's forward returned; its step ends (``start`` stays in force)."""
        self._pause()
        self._finish_step()

    def _finish_step(self):
        if self._compile_hook is not None and self._dir_step == self.current_step:
            self._compile_hook.after_step(self.model)
        if self._writer is not None and self._dir_step == self.current_step:
            self._write_meta(only_if_grown=True)   # backward entries that arrived after stop() add to construct.json
            self._writer.finish_step()             # dump.json says the step finished
            self._writer.sync()
            if self._layout is not None:
                write_layout(self._step_dir(self.current_step, current_rank()), self._layout)
        self._layout = None
        for part in (self._collector, self._modules, self._kernels, self._tracker, self._graphs):
            if part is not None:
                part.reset_step()
        if self._interceptor is not None and not self.config.wants_step(self.current_step + 1):
            self._interceptor.stop()   # no dump next step: the patches go until one is wanted
        self.current_step += 1
        if self._draws is not None:
            # the step's draws written next to its dump.json; a bench run (random_from) that
            # took fewer draws than the NPU run made gets its DrawMismatch here
            self._draws.end_step()

    def set_step_layout(self, layout, step=None):
        """Record an inference step's token layout (``probe.inference.token_layout.StepLayout``).

        For the current step (``step`` None) it is written as ``token_layout.json`` when the
        step ends, a later call replacing an earlier one. An earlier step's layout (the tokens
        a step produced are known only after it, to HF at the next forward) is rewritten in
        place. A step that is not dumped keeps none.
        """
        if step is None or step == self.current_step:
            if self._dir_step == self.current_step:
                self._layout = layout
                if self.config.task == "statistics":   # tensor mode: the .npy rows say it all
                    self._collector.entries.token_shape = tuple(int(n) for n in layout.token_shape)
            return
        folder = self._step_dir(step, current_rank())
        if os.path.isdir(folder):
            write_layout(folder, layout)

    def module_dump(self, module, name):
        """Dump ``module`` as one entry ``Module.{name}.{Class}``, nothing inside it."""
        import torch
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module_dump: module must be a torch.nn.Module, got {type(module).__name__}")
        if not isinstance(name, str) or not name:
            raise TypeError(f"module_dump: name must be a non-empty str, got {name!r}")
        request = _WholeModule(module, name)
        self._whole.append(request)
        if self._active:
            request.handles = self._modules.attach_whole(module, name)

    def module_dump_end(self):
        """Stop the ``module_dump`` requests made so far."""
        for request in self._whole:
            for h in request.handles or ():
                h.remove()
        self._whole = []

    # ---- internals -----------------------------------------------------------
    def _start_inference(self):
        if self.model is None or isinstance(self.model, (list, tuple)):
            raise ConfigError(f"{self.config.source}: inference: true makes each forward of the model a step: "
                              f"pass the model, start(model)")
        if self._inference is None:
            from probe.inference.hf import HfGenerateHook
            self._inference = HfGenerateHook(self._open_step, self._end_forward_step, self.set_step_layout,
                                             lambda: self.current_step, self.config.wants_step)
        self._inference.attach(self.model)

    def _misuse(self, kind, message):
        """A call-sequence mistake: said once per kind, never raised into the training loop."""
        self._misuse_said.warning(kind, "probe: %s", message)

    def _make_dumpers(self):
        """The handler chain, built once from the config:

        interceptor (registered APIs and custom ops) -> ``self.forensics`` (crash dumps,
        backward origin, meta check: ``probe.forensics``) -> the level's handler: the
        collector (L1/mix: its ``CallFilter`` decides, its ``EntryBuilder`` records), the
        API tracker (L2, where kernels are recorded by a dispatch mode) or a pass-through
        (L0, where module hooks record). Module and kernel dumpers share the collector's
        filter and entry builder. Nothing here is replaced later.
        """
        from probe import forensics
        from probe.dump.modules import ModuleDumper
        from probe.forensics.hub import ForensicsHandler, Namer, with_custom_ops
        level = self.config.level
        self._writer = DumpWriter(self.config.task, level)
        if self.config.task == "overflow_check":
            from probe.dump.overflow import OverflowCollector
            self._collector = OverflowCollector(self.config, self._writer)
        else:
            self._collector = ApiCollector(self.config, self._writer)
        if level in ("L0", "mix"):
            self._construct = Construct()
            self._collector.construct = self._construct
        self._modules = ModuleDumper(self._collector, self._construct)
        if level == "L2":
            from probe.dump.kernels import ApiTracker, KernelDumper
            self._tracker = ApiTracker()
            self._kernels = KernelDumper(self._collector, self.registry.aten, self._tracker)
            inner = self._tracker
        elif level in ("L1", "mix"):
            inner = self._collector
        else:  # L0 records modules only; APIs are still watched, for crash dumps
            inner = _call_through
        features = self.forensics.features if self.forensics is not None else ()
        self.forensics = ForensicsHandler(inner, Namer(self), features)
        # first in the chain, so that draws are recorded and replayed at every level and task
        self._draws = DrawHandler(self.forensics, self.config.random_from)
        handler = self._draws if self._draws.active else self.forensics
        self._interceptor = Interceptor(with_custom_ops(self.registry), handler)
        fresh = getattr(getattr(self._collector, "entries", None), "fresh", None)
        if fresh is not None and level in ("L1", "mix"):   # empty buffers: recorded without values
            from probe.dump.fresh_buffers import ALLOCATORS
            self._interceptor.watch_allocations(ALLOCATORS, fresh.allocated)
        if level in ("L1", "mix") and self.config.task != "overflow_check" and self._compile_hook is None:
            # registered APIs inside torch.compile'd graphs, from the next compile on
            if self._construct is None:    # L1: construct.json holds the compiled graphs' entries only
                self._construct = Construct()
            self._graphs = CompiledGraphs(self._collector, self._construct)
            self._compile_hook = CompileHook(self._graphs, self.registry.by_func, self.registry.dunders,
                                             with_tensors=self._with_tensors)
            self._compile_hook.install()
        forensics.configure(self)

    def _attach(self):
        self._active = True
        level = self.config.level
        if level in ("L0", "mix"):
            models = self.model if isinstance(self.model, (list, tuple)) else [self.model]
            self._modules.attach(models)
            if level == "mix":
                self._modules.attach_optimizer()
        elif level == "L1" and self.model is not None and self.config.task != "overflow_check" \
                and not self.config.inference:   # inference: no backward, and each forward is a step (a walk of the modules each)
            self._modules.attach_reduced(self.model)   # a DDP / FSDP2 model's reduced gradients
        for request in self._whole:
            request.handles = self._modules.attach_whole(request.module, request.name)
        if self._interceptor is not None:
            self._interceptor.start()
        if self._graphs is not None:
            self._graphs.start()
        if self._kernels is not None:
            self._kernels.start()

    def _detach(self):
        if self._graphs is not None:
            self._graphs.stop()
        if self._kernels is not None:
            self._kernels.stop()
        if self._interceptor is not None:
            self._interceptor.stop(keep_patches=True)   # close() removes them
        self._modules.detach()
        for request in self._whole:
            for h in request.handles or ():
                h.remove()
            request.handles = None

    @property
    def _with_tensors(self):
        return self.config.task in ("tensor", "overflow_check")

    def _step_dir(self, step, rank):
        return os.path.join(self.config.dump_path, f"step{step}", _rank_folder(rank))

    def _own_folder(self, rank):
        """Hold the lock of this dump_path and rank before making its first folder: a
        second process dumping there at once is refused (ConfigError), not mixed in."""
        folder = _rank_folder(rank)
        lock = self._folder_lock
        if lock is not None and lock.rank_folder == folder:
            return                   # held (or, where the OS has no lock, tried once)
        if lock is not None:         # the rank became known (process group made later)
            lock.release()
        self._folder_lock = None
        lock = FolderLock(self.config.dump_path, folder, self.config.source)
        try:
            lock.acquire()
        except ConfigError:
            self._started = self._step_started = False
            raise
        self._folder_lock = lock

    def _write_meta(self, only_if_grown=False):
        if self._dir_step != self.current_step:
            return
        construct = self._construct.tree if self._construct is not None else {}
        mark = (self.current_step, len(construct))
        if only_if_grown and mark == self._meta_mark:
            return  # nothing arrived since stop() wrote them
        self._meta_mark = mark
        self._writer.write_meta(self._collector.stacks.parts(), dict(construct))

    def close(self):
        """Finish writing and remove every patch probe installed. A step stopped (``stop()``)
        and not ended by ``step()`` is complete here; one still started (the script raised,
        or never called ``stop()``) is left marked incomplete."""
        if self._inference is not None:
            self._inference.detach()
        stopped = not self._started
        self._stop()
        if stopped and self._writer is not None and self._dir_step == self.current_step:
            self._writer.finish_step()
        if self._interceptor is not None:
            self._interceptor.close()
        if self._compile_hook is not None:
            self._compile_hook.uninstall()
            self._compile_hook = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._draws is not None:
            self._draws.close()   # after the writer: the step's folder is made by then
        if self._folder_lock is not None:
            self._folder_lock.release()   # after every file is written
            self._folder_lock = None


def _rank_folder(rank):
    return "rank" if rank is None else f"rank{rank}"


def _call_through(name, func, args, kwargs):
    return func(*args, **kwargs)


def _current():
    debugger = PrecisionDebugger._current and PrecisionDebugger._current()
    if debugger is None:
        raise RuntimeError("module_dump: create a PrecisionDebugger first")
    return debugger


def module_dump(module, dump_name):
    """msprobe's ``module_dump``: dump ``module`` as a whole with the current debugger."""
    _current().module_dump(module, dump_name)


def module_dump_end():
    """msprobe's ``module_dump_end``: end the ``module_dump`` requests."""
    _current().module_dump_end()


def _close_at_exit(ref):
    debugger = ref()
    if debugger is not None:
        try:
            debugger.close()
        except Exception as exc:  # at exit, report and move on
            log.warning("probe: closing the dump failed: %s", exc)
