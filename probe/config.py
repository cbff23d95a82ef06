"""config.json: read, checked and frozen into a ``DumpConfig``.

Every bad value is refused here, at ``PrecisionDebugger(...)``, with one line that names
the file, the key and what is allowed; nothing fails later deep inside a training step.
Keys and meanings follow msprobe's config.json so existing files keep working.
"""
import json
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Optional

from probe.errors import ConfigError, unknown
from probe.int_ranges import IntRanges

TASKS = ("statistics", "tensor", "overflow_check", "meta_check")
# Sections msprobe configs may carry for tasks probe does not run: accepted, ignored.
OTHER_TASK_SECTIONS = ("free_benchmark", "run_ut", "grad_probe", "structure",
                       "exception_dump")
LEVELS = ("L0", "L1", "L2", "mix")
DATA_MODES = ("all", "forward", "backward", "input", "output")
SUMMARY_MODES = ("statistics", "md5")
FILE_FORMATS = ("npy", "pt")   # pt: torch.save'd CPU tensors, as msprobe writes for PyTorch
TOP_KEYS = ("task", "dump_path", "rank", "step", "level", "seed", "is_deterministic",
            "enable_dataloader", "async_dump", "wrap_ops_yaml", "framework", "precision",
            "backward_origin", "random_from", "inference")
SECTION_KEYS = ("scope", "list", "data_mode", "summary_mode", "file_format", "backward_input",
                "online_run_ut", "nfs_path", "host", "port", "overflow_nums", "check_mode")
_PATH_RE = re.compile(r"^[A-Za-z0-9_./\-]+$")


@dataclass(frozen=True)
class DumpConfig:
    task: str = "statistics"
    dump_path: str = "./dump_path"
    rank: IntRanges = IntRanges()   # empty: every rank
    step: IntRanges = IntRanges()   # empty: every step; ranges kept as (lo, hi), never expanded
    level: str = "L1"
    seed: Optional[int] = None  # None: leave the RNGs alone
    is_deterministic: bool = False
    enable_dataloader: bool = False
    async_dump: bool = True    # on an accelerator: statistics fetched at flushes, not per call
    backward_origin: bool = False   # name the forward API behind a failing backward (costs ~40 us/call)
    wrap_ops_yaml: Optional[str] = None
    random_from: Optional[str] = None   # an NPU dump root whose random draws this (bench) run takes
    inference: bool = False     # each forward of start(model)'s model is a step (probe.inference)
    scope: tuple = ()
    list: tuple = ()
    data_mode: tuple = ("all",)
    summary_mode: str = "statistics"
    file_format: str = "npy"
    overflow_nums: int = 1      # overflow_check: how many overflowing calls to dump, -1 = all
    source: str = "<arguments>"

    def wants_step(self, step):
        return not self.step or step in self.step

    def wants_rank(self, rank):
        return not self.rank or rank in self.rank


def _fail(source, key, msg):
    raise ConfigError(f"{source}: {key}: {msg}")


_MAX_INDEX = 2 ** 63 - 1     # a step or rank past this is a typo, not a plan
_RANGE_RE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")


def _shown(item):
    """``item`` as a message shows it: at most 60 characters (an int past str()'s digit
    limit is named by its size)."""
    if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > 200:
        return f"<an int of {item.bit_length()} bits>"
    text = repr(item)
    return text if len(text) <= 60 else text[:57] + "..."


def _index(source, key, item, text):
    """``text`` (ASCII digits) as an int in [0, _MAX_INDEX]: a 5000-digit number is refused
    here in one line, not by int()'s digit limit as a traceback."""
    if len(text) > 19 or int(text) > _MAX_INDEX:
        _fail(source, key, f"bad item {_shown(item)}: past the largest {key} allowed ({_MAX_INDEX})")
    return int(text)


def _parse_ranges(source, key, value, ranges_allowed):
    """A list of ints (and, for ``step``, ``"a-b"`` ranges, both ends included) as
    ``IntRanges``: a range is kept as its two ends, whatever its width."""
    what = "ints >= 0 or 'a-b' ranges" if ranges_allowed else "ints >= 0"
    if not isinstance(value, list):
        _fail(source, key, f"must be a list of {what}, got {_shown(value)}")
    pairs = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str)) or (isinstance(item, str) and not ranges_allowed):
            _fail(source, key, f"bad item {_shown(item)}; use {what}")
        if isinstance(item, int):
            if item < 0:
                _fail(source, key, f"bad item {_shown(item)}; {key}s are >= 0")
            if item > _MAX_INDEX:
                _fail(source, key, f"bad item {_shown(item)}: past the largest {key} allowed ({_MAX_INDEX})")
            pairs.append((item, item))
            continue
        m = _RANGE_RE.fullmatch(item)
        if not m:
            _fail(source, key, f"bad item {_shown(item)}; use {what}")
        lo = _index(source, key, item, m.group(1))
        hi = lo if m.group(2) is None else _index(source, key, item, m.group(2))
        if hi < lo:
            _fail(source, key, f"bad range {_shown(item)}: start is after end")
        pairs.append((lo, hi))
    return IntRanges.of(pairs)


def _parse_steps(source, value):
    return _parse_ranges(source, "step", value, ranges_allowed=True)


def _parse_ranks(source, value):
    ranks = _parse_ranges(source, "rank", value, ranges_allowed=False)
    world = os.environ.get("WORLD_SIZE")
    if ranks and world and world.isdigit() and ranks.first >= int(world):
        _fail(source, "rank", f"{ranks} can never match: WORLD_SIZE is {world}")
    return ranks


def _check_list(source, key, value, allowed=None):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        _fail(source, key, f"must be a list of strings, got {value!r}")
    if allowed is not None:
        bad = [v for v in value if v not in allowed]
        if bad:
            _fail(source, key, unknown("value", bad[0], allowed))
    return tuple(value)


def _check_bool(source, key, value):
    if not isinstance(value, bool):
        _fail(source, key, f"must be true or false, got {value!r}")
    return value


def _check_dump_path(source, value):
    if not isinstance(value, str) or not value:
        _fail(source, "dump_path", f"must be a non-empty string, got {value!r}")
    if not _PATH_RE.match(value):
        _fail(source, "dump_path", f"{value!r} has characters outside letters, digits, '_ . / -'")
    if os.path.exists(value) and not os.path.isdir(value):
        _fail(source, "dump_path", f"{value!r} is a file: a folder is needed")
    try:
        os.makedirs(value, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=value):
            pass
    except OSError as exc:
        _fail(source, "dump_path", f"{value!r} is not writable ({exc.strerror or exc})")
    return value


def _check_random_from(source, value, dump_path):
    """An NPU dump root: a folder holding step folders, and not this run's own dump_path
    (the bench would overwrite the draws it replays)."""
    if not isinstance(value, str) or not value:
        _fail(source, "random_from", f"must be the path of an NPU dump folder, got {value!r}")
    if not os.path.isdir(value):
        _fail(source, "random_from", f"{value!r} is not a folder")
    try:
        names = os.listdir(value)
    except OSError as exc:
        _fail(source, "random_from", f"{value!r} is not readable ({exc.strerror or exc})")
    if not any(re.fullmatch(r"step\d+", d) and os.path.isdir(os.path.join(value, d)) for d in names):
        _fail(source, "random_from", f"{value!r} holds no step folders (step0, step1, ...): give the NPU run's dump_path")
    if os.path.realpath(value) == os.path.realpath(dump_path):
        _fail(source, "random_from", f"{value!r} is this run's dump_path: the bench would overwrite the draws it replays")
    return value


def _check_list_filters(source, items):
    for item in items:
        if item.startswith("regex(") and item.endswith(")"):
            try:
                re.compile(item[6:-1])
            except re.error as exc:
                _fail(source, "list", f"bad regex {item!r}: {exc}")
    return items


def read_json_config(config_path) -> dict:
    """The JSON object in ``config_path``; a one-line ConfigError naming the file otherwise
    (the dump's config and the monitor's section are read alike)."""
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config_path: file not found: {config_path}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:   # not UTF-8, an int past int()'s digit limit, deep nesting
        raise ConfigError(f"{config_path}: unreadable JSON ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{config_path}: expected a JSON object")
    return raw


def _check_wrap_ops_yaml(source, value, base):
    """The registry's path: relative to ``base`` (the config file's folder; the working
    directory for a keyword argument), so a project folder can move with its config."""
    if not isinstance(value, str) or not value:
        _fail(source, "wrap_ops_yaml", f"must be a path string, got {value!r}")
    path = os.path.join(base, value) if base and not os.path.isabs(value) else value
    if not os.path.isfile(path):
        where = "" if path == value else f" (relative to {base}: {path})"
        _fail(source, "wrap_ops_yaml", f"{value!r}{where} is not a file: give the path of a support_wrap_ops.yaml")
    return path


def load_config(config_path=None, **overrides):
    """Build a DumpConfig from a config.json and keyword overrides (which win). A relative
    ``wrap_ops_yaml`` in the file is relative to the file's folder; ``dump_path`` stays
    relative to the working directory (msprobe's meaning)."""
    source = config_path or "<arguments>"
    raw = {}
    if config_path is not None:
        raw = read_json_config(config_path)
    top, keywords = _top_level(raw, overrides, source)

    def src(key):   # a bad value given as a keyword argument is not "in the file"
        return "PrecisionDebugger keyword argument" if key in keywords else source
    cfg = _check_top_level(top, src, source, config_path, keywords)
    cfg.update(_check_task_section(raw, cfg["task"], source))
    if cfg["task"] == "overflow_check" and cfg["level"] != "L1":
        _fail(src("level"), "level", f"task overflow_check works at level L1, got {cfg['level']!r}")
    return DumpConfig(**cfg)


def _top_level(raw, overrides, source):
    """(top-level keys of the file with the keyword arguments over them, the keywords given)."""
    top = {k: v for k, v in raw.items() if k not in TASKS + OTHER_TASK_SECTIONS}
    for key in top:
        if key not in TOP_KEYS:
            _fail(source, key, unknown("key", key, TOP_KEYS + TASKS))
    for key, value in overrides.items():
        if key not in TOP_KEYS:
            raise ConfigError(f"PrecisionDebugger: {unknown('keyword argument', key, TOP_KEYS)}")
        if value is not None:
            top[key] = value
    return top, {k for k, v in overrides.items() if v is not None}


def _check_top_level(top, src, source, config_path, keywords) -> dict:
    """The checked top-level settings (task, level, dump_path, rank, step, ...)."""
    task = top.get("task", "statistics")
    if task not in TASKS:
        _fail(src("task"), "task", unknown("task", task, TASKS))
    level = top.get("level", "L1")
    if level not in LEVELS:
        _fail(src("level"), "level", unknown("level", level, LEVELS))
    cfg = {"task": task, "level": level, "source": source}
    cfg["dump_path"] = _check_dump_path(src("dump_path"), top.get("dump_path", "./dump_path"))
    if "rank" in top:
        cfg["rank"] = _parse_ranks(src("rank"), top["rank"])
    if "step" in top:
        cfg["step"] = _parse_steps(src("step"), top["step"])
    if "seed" in top:
        if isinstance(top["seed"], bool) or not isinstance(top["seed"], int) or not 0 <= top["seed"] < 2 ** 32:
            _fail(src("seed"), "seed", f"must be an int in [0, 2**32), got {top['seed']!r}")
        cfg["seed"] = top["seed"]
    for key in ("is_deterministic", "enable_dataloader", "async_dump", "backward_origin", "inference"):
        if key in top:
            cfg[key] = _check_bool(src(key), key, top[key])
    if top.get("wrap_ops_yaml") is not None:
        in_file = config_path is not None and "wrap_ops_yaml" not in keywords
        cfg["wrap_ops_yaml"] = _check_wrap_ops_yaml(src("wrap_ops_yaml"), top["wrap_ops_yaml"],
                                                    os.path.dirname(os.path.abspath(config_path)) if in_file else None)
    if top.get("random_from") is not None:
        cfg["random_from"] = _check_random_from(src("random_from"), top["random_from"], cfg["dump_path"])
    if top.get("framework", "pytorch") != "pytorch":
        _fail(src("framework"), "framework", f"only 'pytorch' is supported, got {top['framework']!r}")
    return cfg


def _check_task_section(raw, task, source) -> dict:
    """The checked settings of the task's own section (scope, list, data_mode, ...)."""
    section = raw.get(task)
    if section is None:
        section = {}
    if not isinstance(section, dict):
        _fail(source, task, "task section must be a JSON object")
    for key in section:
        if key not in SECTION_KEYS:
            _fail(source, f"{task}.{key}", unknown("key", key, SECTION_KEYS[:5]))
    cfg: dict = {}
    if "scope" in section:
        scope = _check_list(source, f"{task}.scope", section["scope"])
        if len(scope) not in (0, 2):
            _fail(source, f"{task}.scope", f"give [first, last] entry names, got {list(scope)!r}")
        cfg["scope"] = scope
    if "list" in section:
        cfg["list"] = _check_list_filters(source, _check_list(source, f"{task}.list", section["list"]))
    if "data_mode" in section:
        modes = _check_list(source, f"{task}.data_mode", section["data_mode"], DATA_MODES)
        cfg["data_mode"] = modes or ("all",)
    if "overflow_nums" in section:
        n = section["overflow_nums"]
        if isinstance(n, bool) or not isinstance(n, int) or (n < 1 and n != -1):
            _fail(source, f"{task}.overflow_nums", f"must be an int >= 1, or -1 for all, got {n!r}")
        cfg["overflow_nums"] = n
    for key, allowed in (("summary_mode", SUMMARY_MODES), ("file_format", FILE_FORMATS)):
        if key in section:
            if section[key] not in allowed:
                _fail(source, f"{task}.{key}", unknown("value", section[key], allowed))
            cfg[key] = section[key]
    return cfg

