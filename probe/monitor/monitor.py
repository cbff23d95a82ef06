"""Monitor: an always-on view of a training run, msprobe TrainerMon's shape.

    from probe import Monitor
    mon = Monitor(output_dir="./monitor", activations=True)
    mon.set_monitor(model, optimizer=opt)      # the training loop stays as it is
    ...
    mon.close()                                 # or: with Monitor(...) as mon: ...

Steps are counted at ``optimizer.step()`` (``mon.step()`` for loops without an optimizer).
Each logged step flows one way: hooks -> ``StepStats`` -> anomaly detector -> alerts ->
outputs (CSV, TensorBoard, alerts.jsonl) -> optionally an armed dump of the next step.
A failure anywhere in here is logged once and training goes on.
"""
import dataclasses
import logging

import torch

from probe.log_once import LogOnce
from probe.monitor.anomaly import AnomalyDetector
from probe.monitor.dump_on_alert import DumpArm, check_dump_options
from probe.monitor.hooks import TRAIN, StepStatsCollector, unwrap_optimizer
from probe.monitor.options import load_options
from probe.monitor.outputs import default_formats, open_outputs, require_tensorboard
from probe.monitor.records import StepStats
from probe.rank import current_rank

log = logging.getLogger(__name__)


class Monitor:
    """Watch a model (and optimizer): statistics per layer and step, alerts, outputs.

    ``config_path``: a JSON file with a ``"monitor"`` section; keyword options (see
    ``probe.monitor.options.MonitorOptions``) override it. Bad values raise ``ConfigError``
    here, as does ``formats`` naming tensorboard when it is not installed. Without
    ``formats``, TensorBoard files are written where tensorboard is installed.
    """

    def __init__(self, config_path=None, output_dir=None, **options):
        self.options = load_options(config_path, output_dir=output_dir, **options)
        if self.options.formats is None:
            self.options = dataclasses.replace(self.options, formats=default_formats())
        elif "tensorboard" in self.options.formats:
            require_tensorboard()
        if self.options.dump_on_alert:
            check_dump_options(self.options)
        self.detector = AnomalyDetector(self.options)
        self.failures = LogOnce(log, "probe monitor")   # a failing place said once, never raised
        self.collector = None
        self.outputs = []
        self.arm = None
        self.alerts = []          # every alert so far (also in alerts.jsonl)
        self.rank = 0

    # ---- setup -----------------------------------------------------------------------
    def set_monitor(self, model, optimizer=None, scaler=None, loss_fn=None):
        """Start watching ``model``; ``optimizer.step()`` ends each step.

        ``scaler``: a GradScaler whose scale is recorded. ``loss_fn``: an ``nn.Module``
        loss whose output is recorded as the step's loss (an HF model's ``output.loss`` is
        recorded without it; otherwise call ``log_loss``). In a distributed run call it
        after ``init_process_group``: the rank names the files.
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"set_monitor: model must be a torch.nn.Module, got {type(model).__name__}")
        if loss_fn is not None and not isinstance(loss_fn, torch.nn.Module):
            raise TypeError(f"set_monitor: loss_fn must be an nn.Module (hooked for its output), "
                            f"got {type(loss_fn).__name__}; call mon.log_loss(loss) instead")
        if self.collector is not None:
            raise RuntimeError("set_monitor: this Monitor already watches a model; make another Monitor")
        if optimizer is not None:
            optimizer = unwrap_optimizer(optimizer)
        self.rank = current_rank() or 0
        self.outputs = open_outputs(self.options, self.rank)
        if self.options.dump_on_alert:
            self.arm = DumpArm(self.options, model, self.failures)
        self.collector = StepStatsCollector(self.options, model, optimizer, scaler, loss_fn, self.rank,
                                            self._on_step, self.failures)
        return self

    @property
    def current_step(self):
        """The step in progress (0-based; counts optimizer steps)."""
        return self.collector.step if self.collector is not None else 0

    # ---- in the loop --------------------------------------------------------------------
    def step(self):
        """End a step by hand, for loops without an optimizer given to ``set_monitor``."""
        if self.collector is None:
            raise RuntimeError("Monitor.step(): call set_monitor(model) first")
        if self.collector.optimizer is not None:
            self.failures.failed("Monitor.step()", RuntimeError(
                "steps are counted at optimizer.step() already; step() is ignored"))
            return
        self.collector.manual_step()

    def log_loss(self, loss, step=None):
        """Record the loss of the step in progress (call it before ``optimizer.step()``), or
        of an earlier ``step`` (a number: written at once)."""
        self.log_scalars({"loss": loss}, step=step)

    def log_scalars(self, values, step=None, name=TRAIN):
        """Record scalars (``{"loss": ..., "learning_rate": ...}``) under ``name``."""
        c = self.collector
        if c is None:
            raise RuntimeError("Monitor: call set_monitor(model) first")
        try:
            if step is None and c.logging():
                for metric, v in values.items():
                    if metric == "loss" and name == TRAIN and isinstance(v, torch.Tensor):
                        c.add_loss(v)
                    elif isinstance(v, torch.Tensor):
                        c.buffer.add_block([(name, metric)], [(0, float("inf"), 1)], v.detach().reshape(1))
                    else:
                        c.buffer.add_host((name, metric), (0, float("inf"), 1), float(v))
            elif step is not None:
                keys = [(name, m) for m in values]
                nums = [float(v.detach().float().item() if isinstance(v, torch.Tensor) else v) for v in values.values()]
                self._on_step(StepStats(int(step), self.rank, keys, nums, [(0, float("inf"), i) for i in range(len(keys))]))
        except Exception as exc:
            self.failures.failed("log_scalars", exc)

    # ---- a logged step -------------------------------------------------------------------
    def _on_step(self, stats):
        try:
            alerts = self.detector.observe(stats)
        except Exception as exc:
            self.failures.failed("anomaly detection", exc)
            alerts = []
        self.alerts.extend(alerts)
        for out in self.outputs:
            try:
                out.write(stats, alerts)
            except Exception as exc:
                self.failures.failed(f"writing {type(out).__name__}", exc)
        if alerts and self.arm is not None:
            try:
                self.arm.arm(alerts[0], stats.step + 1, lambda: self.current_step)
            except Exception as exc:
                self.failures.failed("arming the dump", exc)

    # ---- the end ------------------------------------------------------------------------
    def close(self):
        """Remove every hook, end an armed dump, close the files."""
        if self.collector is not None:
            self.collector.close()
        if self.arm is not None:
            self.arm.close()
        for out in self.outputs:
            try:
                out.close()
            except Exception as exc:
                self.failures.failed(f"closing {type(out).__name__}", exc)
        self.outputs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
