"""Where a logged step goes: a CSV per rank, TensorBoard event files per rank, alerts.jsonl.

- ``{output_dir}/metrics_rank{R}.csv``: one row per (step, name) with a column per metric,
  flushed after each logged step, so a crash leaves a valid file up to the last step.
- ``{output_dir}/tensorboard/rank{R}/``: a scalar per (step, name, metric), tag
  ``{name}/{metric}``, through the ``tensorboard`` package's writer (``pip install
  probe[monitor]``); alerts add ``alerts/count``. Written by default where tensorboard
  imports (as msprobe's monitor does); ``formats`` without it turns it off.
- ``{output_dir}/alerts.jsonl``: one JSON object per alert; all ranks append to the same
  file, each line with a single ``write`` on an ``O_APPEND`` descriptor (lines of
  different ranks never interleave).
"""
import csv
import json
import logging
import os

from probe.compare.xlsx.cells import csv_field, csv_numbers
from probe.errors import ConfigError
from probe.monitor.summaries import ACT_METRICS

log = logging.getLogger(__name__)

SCALAR_METRICS = ("loss", "loss_scale", "learning_rate")
DEFAULT_FORMATS = ("csv", "alerts")     # and tensorboard, where it imports: default_formats()


def csv_columns(options):
    cols = []
    if options.activations:
        cols += [f"output_{m}" for m in ACT_METRICS]
        if options.activation_inputs:
            cols += [f"input_{m}" for m in ACT_METRICS]
    if options.weights:
        cols.append("weight_norm")
    if options.gradients:
        cols += ["grad_norm", "grad_norm_pre"]
    if options.optimizer:
        cols += ["exp_avg_norm", "exp_avg_sq_norm"]
    if options.update_ratio:
        cols.append("update_ratio")
    cols += [m for m in SCALAR_METRICS + ("grad_norm",) if m not in cols]
    return cols


def require_tensorboard():
    """(FileWriter, Summary): tensorboard's event writer and proto, or one line saying what to install."""
    try:
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter
    except ImportError:
        raise ConfigError("formats: 'tensorboard' needs the tensorboard package: pip install probe[monitor] "
                          "(or pip install tensorboard)") from None
    return FileWriter, Summary


def default_formats():
    """The formats of a monitor given none: csv and alerts, and tensorboard where the
    package imports (said once in the log either way)."""
    try:
        require_tensorboard()
    except ConfigError:
        log.info("probe monitor: no TensorBoard files: tensorboard is not installed "
                 "(pip install probe[monitor]); writing csv and alerts")
        return DEFAULT_FORMATS
    return DEFAULT_FORMATS + ("tensorboard",)


class CsvOutput:
    """Rows of ``step,rank,name,<a column per metric>``, as ``csv.writer`` writes them.

    Where each value goes is worked out once per set of keys (a run repeats them every
    logged step) and the texts are the compare CSV's (``compare.xlsx.cells``: floats by
    orjson, shortest round-trip text): ~4x cheaper than building dict rows for
    ``csv.writer`` each step.
    """

    def __init__(self, path, columns):
        self.columns = columns
        self.pos = {c: i for i, c in enumerate(columns)}
        self.file = open(path, "w", newline="", encoding="utf-8")
        csv.writer(self.file).writerow(["step", "rank", "name"] + columns)
        self.file.flush()
        self._keys = None
        self._names = []         # each row's name, as a CSV field
        self._slots = []         # per key: (row, column) or None (a metric without a column)

    def _layout(self, keys):
        rows, slots = {}, []
        for name, metric in keys:
            i = self.pos.get(metric)
            if i is None:
                slots.append(None)
                continue
            slots.append((rows.setdefault(name, len(rows)), i))
        self._names = [csv_field(name) for name in rows]
        self._slots = slots
        self._keys = list(keys)

    def write(self, stats, alerts):
        if stats.keys != self._keys:
            self._layout(stats.keys)
        n = len(self.columns)
        cells = [[""] * n for _ in self._names]
        for slot, text in zip(self._slots, csv_numbers(stats.values)):
            if slot is not None:
                cells[slot[0]][slot[1]] = text
        head = f"{stats.step},{stats.rank},"
        self.file.write("".join(f"{head}{name},{','.join(row)}\r\n" for name, row in zip(self._names, cells)))
        self.file.flush()

    def close(self):
        self.file.close()


class TensorBoardOutput:
    """One event per logged step holding all its scalars (``SummaryWriter.add_scalar`` writes
    an event per value: ~10x the cost for a few hundred values a step)."""

    def __init__(self, log_dir):
        file_writer, self.summary = require_tensorboard()
        self.writer = file_writer(log_dir)
        self.tags = {}

    def write(self, stats, alerts):
        value = self.summary.Value
        tags = self.tags
        values = []
        for key, v in zip(stats.keys, stats.values):
            tag = tags.get(key)
            if tag is None:
                tag = tags[key] = f"{key[0]}/{key[1]}"
            values.append(value(tag=tag, simple_value=v))
        if alerts:
            values.append(value(tag="alerts/count", simple_value=len(alerts)))
        self.writer.add_summary(self.summary(value=values), stats.step)

    def close(self):
        self.writer.close()


class AlertOutput:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, stats, alerts):
        for a in alerts:
            os.write(self.fd, (json.dumps(a.as_json()) + "\n").encode("utf-8"))

    def close(self):
        os.close(self.fd)


def open_outputs(options, rank):
    """The outputs ``options.formats`` asks for, files created now."""
    out_dir = options.output_dir
    os.makedirs(out_dir, exist_ok=True)
    outputs = []
    for fmt in options.formats:
        if fmt == "csv":
            outputs.append(CsvOutput(os.path.join(out_dir, f"metrics_rank{rank}.csv"), csv_columns(options)))
        elif fmt == "tensorboard":
            log_dir = os.path.join(out_dir, "tensorboard", f"rank{rank}")
            outputs.append(TensorBoardOutput(log_dir))
            log.info("probe monitor: TensorBoard event files in %s (tensorboard --logdir %s); "
                     "formats without 'tensorboard' turns them off", log_dir, os.path.dirname(log_dir))
        elif fmt == "alerts":
            outputs.append(AlertOutput(os.path.join(out_dir, "alerts.jsonl")))
    return outputs
