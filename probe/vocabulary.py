"""The dump's vocabulary: what its names, keys, verdicts and compare columns are called.

Everything that reads or writes a dump takes these words from here; a new statistic or a
new compare column is one edit here (plus its computation: see docs/where-to-change.md).

**Entry names** (msprobe's grammar, which probe writes and reads):

* an API call: ``{Prefix}.{api}.{N}.{forward|backward}`` (``Functional.linear.0.forward``;
  the API may hold dots: ``Torch.linalg.norm.0.forward``; ``Aten.mm.default.0.forward``);
* a module call: ``Module.{path}.{Class}.{forward|backward}.{N}``
  (``Module.blocks.0.fc1.Linear.forward.0``);
* a module's parameter gradients: ``Module.{path}.{Class}.parameters_grad[.{N}]``;
* a call without its direction, as ``scope`` and ``repro`` take it: ``Functional.linear.0``.

A compare row adds what part of the entry it is: ``.input.{i}`` / ``.input.{kwarg}`` /
``.output.{i}`` / ``.parameters.{name}``, nested lists adding ``.{j}``; a parameter
gradient's row adds ``.{parameter name}``. ``parse_entry_name`` reads all of these into an
:class:`EntryName`; nothing else in probe parses them.

No torch and no numpy here: the CLI's help and compare import this.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Optional

import msgspec

# ---------------------------------------------------------------- entry names

# The registry's sections (support_wrap_ops.yaml) and the entry-name prefix each gives.
SECTION_PREFIX = {
    "functional": "Functional",
    "tensor": "Tensor",
    "torch": "Torch",
    "torch_npu": "NPU",
    "distributed": "Distributed",
    "_VF": "VF",
    "aten": "Aten",
    "custom": "Custom",      # torch.ops operators outside torch (hook_module/custom_ops.py)
}
PREFIX_SECTION = {prefix: section for section, prefix in SECTION_PREFIX.items()}
MODULE = "Module"            # a module's entries
CUSTOM = "Custom"            # a custom op's (``Custom.{namespace}.{op}``)

FORWARD, BACKWARD, PARAMETERS_GRAD = "forward", "backward", "parameters_grad"
DIRECTIONS = (FORWARD, BACKWARD, PARAMETERS_GRAD)
INPUT, OUTPUT, PARAMETERS = "input", "output", "parameters"
IO_PARTS = (INPUT, PARAMETERS, OUTPUT, PARAMETERS_GRAD)     # msprobe's row order within an entry
# dump.json keys of an entry -> the io part of its rows
ENTRY_KEYS = (("input_args", INPUT), ("input_kwargs", INPUT), ("input", INPUT),
              ("parameters", PARAMETERS), ("output", OUTPUT))

# Non-obvious in-place dunders (``a += b``, ``a[i] = v``).
INPLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__",
                             "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
                             "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "__setitem__"})


# APIs that write arguments although their names don't say so: batch norm's running
# statistics, updated in the kernel without a version bump (native_batch_norm's schema
# marks no mutation). name -> ((position, keyword), ...) of what the call writes.
_RUNNING_FUNCTIONAL = ((1, "running_mean"), (2, "running_var"))
_RUNNING_TORCH = ((3, "running_mean"), (4, "running_var"))
HIDDEN_WRITES = {
    "Functional.batch_norm": _RUNNING_FUNCTIONAL,
    "Functional.instance_norm": _RUNNING_FUNCTIONAL,
    "Torch.batch_norm": _RUNNING_TORCH,
    "Torch.instance_norm": _RUNNING_TORCH,
    "Torch.native_batch_norm": _RUNNING_TORCH,
    "Torch._batch_norm_impl_index": _RUNNING_TORCH,
    "Torch._native_batch_norm_legit": _RUNNING_TORCH,
}


def in_place(leaf: str) -> bool:
    """Whether the API named ``leaf`` (``add_``, ``_foreach_mul_``, ``__iadd__``) writes its
    first argument: torch's naming says so."""
    return leaf in INPLACE_DUNDERS or (leaf.endswith("_") and not leaf.endswith("__"))


class EntryName(msgspec.Struct, frozen=True, gc=False):
    """One parsed entry (or row) name. ``Functional.linear.3.forward.input.0`` is
    prefix ``Functional``, api ``linear``, index 3, direction ``forward``, io ``input``,
    arg_path ``0``; a module's api is its path and class (``blocks.0.fc1.Linear``).
    Untracked by the cyclic collector (strings and an int): the diagnosis keeps one per
    call, 100k on bench/compare.py's big pair."""
    prefix: str                 # Functional / Tensor / Torch / ... / Module / Custom
    api: str                    # "linear", "linalg.norm"; a module: "blocks.0.fc1.Linear"
    index: Optional[int]        # the call counter; None where the name has none
    direction: str              # forward / backward / parameters_grad; "" in a call's base name
    io: str = ""                # a row's part: input / output / parameters / parameters_grad
    arg_path: str = ""          # a row's argument: "0", "0.1", "weight", a kwarg's name

    @property
    def is_module(self) -> bool:
        return self.prefix == MODULE

    @property
    def qualified(self) -> str:
        """``Functional.linear``: the API (or module) without call counter and direction."""
        return f"{self.prefix}.{self.api}"

    @property
    def leaf(self) -> str:
        """The last name part (``norm`` of ``linalg.norm``; a module's class)."""
        return self.api.rsplit(".", 1)[-1]

    @property
    def base(self) -> str:
        """One call without its direction: ``Functional.linear.0``, ``Module.a.Linear.0``
        (a call's ``scope`` key; the key of run-ut's result CSV)."""
        if self.index is None:
            return self.qualified
        return f"{self.prefix}.{self.api}.{self.index}"

    @property
    def entry(self) -> str:
        """The entry name (a row's name without its io part and argument)."""
        if not self.direction:
            return self.base
        if self.is_module:
            tail = "" if self.index is None else f".{self.index}"
            return f"{self.qualified}.{self.direction}{tail}"
        return f"{self.base}.{self.direction}"

    @property
    def key(self) -> str:
        """The entry without its call counter (``Functional.linear.forward``): what the
        k-th call of an API on each side has in common (fuzzy matching, alignment)."""
        return f"{self.qualified}.{self.direction}" if self.direction else self.qualified

    @property
    def module_path(self) -> str:
        """A module's path (``blocks.0.fc1``); "" for an API."""
        return self.api.rpartition(".")[0] if self.is_module else ""

    @property
    def module_class(self) -> str:
        """A module's class name (``Linear``); "" for an API."""
        return self.api.rpartition(".")[2] if self.is_module else ""


def _row_part(direction: str, rest: list) -> Optional[tuple]:
    """(io, arg path) of what follows an entry name, or None when it is no row suffix."""
    if not rest:
        return "", ""
    if direction == PARAMETERS_GRAD:
        return PARAMETERS_GRAD, ".".join(rest)
    if rest[0] in (INPUT, OUTPUT, PARAMETERS) and len(rest) > 1:
        return rest[0], ".".join(rest[1:])
    return None


def _parse_module(parts: list) -> Optional[EntryName]:
    for d in range(3, len(parts)):          # Module . path... . Class . direction
        direction = parts[d]
        if direction not in DIRECTIONS:
            continue
        rest = parts[d + 1:]
        index = None
        if rest and rest[0].isdigit():
            index, rest = int(rest[0]), rest[1:]
        part = _row_part(direction, rest)
        if part is not None:
            return EntryName(MODULE, ".".join(parts[1:d]), index, direction, *part)
    if len(parts) >= 4 and parts[-1].isdigit():     # a module call's base: Module.a.Linear.0
        return EntryName(MODULE, ".".join(parts[1:-1]), int(parts[-1]), "")
    return None


def _parse_api(parts: list) -> Optional[EntryName]:
    for d in range(3, len(parts)):          # Prefix . api... . N . direction
        direction = parts[d]
        if direction not in (FORWARD, BACKWARD) or not parts[d - 1].isdigit():
            continue
        part = _row_part(direction, parts[d + 1:])
        if part is not None:
            return EntryName(parts[0], ".".join(parts[1:d - 1]), int(parts[d - 1]), direction, *part)
    if len(parts) >= 3 and parts[-1].isdigit():     # a call's base: Functional.linear.0
        return EntryName(parts[0], ".".join(parts[1:-1]), int(parts[-1]), "")
    return None


def parse_entry_name(name: str) -> Optional[EntryName]:
    """The :class:`EntryName` of an entry, row or base name; None where ``name`` does not
    follow the grammar (the module docstring).

    An API call's entry name (``Functional.linear.3.forward``, most of a dump's names) is
    read from its end without the cache: a 100k-call pair has more distinct names than
    the cache holds, and each went through it missing (0.6 s of its diagnosis)."""
    if type(name) is str:
        head, _, last = name.rpartition(".")
        if last == FORWARD or last == BACKWARD:
            base, _, index = head.rpartition(".")
            api = _api_bases.get(base)
            if api is None:
                api = _api_base(base)
            if api and index.isdigit():
                return EntryName(api[0], api[1], int(index), last)
    return _parse_cached(name)


_api_bases: dict = {}       # "Prefix.api" -> (prefix, api), or () where the fast path can't read it


def _api_base(base: str) -> tuple:
    """(prefix, api) of an API call's base without its counter (``Functional.linear``),
    worked out once per API: a dump's 100k names have a few hundred."""
    prefix, _, api = base.partition(".")
    ok = api and prefix != MODULE and _PREFIX_OK(prefix) and ".." not in base \
        and not api.endswith(".") and not _ROW_MARK.search(base)
    parts = (prefix, api) if ok else ()
    if len(_api_bases) < 1 << 16:
        _api_bases[base] = parts
    return parts


_PREFIX_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z").match
# A part after which the grammar reads a row (``.input.``, ``.output.``, ``.parameters.``):
# such a name goes the general way, which looks for the first direction it can.
_ROW_MARK = re.compile(r"\.(?:forward|backward|parameters_grad)\.")


@functools.lru_cache(maxsize=1 << 16)
def _parse_cached(name: str) -> Optional[EntryName]:
    if not isinstance(name, str):
        return None
    parts = name.split(".")
    prefix = parts[0]
    if len(parts) < 3 or not prefix or not (prefix[0].isalpha() or prefix[0] == "_") \
            or not prefix.replace("_", "a").isalnum() or "" in parts:
        return None
    return _parse_module(parts) if prefix == MODULE else _parse_api(parts)


def api_name(name: str) -> Optional[EntryName]:
    """An API call's entry name (``{Prefix}.{api}.{N}.{forward|backward}``, no row part)
    parsed, else None (a module's entry, a row, a base name, another shape)."""
    n = parse_entry_name(name)
    if n is None or n.is_module or n.io or n.direction not in (FORWARD, BACKWARD):
        return None
    return n


def direction(name: str) -> str:
    """forward / backward / parameters_grad of an entry or row name; "" when it has none."""
    n = parse_entry_name(name)
    return n.direction if n is not None else ""


def entry_key(name: str) -> str:
    """The entry name without its call counter (``Functional.linear.forward``,
    ``Module.a.Linear.forward``); a name outside the grammar as it is."""
    n = parse_entry_name(name)
    return n.key if n is not None and n.direction and not n.io else name


def scope_key(name: str) -> str:
    """A call's name without its direction (``Functional.linear.0``,
    ``Module.a.Linear.0``): either direction of a call names the same scope."""
    n = parse_entry_name(name)
    if n is None or n.io or n.direction not in (FORWARD, BACKWARD):
        return name
    return n.base


def module_label(name: Optional[str]) -> Optional[str]:
    """``Module.blocks.0.fc1.Linear.forward.0`` -> ``blocks.0.fc1 (Linear)``; another
    name as it is."""
    if not name:
        return None
    n = parse_entry_name(name)
    if n is None or not n.is_module or not n.direction or n.io or not n.module_path:
        return name
    return f"{n.module_path} ({n.module_class})"


def forward_of(name: str) -> Optional[str]:
    """The forward entry of a backward one (``...0.backward`` -> ``...0.forward``,
    ``Module.a.Linear.backward.0`` -> ``...forward.0``); None for another name."""
    n = parse_entry_name(name)
    if n is None or n.io or n.direction != BACKWARD:
        return None
    return EntryName(n.prefix, n.api, n.index, FORWARD).entry


def backward_of(name: str) -> Optional[str]:
    """The backward entry of a forward one; None for another name."""
    n = parse_entry_name(name)
    if n is None or n.io or n.direction != FORWARD:
        return None
    return EntryName(n.prefix, n.api, n.index, BACKWARD).entry


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Statistic:
    """One tensor statistic: its dump.json key and the compare columns made of it."""
    key: str          # dump.json key of a tensor's summary
    column: str       # compare's "NPU {column}" / "Bench {column}"
    diff: str         # compare's difference column (statistics mode)
    relative: str     # compare's relative difference column (statistics mode, a percentage)


# The order is the dump's (the C summary writes them so) and compare's.
STATISTICS = (
    Statistic("Max", "max", "Max diff", "MaxRelativeErr"),
    Statistic("Min", "min", "Min diff", "MinRelativeErr"),
    Statistic("Mean", "mean", "Mean diff", "MeanRelativeErr"),
    Statistic("Norm", "l2norm", "L2norm diff", "NormRelativeErr"),
)
STAT_KEYS = tuple(s.key for s in STATISTICS)           # ("Max", "Min", "Mean", "Norm")
MAX, MIN, MEAN, NORM = STAT_KEYS[:4]                   # the ones read by name (ranges, scales)
NO_STATS = dict.fromkeys(STAT_KEYS)                    # a summary's statistics before they are known

# ---------------------------------------------------------------- verdicts and statuses

# A compare row's Result (verdict.Verdict), worst last.
PASS, WARNING, ERROR = "pass", "warning", "error"
RESULTS = (PASS, WARNING, ERROR)
# A call's status in the diagnosis (diagnosis.CallDiag.status).
CALL_STATUSES = ("clean", "introduces", "inherits", "can't tell", "draw", "unmatched", "not compared")
# The statuses the report page tells apart, in its order (the others show as its first).
PAGE_STATUSES = ("clean", "introduces", "inherits", "unmatched", "not compared")
# A step/rank pair's verdict in a whole-run compare (the run's grid). "cant_tell": no
# introduction found, but calls statistics could not judge (causality.unjudged_calls).
RUN_VERDICTS = ("clean", "introduces", "inherits", "inputs_differ", "cant_tell", "not_compared", "missing", "failed")

# ---------------------------------------------------------------- compare columns

BASE_COLUMNS = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                "Bench Tensor Shape", "NPU Requires_grad", "Bench Requires_grad"]
STAT_COLUMNS = [f"{side} {s.column}" for side in ("NPU", "Bench") for s in STATISTICS]
TENSOR_METRICS = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr",
                  "One Thousandth Err Ratio", "Five Thousandths Err Ratio"]
STAT_DIFFS = [s.diff for s in STATISTICS] + [s.relative for s in STATISTICS]
MD5_COLUMNS = ["NPU MD5", "BENCH MD5"]
TAIL_COLUMNS = ["Requires_grad Consistent", "Result", "Err_message"]
ERR_TOLERANCE = "Err/Tolerance"      # a row's worst error over its tolerance
EXTRA_COLUMNS = ["Direction", "Tolerance Dtype", ERR_TOLERANCE, "Match"]   # probe's own, after msprobe's
PERCENT_COLUMNS = {s.relative for s in STATISTICS}
BOOLEAN_COLUMNS = ["NPU Requires_grad", "Bench Requires_grad", "Requires_grad Consistent"]
NUMBER_COLUMNS = TENSOR_METRICS + STAT_DIFFS + STAT_COLUMNS + [ERR_TOLERANCE]
# The metrics of a row that the summary json and the report page carry, per compare mode.
SUMMARY_METRICS = {
    "tensor": TENSOR_METRICS + [ERR_TOLERANCE],
    "statistics": STAT_DIFFS + [ERR_TOLERANCE],
}
PAGE_METRICS = {
    "statistics": [s.diff for s in STATISTICS] + ["NormRelativeErr", ERR_TOLERANCE],
    "tensor": ["Cosine", "MaxAbsErr", "MaxRelativeErr", "EucDist", ERR_TOLERANCE],
    "md5": MD5_COLUMNS,
}


def columns_for(mode: str, stack_mode: bool) -> list:
    """A compare table's columns for ``mode`` (tensor / statistics / md5): msprobe's, then ours."""
    stack = ["NPU_Stack_Info"] if stack_mode else []
    if mode == "tensor":
        return BASE_COLUMNS + TENSOR_METRICS + STAT_COLUMNS + TAIL_COLUMNS + stack + ["Data_name"] + EXTRA_COLUMNS
    if mode == "md5":
        return BASE_COLUMNS + MD5_COLUMNS + TAIL_COLUMNS + stack + EXTRA_COLUMNS
    return BASE_COLUMNS + STAT_DIFFS + STAT_COLUMNS + TAIL_COLUMNS + stack + EXTRA_COLUMNS
