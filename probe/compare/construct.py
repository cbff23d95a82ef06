"""Module path of each dump entry, from the construct.json beside dump.json (mix / L0 dumps).

construct.json maps each entry to the module entry that called it
(``Functional.linear.0.forward -> Module.blocks.0.fc1.Linear.forward.0``); the report
shows ``blocks.0.fc1 (Linear)`` so a suspect API can be found in the model's code.
"""
from __future__ import annotations

import json
import os

from probe.vocabulary import MODULE, module_label


def load_modules(dump_json: str) -> dict:
    """entry -> module label, for entries called inside a module; {} without construct.json."""
    path = os.path.join(os.path.dirname(os.path.abspath(dump_json)), "construct.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    out = {}
    for entry, parent in data.items():
        if isinstance(entry, str) and entry.startswith(MODULE + "."):
            out[entry] = module_label(entry)          # a module's own path
        elif isinstance(parent, str):
            out[entry] = module_label(parent)
    return out
