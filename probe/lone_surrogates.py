"""Lone surrogates in a dump's texts, replaced where probe writes them.

JSON may escape half of a UTF-16 pair (``"\\ud800"``); Python reads it into a str that
UTF-8 cannot encode, so a workbook, CSV, page or summary holding it failed half-way
through. The writers try the text as it is (nothing is scanned on the usual path) and,
where it cannot be encoded, write it again with U+FFFD in place of each lone surrogate,
saying so once per output folder.
"""
from __future__ import annotations

import logging
import re

from probe.log_once import LogOnce

logger = logging.getLogger(__name__)
_said = LogOnce(logger)
_LONE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def in_text(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate."""
    return _LONE.search(text) is not None


def replace(text: str) -> str:
    """``text`` with U+FFFD in place of each lone surrogate."""
    return _LONE.sub(REPLACEMENT, text) if _LONE.search(text) else text


def replace_in(value):
    """``value`` (texts in dicts, lists and tuples, as JSON holds them) with its lone
    surrogates replaced; keys too. Other values are returned as they are."""
    t = type(value)
    if t is str:
        return replace(value)
    if t is dict:
        return {replace_in(k): replace_in(v) for k, v in value.items()}
    if t is list or t is tuple:
        return t(replace_in(v) for v in value)
    return value


def say_replaced(where: str) -> None:
    """Log, once per ``where`` (an output folder), that texts were written with U+FFFD."""
    _said.warning(where, "probe: texts of the dump hold lone surrogates (\\ud800-style escapes, not "
                  "Unicode text); the outputs in %s show U+FFFD (\ufffd) in their place", where)
