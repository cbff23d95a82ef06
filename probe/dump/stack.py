"""Call stacks of dumped APIs, captured cheaply and stored once per distinct stack.

Formatting a traceback costs tens of microseconds, and even reading ``f_lineno`` scans a
line table. A stack is keyed by its (code object id, instruction offset) pairs, which are
cheap to read, and formatted only the first time it is seen.
Frames of probe itself, of torch's function-mode plumbing, and the API's own dispatch
frame are left out, so the innermost frame is the line that called the API.
"""
import json
import linecache
import os
import sys

import torch

_PROBE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_PLUMBING = tuple(
    os.path.join(os.path.dirname(torch.__file__), p)
    for p in ("overrides.py", os.path.join("utils", "_python_dispatch.py"), os.path.join("utils", "_device.py")))


def _is_plumbing(filename):
    return filename.startswith(_PROBE_DIR) or filename.startswith(_TORCH_PLUMBING)


_MAX_KEPT = 50_000  # distinct stacks kept formatted across steps before starting afresh


class StackTable:
    """Distinct stacks, formatted once and kept across steps; ``capture()`` returns an id.

    A training loop repeats the same stacks every step, so only which entries used which
    stack is per step (``clear()``); the formatted frames stay.
    """

    def __init__(self):
        self._ids = {}        # key -> id
        self.stacks = []      # id -> list of formatted frames, innermost first
        self._frames_text = []   # id -> those frames as JSON, encoded once
        self._used = {}       # id -> entry names of this step, in first-use order
        self._codes = []      # id -> the code objects its key names by id()

    def clear(self):
        self._used = {}
        if len(self.stacks) > _MAX_KEPT:
            self._ids.clear()
            self.stacks = []
            self._frames_text = []
            self._codes = []

    def capture(self, entry_name, api_code=None):
        """Record the current stack for ``entry_name``; ``api_code`` is the API's own code object."""
        f = sys._getframe(1)
        while f is not None and _is_plumbing(f.f_code.co_filename):
            f = f.f_back
        if f is not None and f.f_code is api_code:
            f = f.f_back
        key = []
        add = key.append
        g = f
        while g is not None:
            add(id(g.f_code))   # hashing code objects costs more than hashing their ids
            add(g.f_lasti)
            g = g.f_back
        key = tuple(key)
        sid = self._ids.get(key)
        if sid is None:
            sid = len(self.stacks)
            self._ids[key] = sid
            frames, codes = [], []
            while f is not None:
                frames.append(_format(f.f_code, f.f_lineno))
                codes.append(f.f_code)
                f = f.f_back
            self.stacks.append(frames)
            self._frames_text.append(json.dumps(frames))
            self._codes.append(codes)   # alive, so no other code object can take their ids
        names = self._used.get(sid)
        if names is None:
            self._used[sid] = [entry_name]
        else:
            names.append(entry_name)
        return sid

    def parts(self):
        """This step's stacks as (entry names, frames encoded as JSON when the stack was
        first seen): what ``entry_process.stack_text`` turns into stack.json's text."""
        return [(tuple(names), self._frames_text[sid]) for sid, names in self._used.items()]

    def to_json(self):
        """msprobe's grouped layout for this step: {"0": [[names], [frames]], ...}."""
        return {str(i): [names, self.stacks[sid]] for i, (sid, names) in enumerate(self._used.items())}


def _format(code, line):
    src = linecache.getline(code.co_filename, line).strip()
    return f"File {code.co_filename}, line {line}, in {code.co_name}, \n {src}"
