"""Open a file of a dump someone else made: inside the dump's folder, a regular file, no hang.

A dump is untrusted input (a colleague's, a CI job's): a ``data_name`` of ``../x`` or
``/etc/x``, a symlink pointing out of the folder, a FIFO named like a tensor file (``open``
then blocks for ever) or a directory must each be refused with one line, never read. Every
reader of a dump's files (dump.json, tensors, stack.json, construct.json, layout files,
draws, compare.json) opens them here, so the checks live in one place:

* ``inside(folder, name)``: the real path of ``name`` in ``folder``, refused when it leaves it;
* ``open_file(path)``: opened non-blocking, then checked with ``fstat`` on the open
  descriptor (no window between the check and the read) to be a regular file;
* ``read_json(path)``: the whole file parsed, any damage (not UTF-8, UTF-16, nesting past
  orjson's limit, a number beyond float64, not JSON at all) one ``DumpError`` line.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

import orjson

from probe.errors import ConfigError, DumpError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def inside(folder: str, name, what: str = "file name") -> str:
    """The real path of ``name`` inside ``folder``: DumpError for a name that is not a
    plain relative path (absolute, empty, not text, a NUL) or whose real path (``..``,
    symlinks followed) leaves ``folder``."""
    if not isinstance(name, str):
        raise DumpError(f"refused {what} {name!r}: a file name is a string, got {type(name).__name__}")
    if not name or os.path.isabs(name) or "\x00" in name:
        raise DumpError(f"refused {what} {name!r}: not a relative file name inside {folder}")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, name))
    if not path.startswith(root + os.sep):
        raise DumpError(f"refused {what} {name!r}: it escapes {folder} (leads to {path})")
    return path


def is_inside(folder: str, path: str) -> bool:
    """Whether ``path`` (followed through symlinks) is ``folder`` or lies under it."""
    root, real = os.path.realpath(folder), os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def _kind(mode: int) -> str:
    return next((text for test, text in _KINDS if test(mode)), "not a regular file")


def open_file(path: str) -> BinaryIO:
    """``path`` opened for binary reading; DumpError unless it is a regular file.

    Opened with O_NONBLOCK, so a FIFO does not block the open waiting for a writer, and
    judged by ``fstat`` of the open descriptor: what is checked is what is read (a file
    swapped for a FIFO after a ``stat`` would still be caught). FileNotFoundError and
    PermissionError pass through as they are (the CLI's one line for them).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise DumpError(f"{path}: a directory, not a regular file") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DumpError(f"{path}: {_kind(mode)}, not a regular file; refused")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)       # (no effect on a regular file: reads as usual)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str) -> bytes:
    """The whole of ``path`` (a regular file, see ``open_file``)."""
    with open_file(path) as fh:
        return fh.read()


def decode_text(raw: bytes, path: str, what: str = "file") -> str:
    """``raw`` as UTF-8 text (a BOM-less file); DumpError naming the byte where it is not."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise DumpError(f"{path}: {what} is UTF-16 text; probe reads UTF-8 JSON only")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DumpError(f"{path}: {what} is not UTF-8 text (byte {exc.start}: "
                        f"{raw[exc.start:exc.start + 1]!r}); probe reads UTF-8 JSON only") from None


def json_problem(exc: BaseException, raw: bytes, path: str, what: str = "file") -> DumpError:
    """The one line for JSON that would not parse: its encoding named where that is the
    cause, else the parser's own message (orjson's names the line and column)."""
    if isinstance(exc, RecursionError):
        return DumpError(f"{path}: {what} is nested too deeply to read (a hostile or damaged file)")
    try:
        decode_text(raw, path, what)
    except DumpError as bad_text:
        return bad_text
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DumpError(f"{path}: {what} is not valid JSON ({msg})")


def read_json(path: str, what: str = "file") -> Any:
    """The parsed JSON of ``path``: DumpError for anything that is not a regular file of
    UTF-8 JSON within orjson's limits (nesting 1024 deep, numbers within float64)."""
    raw = read_bytes(path)
    try:
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, RecursionError) as exc:
        if "surrogate" in str(exc):   # a lone ``\ud800`` escape (a hostile name): valid JSON that
            try:                      # orjson refuses; the json module reads it, the writers replace it
                return json.loads(decode_text(raw, path, what))
            except (ValueError, RecursionError):
                pass
        raise json_problem(exc, raw, path, what) from None


def read_rules_file(path: str, what: str) -> Any:
    """The parsed document of a user's rules file (a layout file, a layer mapping): JSON
    when the name ends in ``.json``, else YAML (safe loader). Missing, not a regular file,
    not UTF-8, not parseable or nested past the parser's limit: one ``ConfigError`` line
    naming ``what`` and the file."""
    if not os.path.lexists(path):
        raise ConfigError(f"{what} {path}: not found")
    text = decode_text(read_bytes(path), path, what)   # a regular file of UTF-8 text
    try:
        if path.lower().endswith(".json"):
            return json.loads(text)
        import yaml
        return yaml.safe_load(text)
    except ValueError as exc:          # json.JSONDecodeError, an integer of over 4300 digits
        raise ConfigError(f"{what} {path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{what} {path}: nested too deeply to read") from None
    except Exception as exc:           # yaml.YAMLError and its subclasses
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{what} {path}: not valid YAML ({where}{problem})") from None
