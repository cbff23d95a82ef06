"""Compare's options: one frozen object from the command line (or a caller's keywords)
through ``compare`` / ``compare_run`` down to each pair's worker (``PairJob.options``).

Grouped by what they decide, as Polygraphy groups its arguments: which rows pair
(``Matching``), what is concluded (``Analysis``), what is written (``Output``). The flat
keyword names are msprobe's and the command line's (``stack_mode``, ``fuzzy_match``, ...);
``CompareOptions.from_keywords`` takes them and refuses an unknown one with a ConfigError
naming it (and the name it is closest to), so a misspelt option is never silently dropped.

Run-time settings that are not about what a compare concludes (worker processes, the Dask
scheduler, a progress bar, a file tag) stay plain arguments of the functions that use them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from probe.errors import ConfigError, unknown


@dataclass(frozen=True)
class Matching:
    """Which NPU row pairs with which bench row."""
    fuzzy_match: bool = False        # ignore call counters: the k-th call of each API pairs
    align: Optional[bool] = None     # align the call sequences: None when they differ, True always,
    #                                  False never (pair by name, as msprobe)


@dataclass(frozen=True)
class Analysis:
    """What the compare concludes beyond each row's verdict."""
    auto_analyze: bool = True        # the diagnosis: first divergence, Diagnosis sheet, summary json
    replay: Optional[bool] = None    # re-run each differing call on the NPU side's inputs
    #                                  (None: for tensor dumps)


@dataclass(frozen=True)
class Output:
    """What the compare writes besides the table."""
    stack_mode: bool = False         # the NPU_Stack_Info column
    html: bool = True                # the self-contained page compare_report_*.html


@dataclass(frozen=True)
class CompareOptions:
    matching: Matching = field(default_factory=Matching)
    analysis: Analysis = field(default_factory=Analysis)
    output: Output = field(default_factory=Output)

    @classmethod
    def from_keywords(cls, where: str, **keywords: Any) -> CompareOptions:
        """The options from flat keywords (``fuzzy_match=True``); ``where`` names the
        caller in the ConfigError an unknown keyword raises."""
        groups: Dict[str, Dict[str, Any]] = {name: {} for name in _GROUPS}
        for name, value in keywords.items():
            group = _GROUP_OF.get(name)
            if group is None:
                raise ConfigError(f"{where}: {unknown('option', name, NAMES)}")
            groups[group][name] = value
        return cls(**{name: group(**groups[name]) for name, group in _GROUPS.items()})

    def keywords(self) -> Dict[str, Any]:
        """The flat keywords (``from_keywords``' inverse)."""
        out: Dict[str, Any] = {}
        for name in _GROUPS:
            out.update(dataclasses.asdict(getattr(self, name)))
        return out


def resolve_options(where: str, options: Optional[CompareOptions], keywords: Dict[str, Any],
                    others: Tuple[str, ...] = ()) -> CompareOptions:
    """``options``, or else the options the flat ``keywords`` name; both at once is a
    ConfigError (which would win is not obvious), and so is a keyword that names no
    option: the message suggests the closest of the options and ``others`` (the
    caller's other keyword arguments)."""
    for name in keywords:
        if name not in _GROUP_OF:
            raise ConfigError(f"{where}: {unknown('keyword argument', name, NAMES + tuple(others))}")
    if options is None:
        return CompareOptions.from_keywords(where, **keywords)
    if not isinstance(options, CompareOptions):
        raise ConfigError(f"{where}: options must be a CompareOptions, got {type(options).__name__}")
    if keywords:
        raise ConfigError(f"{where}: give options= or the option keywords ({', '.join(sorted(keywords))}), not both")
    return options


_GROUPS: Dict[str, Any] = {"matching": Matching, "analysis": Analysis, "output": Output}   # CompareOptions' fields
# flat option name -> its group's field name in CompareOptions
_GROUP_OF = {f.name: name for name, group in _GROUPS.items() for f in dataclasses.fields(group)}
NAMES = tuple(_GROUP_OF)           # stack_mode, fuzzy_match, align, auto_analyze, replay, html
DEFAULT = CompareOptions()
