"""Call stacks of dumped APIs, captured cheaply and stored once per distinct stack.

Formatting a traceback costs tens of microseconds, and even reading ``f_lineno`` scans a
line table. A stack is keyed by its (code object, instruction offset) pairs, read by the
compiled ``_cstack`` extension where it was built (a loop over pointers: a deep stack in
Python costs several microseconds per call), and formatted only the first time it is seen.
Frames of probe itself (not its demo model, which is user code: ``USER_FILES``), of torch's
function-mode plumbing, and the API's own dispatch frame are left out of the formatted stack, so its innermost frame is the line that called
the API; the key covers them too, which costs nothing (one call path, one key).
"""
import json
import linecache
import os
import sys

import torch

try:
    from probe.dump._cstack import frame_key as _frame_key
except ImportError:   # built without a C compiler: keys are made in Python
    _frame_key = None  # type: ignore[assignment]

_PROBE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# files in probe's folder that hold a user's model, not probe's machinery: their frames stay
USER_FILES = frozenset({_PROBE_DIR + "demo.py"})
# torch's function-mode plumbing: never the line that called the API (nor dynamo's
# ``wrap_inline`` frame, the outermost of a compiled module's graph nodes on torch 2.6)
TORCH_PLUMBING = tuple(_TORCH_DIR + p for p in (
    "overrides.py", os.path.join("utils", "_python_dispatch.py"), os.path.join("utils", "_device.py"),
    os.path.join("_dynamo", "external_utils.py")))
# ... and for reports of custom ops and backward passes, torch's op and autograd entry points
TORCH_OP_PLUMBING = TORCH_PLUMBING + tuple(_TORCH_DIR + p for p in (
    "_ops.py", "_library" + os.sep, os.path.join("autograd", "__init__.py"), "_tensor.py",
    os.path.join("autograd", "graph.py")))


def is_plumbing(filename, torch_files=TORCH_PLUMBING):
    """The one stack filter: a frame of probe itself (``USER_FILES`` aside) or of torch's
    plumbing (``torch_files``)."""
    if filename.startswith(_PROBE_DIR):
        return filename not in USER_FILES
    return filename.startswith(torch_files)



_MAX_KEPT = 50_000  # distinct stack keys kept across steps before starting afresh


class StackTable:
    """Distinct stacks, formatted once and kept across steps; ``capture()`` returns an id.

    A training loop repeats the same stacks every step, so only which entries used which
    stack is per step (``clear()``); the formatted frames stay.
    """

    def __init__(self):
        self._ids = {}        # key -> id
        self.stacks = []      # id -> list of formatted frames, innermost first
        self._frames_text = []   # id -> those frames as JSON, encoded once
        self._by_text = {}    # frames as JSON -> id
        self._used = {}       # id -> entry names of this step, in first-use order
        self._codes = []      # per key: the code objects it names by address
        # (code id, instruction) -> its formatted frame and that as JSON: a new key differs from the ones before it in
        # a few frames (another call site, the prefill's path through generate), so most
        # of its frames were formatted already (linecache and f-string per frame otherwise)
        self._frame_text = {}

    def clear(self):
        self._used = {}
        if len(self._ids) > _MAX_KEPT:
            self._ids.clear()
            self.stacks = []
            self._frames_text = []
            self._by_text = {}
            self._codes = []
            self._frame_text = {}

    def capture(self, entry_name, api_code=None):
        """Record the current stack for ``entry_name``; ``api_code`` is the API's own code object."""
        caller = sys._getframe(1)
        key = None if _frame_key is None else _frame_key(caller)
        if key is None:
            key = _python_key(caller)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = self._add(caller, api_code)
        names = self._used.get(sid)
        if names is None:
            self._used[sid] = [entry_name]
        else:
            names.append(entry_name)
        return sid

    def _add(self, caller, api_code):
        """The id of the stack below ``caller``'s plumbing frames, formatted if it is new."""
        codes = []   # every code object the key names, alive so no other takes its address
        g = caller
        while g is not None:
            codes.append(g.f_code)
            g = g.f_back
        f = caller
        while f is not None and is_plumbing(f.f_code.co_filename):
            f = f.f_back
        if f is not None and f.f_code is api_code:
            f = f.f_back
        frames = []
        encoded = []
        formatted = self._frame_text
        while f is not None:
            code = f.f_code
            # keyed by the instruction: f_lineno scans the code's line table (long for
            # generate's loop); by the code's id, as hashing a code object hashes its
            # bytecode (``codes`` keeps every one alive, so no other takes its address)
            at = (id(code), f.f_lasti)
            done = formatted.get(at)
            if done is None:
                frame = _format(code, f.f_lineno)
                done = formatted[at] = (frame, json.dumps(frame))
            frames.append(done[0])
            encoded.append(done[1])
            f = f.f_back
        text = "[" + ", ".join(encoded) + "]"   # json.dumps(frames), each frame's part encoded once
        sid = self._by_text.get(text)   # the same user stack reached through other plumbing
        if sid is None:
            sid = self._by_text[text] = len(self.stacks)
            self.stacks.append(frames)
            self._frames_text.append(text)
        self._codes.append(codes)
        return sid

    def record(self, entry_name, frames):
        """Record ``frames`` (formatted, innermost first) for ``entry_name``: the stack of a
        call inside a compiled graph, read from its FX node when the graph was compiled."""
        text = json.dumps(frames)
        sid = self._by_text.get(text)
        if sid is None:
            sid = self._by_text[text] = len(self.stacks)
            self.stacks.append(list(frames))
            self._frames_text.append(text)
        self._used.setdefault(sid, []).append(entry_name)

    def parts(self):
        """This step's stacks as (entry names, frames encoded as JSON when the stack was
        first seen): what ``encode.stack_text`` turns into stack.json's text."""
        return [(tuple(names), self._frames_text[sid]) for sid, names in self._used.items()]

    def to_json(self):
        """msprobe's grouped layout for this step: {"0": [[names], [frames]], ...}."""
        return {str(i): [names, self.stacks[sid]] for i, (sid, names) in enumerate(self._used.items())}


def _python_key(frame):
    """``_cstack.frame_key`` in Python: (code id, instruction offset) of every frame."""
    key = []
    add = key.append
    while frame is not None:
        add(id(frame.f_code))   # hashing code objects costs more than hashing their ids
        add(frame.f_lasti)
        frame = frame.f_back
    return tuple(key)


def _format(code, line):
    return format_frame(code.co_filename, line, code.co_name)


def format_frame(filename, line, function, src=None):
    """One frame as stack.json writes it (msprobe's form)."""
    if src is None:
        src = linecache.getline(filename, line).strip()
    return f"File {filename}, line {line}, in {function}, \n {src}"
