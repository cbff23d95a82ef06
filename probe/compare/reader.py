"""Read a dump.json entry by entry.

A dump of a long run can hold hundreds of thousands of entries; the compare holds both
sides' flattened rows, so the raw JSON must not be held too.  A file of up to
``WHOLE_FILE_BYTES`` is read at once.  For the compare (``typed=True``) msgspec scans it
into one raw slice per entry and decodes each entry straight into ``Entry`` / ``Leaf``
structs: 0.2 s and ~100 MB for a 70 MB file, where orjson's dicts took 0.5 s and 420 MB
(bench/compare.py's 100k-entry pair).  An entry the structs do not fit (a nested dict
argument, odd field types) is decoded as plain dicts instead.  Other readers get dicts,
parsed at once by orjson and handed out and dropped one by one.  Anything msgspec and
orjson refuse (msprobe's bare NaN/Infinity tokens, a file cut off mid-write, a bigger
file) is streamed: the top-level object is walked key by key and each entry of ``data``
decoded on its own with ``raw_decode``.  A file cut off mid-write (a run killed mid-step)
yields every complete entry and records where it stopped instead of failing.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import msgspec
import orjson
from msgspec import UNSET, UnsetType
from probe.errors import ConfigError, DumpError
from probe.untrusted import open_file
from probe.vocabulary import PARAMETERS_GRAD, STAT_KEYS

_CHUNK = 1 << 22
WHOLE_FILE_BYTES = 256 << 20    # parsed whole: ~6x its size in objects while entries are handed out
_WS = " \t\r\n"


_HEADER = ("task", "level", "framework", "dump_data_dir", "math_modes", "complete")
_HEADER_TYPES = {"math_modes": dict, "complete": bool}     # the others: str
_TYPE_WORDS = {dict: "an object", bool: "true or false", str: "a string"}


@dataclass
class DumpMeta:
    """Top-level fields of dump.json, plus what went wrong reading it."""
    path: str
    task: str | None = None
    level: str | None = None
    framework: str | None = None
    dump_data_dir: str | None = None
    math_modes: dict | None = None    # the precision settings it ran with (dump/math_modes.py)
    complete: bool | None = None      # probe's marker: True once its step ended, False before
                                      # (a run killed mid-step); None: no marker (msprobe's dumps)
    entries: int = 0
    truncated: bool = False
    problems: list = field(default_factory=list)


# One tensor or argument of an entry, as dump.json has it: its statistics are the
# vocabulary's STAT_KEYS (a new statistic is read with no change here); ``type`` is
# required, so a JSON object without one (a container) is refused by the struct decoding.
# The fields the compare uses are typed: a dump whose shape is text or whose data_name is a
# list fails the struct, and where its entry is decoded as dicts instead (rows._walk) the same
# conversion names the field in one line (DumpError). Checked by msgspec as it decodes: no
# second pass over 100k entries.
Leaf = msgspec.defstruct(
    "Leaf", [("type", str), ("dtype", Union[str, None, UnsetType], UNSET),     # UNSET: no such key
             # decoded as a tuple: the row's shape as it is, no copy (null: a size not known)
             ("shape", Union[tuple[Optional[int], ...], None, UnsetType], UNSET),
             *[(key, Any, None) for key in STAT_KEYS],
             ("requires_grad", Any, None), ("md5", Optional[str], None), ("data_name", Optional[str], None),
             ("value", Any, None),
             ("uninitialized", Any, None),    # a buffer not yet written (torch.empty, out=): no data
             ("opaque", Any, None)],          # a custom op's handle (an address): no data
    gc=False, module=__name__)


_Item = Union[Leaf, list, None]   # type: ignore[valid-type]


class Entry(msgspec.Struct, gc=False):
    """One dump.json entry, its parts as vocabulary.ENTRY_KEYS names them: ``UNSET`` where
    the entry has no such key (``None`` is a part written as ``null``: a row of its own)."""
    input_args: Union[list[_Item], None, UnsetType] = UNSET
    input_kwargs: Union[dict[str, _Item], None, UnsetType] = UNSET
    input: Union[list[_Item], None, UnsetType] = UNSET
    parameters: Union[dict[str, _Item], None, UnsetType] = UNSET
    output: Union[list[_Item], None, UnsetType] = UNSET


class _RawDoc(msgspec.Struct):
    """dump.json's top level, each entry left undecoded."""
    data: dict[str, msgspec.Raw] = {}
    task: Any = None
    level: Any = None
    framework: Any = None
    dump_data_dir: Any = None
    math_modes: Any = None
    complete: Any = None


_RAW_DOC = msgspec.json.Decoder(_RawDoc)
_ENTRY = msgspec.json.Decoder(Entry)


@dataclass
class RawEntries:
    """The entries of a dump.json that msgspec read whole, each still its raw JSON text,
    for a reader that decodes and flattens them all in one call (rows.side_rows: a
    generator step and three Python calls per entry were ~40% of the read of the
    100k-entry pair).  ``data``: entry name -> ``msgspec.Raw``, in file order;
    ``decode(raw)``: the entry as an ``Entry`` (raises where the structs do not fit it);
    ``decode_entry(name, raw)``: what ``read_dump`` yields for it (an ``Entry``, a dict
    or None; DumpError for a damaged entry), the way for an entry ``decode`` refuses and
    for one whose name holds ``dicts_named`` (parameters_grad: keyed by parameter name)."""
    data: dict
    decode: Callable
    decode_entry: Callable
    dicts_named: str = PARAMETERS_GRAD


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection inside; what it made and still holds is then moved to
    the oldest generation without a collection (the previous state is restored after).

    A big compare holds millions of small containers (decoded entries, rows, pairs,
    column lists) and makes almost no reference cycles: every full collection walked
    all of them for nothing, ~1/3 of the engine's time on the 100k-entry pair.  Enabling
    the collector again would collect the youngest generation at the next allocation,
    all of what was made inside (0.5 s after that compare); ``freeze`` + ``unfreeze``
    instead hand it to the oldest generation, whose collections are rare.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if not gc.get_freeze_count():     # (a host's own frozen objects stay frozen)
                gc.freeze()        # everything tracked -> the permanent generation ...
                gc.unfreeze()      # ... -> the oldest one: no young collection of it
            gc.enable()


class _Buffer:
    """A sliding text window over a file, refilled on demand."""

    def __init__(self, fh):
        self.fh, self.text, self.pos, self.eof = fh, "", 0, False

    def fill(self) -> bool:
        if self.eof:
            return False
        chunk = self.fh.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.text = self.text[self.pos:] + chunk
        self.pos = 0
        return True

    def skip_ws(self) -> str | None:
        """Advance past whitespace; return the next character (None at end of file)."""
        while True:
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in _WS:
                pos += 1
            self.pos = pos
            if pos < len(text):
                return text[pos]
            if not self.fill():
                return None

    def decode(self, decoder):
        """Decode one JSON value at the cursor, reading more until it is complete."""
        self.skip_ws()
        while True:
            try:
                value, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError:
                if self.fill():
                    continue
                raise
            # A number at the very end of the window may continue in the next chunk.
            if end >= len(self.text) and not self.eof and self.fill():
                continue
            self.pos = end
            return value


def read_dump(path: str, meta: DumpMeta | None = None, stream: bool = False, typed: bool = False,
              bulk: Callable[[RawEntries], int] | None = None):
    """Yield ``(entry_name, entry)`` from dump.json in file order.

    ``meta`` (filled as reading goes) gets task/level and any truncation.  Raises
    FileNotFoundError if the file is missing and ValueError if it is not a dump.json
    at all; damage after the first entry is reported in ``meta.problems``. ``stream``:
    never parse the file whole (a few MB held whatever its size), for a reader that
    walks several dumps side by side (shard_merge: the ranks of one step).  ``typed``:
    entries as ``Entry`` structs where they fit one (dicts where not).  ``bulk`` (with
    ``typed``): where msgspec reads the file whole, all its entries are handed to
    ``bulk(RawEntries)`` (which returns how many it took) and none is yielded.
    """
    meta = meta if meta is not None else DumpMeta(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"dump.json not found: {path}")
    try:
        yield from _read(path, meta, stream, typed, bulk)
    except (UnicodeDecodeError, RecursionError) as exc:
        # text that is not UTF-8 (or UTF-16), nesting past the parsers' limits: one line
        raise DumpError(_damage(path, exc) + _after(meta)) from None
    except ConfigError:
        raise
    except ValueError as exc:           # the streamed file's integer of over 4300 digits
        raise DumpError(f"{path}: dump.json cannot be read{_after(meta)}: {str(exc).splitlines()[0]}") from None


def _after(meta: DumpMeta) -> str:
    return f" (after {meta.entries} entries)" if meta.entries else ""


def _damage(path: str, exc: BaseException) -> str:
    """What is wrong with a dump.json that could not be decoded as text or as JSON."""
    if isinstance(exc, RecursionError):
        return f"{path}: dump.json is nested too deeply to read (a hostile or damaged file)"
    with open_file(path) as fh:
        head = fh.read(2)
    if head in (b"\xff\xfe", b"\xfe\xff"):
        return f"{path}: dump.json is UTF-16 text; probe reads UTF-8 JSON only"
    bad = exc.object[exc.start:exc.start + 1] if isinstance(exc, UnicodeDecodeError) else b""
    return f"{path}: dump.json is not UTF-8 text (byte {bad!r}: {getattr(exc, 'reason', exc)}); probe reads UTF-8 JSON only"


def _read(path: str, meta: DumpMeta, stream: bool, typed: bool, bulk=None):
    with open_file(path) as fh:          # a regular file (a FIFO: one line, no hang)
        whole = not stream and os.fstat(fh.fileno()).st_size <= WHOLE_FILE_BYTES
        raw = fh.read() if whole else None
    if raw is not None and typed:
        doc = _raw_entries(raw)
        if doc is not None:
            yield from _typed_entries(doc, meta, bulk)
            return
    parsed = _parse_whole(raw, path) if raw is not None else None
    del raw
    if parsed is not None:
        yield from _whole_entries(parsed, meta)
        return
    decoder = json.JSONDecoder()
    with io.TextIOWrapper(open_file(path), encoding="utf-8") as fh:
        buf = _Buffer(fh)
        if buf.skip_ws() != "{":
            raise ConfigError(f"not a dump.json (no JSON object): {path}")
        buf.pos += 1
        try:
            while True:
                ch = buf.skip_ws()
                if ch == ",":
                    buf.pos += 1
                    ch = buf.skip_ws()
                if ch == "}":
                    return
                if ch is None:
                    raise json.JSONDecodeError("unexpected end of file", buf.text, buf.pos)
                key = buf.decode(decoder)
                if buf.skip_ws() != ":":
                    raise json.JSONDecodeError("expected ':'", buf.text, buf.pos)
                buf.pos += 1
                if key == "data" and buf.skip_ws() == "{":
                    buf.pos += 1
                    yield from _entries(buf, decoder, meta)
                else:
                    value = buf.decode(decoder)
                    if key == "data":
                        raise DumpError(_not_entries(path, value))
                    if key in _HEADER:
                        _set_header(meta, key, value)
        except json.JSONDecodeError as exc:
            if "\x00" in buf.text:       # UTF-16 without a byte-order mark: NULs no JSON text holds
                raise DumpError(f"{path}: dump.json holds NUL characters (UTF-16 text?); "
                                "probe reads UTF-8 JSON only") from None
            meta.truncated = True
            meta.problems.append(
                f"{path}: dump.json is truncated or damaged after {meta.entries} entries "
                f"({exc.msg}); compared what was complete")


def _parse_whole(raw: bytes, path: str) -> dict | None:
    """The whole document, or None where orjson refuses it (then it is streamed)."""
    try:
        with gc_paused():          # ~3x faster: no collections while it builds the objects
            doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(doc) is not dict:
        return None                # (streamed: "not a dump.json")
    if type(doc.get("data", {})) is not dict:
        raise DumpError(_not_entries(path, doc["data"]))
    return doc


def _not_entries(path: str, data) -> str:
    return (f"{path}: dump.json's \"data\" must be an object of entries (entry name -> its inputs and "
            f"outputs), got {type(data).__name__}")


def _raw_entries(raw: bytes) -> _RawDoc | None:
    """The top level with each entry's raw text, or None where msgspec refuses the file."""
    try:
        return _RAW_DOC.decode(raw)
    except msgspec.MsgspecError:       # bare NaN tokens, a cut-off file, no dump.json at all
        return None


def _set_header(meta: DumpMeta, key: str, value) -> None:
    """One top-level field of dump.json: text (math_modes: an object, complete: a bool), or null."""
    want = _HEADER_TYPES.get(key, str)
    if value is not None and type(value) is not want:
        raise DumpError(f"{meta.path}: dump.json's {key!r} must be "
                        f"{_TYPE_WORDS[want]} or null, got {type(value).__name__}")
    setattr(meta, key, value)


def _typed_entries(doc: _RawDoc, meta: DumpMeta, bulk=None):
    for key in _HEADER:
        value = getattr(doc, key)
        if value is not None:
            _set_header(meta, key, value)
    data = doc.data
    if bulk is not None:
        path = meta.path
        meta.entries += bulk(RawEntries(data, _ENTRY.decode, lambda name, raw: _decode_entry(name, raw, path)))
        return
    for name in list(data):
        entry = _decode_entry(name, data.pop(name), meta.path)
        meta.entries += 1
        yield name, entry


def _decode_entry(name: str, raw: msgspec.Raw, path: str) -> Entry | dict:
    """An ``Entry`` where the structs fit it, else plain dicts; DumpError for an entry
    that is not an object, holds an integer of over 4300 digits, is not UTF-8 or is
    nested past the parsers' limits."""
    try:
        if PARAMETERS_GRAD not in name:             # (keyed by parameter name: a dict)
            try:
                return _ENTRY.decode(raw)
            except msgspec.ValidationError:         # a nested dict argument, odd field types
                pass
        try:
            entry = orjson.loads(bytes(raw))
        except orjson.JSONDecodeError:              # a number beyond float64 (1e400): inf, as json has it
            entry = json.loads(bytes(raw))
    except (ValueError, RecursionError) as exc:     # (UnicodeDecodeError is a ValueError)
        what = ("nested too deeply to read" if isinstance(exc, RecursionError)
                else f"cannot be read: {str(exc).splitlines()[0]}")
        raise DumpError(f"{path}: entry {name!r} {what}") from None
    return check_entry(path, name, entry)


def check_entry(path: str, name, entry):
    """``entry`` itself where it is an object (a dict) or null (no rows), else DumpError naming it."""
    if type(entry) is not dict and entry is not None:
        raise DumpError(f"{path}: entry {name!r} must be an object (input_args, input_kwargs, output, "
                        f"...), got {type(entry).__name__}")
    return entry


def _whole_entries(doc: dict, meta: DumpMeta):
    for key in _HEADER:
        if key in doc:
            _set_header(meta, key, doc[key])
    data = doc.get("data", {})
    path = meta.path
    for name in list(data):
        entry = data.pop(name)      # dropped once the caller has it: memory goes down as rows grow
        if type(entry) is not dict and entry is not None:
            check_entry(path, name, entry)
        meta.entries += 1
        yield name, entry


# `,? "plain key" :` between entries -- no escapes or control characters in the key, so
# the text between the quotes is what JSON decoding of the key would give
_PLAIN_KEY = re.compile(r'[ \t\r\n]*,?[ \t\r\n]*"([^"\\\x00-\x1f]*)"[ \t\r\n]*:[ \t\r\n]*')


def _entries(buf, decoder, meta):
    scan, plain_key = decoder.scan_once, _PLAIN_KEY.match
    while True:
        # fast path: a plain key and an entry that ends inside the window, decoded with
        # the scanner directly; anything else takes the general path below from the same
        # position (window refills, truncation, escaped keys, the closing brace)
        text = buf.text
        m = plain_key(text, buf.pos)
        if m is not None:
            try:
                entry, end = scan(text, m.end())
            except (StopIteration, json.JSONDecodeError):
                end = len(text)
            if end < len(text):
                buf.pos = end
                meta.entries += 1
                yield m.group(1), check_entry(meta.path, m.group(1), entry)
                continue
        ch = buf.skip_ws()
        if ch == ",":
            buf.pos += 1
            ch = buf.skip_ws()
        if ch == "}":
            buf.pos += 1
            return
        if ch is None:
            raise json.JSONDecodeError("unexpected end of file", buf.text, buf.pos)
        name = buf.decode(decoder)
        if buf.skip_ws() != ":":
            raise json.JSONDecodeError("expected ':'", buf.text, buf.pos)
        buf.pos += 1
        entry = buf.decode(decoder)
        meta.entries += 1
        yield name, check_entry(meta.path, name, entry)


def read_meta(path: str) -> DumpMeta:
    """Task/level of a dump without flattening it (reads the whole file once)."""
    meta = DumpMeta(path)
    for _ in read_dump(path, meta):
        if meta.task is not None and meta.level is not None:
            break
    return meta
