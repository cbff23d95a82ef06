"""Module path of each dump entry, from the construct.json beside dump.json (mix / L0 dumps).

construct.json maps each entry to the module entry that called it
(``Functional.linear.0.forward -> Module.blocks.0.fc1.Linear.forward.0``); the report
shows ``blocks.0.fc1 (Linear)`` so a suspect API can be found in the model's code.
"""
from __future__ import annotations

import os

from probe.errors import DumpError
from probe.untrusted import inside, read_json
from probe.vocabulary import MODULE, module_label


def load_modules(dump_json: str) -> dict:
    """entry -> module label, for entries called inside a module; {} without construct.json.
    DumpError (one line) for a construct.json that is not an object of entry -> parent."""
    folder = os.path.dirname(os.path.abspath(dump_json))
    path = os.path.join(folder, "construct.json")
    if not os.path.lexists(path):
        return {}
    try:
        data = read_json(inside(folder, "construct.json"), "construct.json")   # (a symlink out: refused)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict):
        raise DumpError(f"{path}: construct.json must be an object (entry name -> the module entry "
                        f"that called it), got {type(data).__name__}")
    out = {}
    for entry, parent in data.items():
        if isinstance(entry, str) and entry.startswith(MODULE + "."):
            out[entry] = module_label(entry)          # a module's own path
        elif isinstance(parent, str):
            out[entry] = module_label(parent)
        elif parent is not None:
            raise DumpError(f"{path}: construct.json entry {entry!r}: its parent must be a module "
                            f"entry name or null, got {type(parent).__name__}")
    return out
