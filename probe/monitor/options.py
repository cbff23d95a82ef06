"""The monitor's options: keyword arguments and/or a config file's ``"monitor"`` section.

Every value is checked here, at ``Monitor(...)``, and a bad one is refused with one line
naming the key and what is allowed: nothing fails later inside a training step.
Keyword arguments win over the file.
"""
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from probe.config import read_json_config
from probe.errors import ConfigError, unknown

FORMATS = ("csv", "alerts", "tensorboard")
DUMP_LEVELS = ("L1", "mix")
DUMP_TASKS = ("statistics", "tensor")
GRAD_PRE = ("auto", True, False)


@dataclass(frozen=True)
class MonitorOptions:
    output_dir: str = "./monitor_output"
    activations: bool = False        # module outputs (and inputs): a hook per module call
    activation_inputs: bool = True   # with activations: the first tensor input too
    weights: bool = True
    gradients: bool = True
    optimizer: bool = True           # exp_avg / exp_avg_sq norms (Adam-style state)
    update_ratio: bool = False       # ||w_new - w_old|| / ||w_old||: keeps a copy of the weights, 3 passes over them
    grad_pre_reduction: object = "auto"   # "auto": when torch.distributed has more than one rank
    interval: int = 1                # log every `interval` steps (step % interval == 0)
    modules: tuple = ()              # names, substrings or "regex(...)"; empty: all
    formats: Optional[tuple] = None  # None: csv, alerts and, where tensorboard imports, tensorboard
    alert_window: int = 20           # recent values a spike is judged against
    alert_threshold: float = 10.0    # |x - median| > threshold * scale is a spike
    alert_warmup: int = 10           # values a series needs before spikes are judged
    alert_rel_floor: float = 0.02    # scale >= rel_floor * |median| (steady series have MAD ~ 0)
    dump_on_alert: bool = False      # arm a PrecisionDebugger dump of the next step(s)
    dump_level: str = "mix"
    dump_task: str = "statistics"
    dump_steps: int = 1              # how many steps each armed dump covers
    dump_max: int = 1                # how many times a dump may be armed in a run
    dump_path: Optional[str] = None  # default {output_dir}/dump
    source: str = field(default="<arguments>", compare=False)

    def wants_module(self, name):
        """Does the module or parameter owner ``name`` match ``modules``?"""
        if not self.modules:
            return True
        for item in self.modules:
            if item.startswith("regex(") and item.endswith(")"):
                if re.search(item[6:-1], name):
                    return True
            elif item == name or item in name:
                return True
        return False


KEYS = tuple(f for f in MonitorOptions.__dataclass_fields__ if f != "source")


def _fail(source, key, msg):
    raise ConfigError(f"{source}: {key}: {msg}")


def _bool(source, key, value):
    if not isinstance(value, bool):
        _fail(source, key, f"must be true or false, got {value!r}")
    return value


def _int(source, key, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        _fail(source, key, f"must be an int >= {low}, got {value!r}")
    return value


def _number(source, key, value, low, strict=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > low if strict else value >= low):
        _fail(source, key, f"must be a number {'>' if strict else '>='} {low}, got {value!r}")
    return float(value)


def _choice(source, key, value, allowed):
    if not any(type(value) is type(a) and value == a for a in allowed):
        _fail(source, key, unknown("value", value, allowed))
    return value


def _strings(source, key, value, allowed=None):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        _fail(source, key, f"must be a list of strings, got {value!r}")
    for v in value:
        if allowed is not None and v not in allowed:
            _fail(source, key, unknown("value", v, allowed))
        if allowed is None and v.startswith("regex(") and v.endswith(")"):
            try:
                re.compile(v[6:-1])
            except re.error as exc:
                _fail(source, key, f"bad regex {v!r}: {exc}")
    return tuple(dict.fromkeys(value))


def _read_section(config_path):
    raw = read_json_config(config_path)
    if not isinstance(raw.get("monitor"), dict):
        raise ConfigError(f"{config_path}: monitor: expected a \"monitor\": {{...}} section (a JSON object)")
    return raw["monitor"]


def load_options(config_path=None, **kwargs):
    """Build checked ``MonitorOptions`` from a config file's ``"monitor"`` section and kwargs."""
    source = config_path or "<arguments>"
    raw = dict(_read_section(config_path)) if config_path is not None else {}
    for key, value in kwargs.items():
        if key not in KEYS:
            raise ConfigError(f"Monitor: {unknown('keyword argument', key, KEYS)}")
        if value is not None:
            raw[key] = value
    for key in raw:
        if key not in KEYS:
            _fail(source, f"monitor.{key}", unknown("key", key, KEYS))
    cfg = {"source": source}
    for key in ("activations", "activation_inputs", "weights", "gradients", "optimizer", "update_ratio",
                "dump_on_alert"):
        if key in raw:
            cfg[key] = _bool(source, key, raw[key])
    for key, low in (("interval", 1), ("alert_window", 3), ("alert_warmup", 1), ("dump_steps", 1),
                     ("dump_max", 1)):
        if key in raw:
            cfg[key] = _int(source, key, raw[key], low)
    if "alert_threshold" in raw:
        cfg["alert_threshold"] = _number(source, "alert_threshold", raw["alert_threshold"], 0)
    if "alert_rel_floor" in raw:
        cfg["alert_rel_floor"] = _number(source, "alert_rel_floor", raw["alert_rel_floor"], 0, strict=False)
    if "grad_pre_reduction" in raw:
        cfg["grad_pre_reduction"] = _choice(source, "grad_pre_reduction", raw["grad_pre_reduction"], GRAD_PRE)
    if "dump_level" in raw:
        cfg["dump_level"] = _choice(source, "dump_level", raw["dump_level"], DUMP_LEVELS)
    if "dump_task" in raw:
        cfg["dump_task"] = _choice(source, "dump_task", raw["dump_task"], DUMP_TASKS)
    if "modules" in raw:
        cfg["modules"] = _strings(source, "modules", raw["modules"])
    if "formats" in raw:
        cfg["formats"] = _strings(source, "formats", raw["formats"], FORMATS)
    for key in ("output_dir", "dump_path"):
        if key in raw:
            if not isinstance(raw[key], (str, os.PathLike)) or not str(raw[key]):
                _fail(source, key, f"must be a non-empty path string, got {raw[key]!r}")
            cfg[key] = os.fspath(raw[key])
    opts = MonitorOptions(**cfg)
    if opts.alert_warmup > opts.alert_window:
        _fail(source, "alert_warmup", f"{opts.alert_warmup} is more than alert_window ({opts.alert_window}): "
                                      f"the window never holds that many values")
    if not (opts.activations or opts.weights or opts.gradients or opts.optimizer):
        _fail(source, "activations/weights/gradients/optimizer", "all are false: nothing to monitor")
    return opts
