"""dump.json entries encoded by a helper process, off the training thread.

Encoding entries as JSON is most of a statistics dump's cost on the training thread
(~17 us for a linear's entry; formatting floats alone is ~0.35 us each in CPython), and
a writer *thread* does not help: the encoder holds the GIL the training thread needs.
So entries go, marshalled (~1 us each), through a pipe to a process of their own, which
encodes and appends them while training goes on. ``sync()`` waits until all sent entries
are on disk, so a step's files are still complete when ``step()`` returns.

    proc = EntryProcess.start()            # None where no helper can run
    proc.open("/dump/step0/rank/dump.json", count=0)
    proc.send([("Functional.linear.0.forward", {...}), ...])
    proc.sync()                            # returns once all of it is on disk
    proc.close()

A failure of the helper (it cannot start, or dies) raises ``EntryProcessError``; the
writer then encodes in its own process again. Entries marshal refuses (a float subclass)
raise ``ValueError`` from ``send``: the writer encodes that batch itself. (marshal turns
buffer-protocol objects such as numpy floats into bytes instead, which is why entries
hold builtin values only: ``records.describe_value``.) The helper is this file run as a
script: standard library only, no torch, so it starts in ~20 ms. It
is in a session of its own, so a Ctrl-C meant for training does not kill it mid-write;
it exits on ``close()`` or when the pipe closes (the training process died), after
writing everything it received.

Protocol: frames of a 4-byte little-endian length and a marshal payload, one of
``("open", path, count)``, ``("entries", [(name, body), ...])``, ``("meta", stack_parts,
construct)`` (stack.json and construct.json beside dump.json), ``("sync", n)`` (the helper
answers ``n`` on stdout), ``("exit",)``.
"""
import json
import marshal
import os
import struct
import subprocess
import sys

FOOTER = b"\n }\n}\n"
_LEN = struct.Struct("<I")


# json.dumps' output without its per-call set-up and its cycle check (half of the cost of
# an entry): entries are trees the collector built.
_encode = json.JSONEncoder(check_circular=False).encode


def encode_entries(count, entries):
    """The text that appends ``entries`` to a "data" holding ``count`` entries, one per line."""
    try:
        return _join(count, entries, _encode)
    except TypeError:   # a value json cannot take: written as its repr, not lost
        return _join(count, entries, json.JSONEncoder(default=repr).encode)


def _join(count, entries, encode):
    return "".join(f"{',' if count or i else ''}\n  {encode(name)}: {encode(body)}"
                   for i, (name, body) in enumerate(entries)).encode()


def append_text(handle, text):
    """Write encoded entries before the closing braces, keeping the file valid JSON."""
    handle.seek(-len(FOOTER), os.SEEK_END)
    handle.write(text + FOOTER)
    handle.flush()


def one_key_per_line(obj):
    """Readable JSON at C-encoder speed (``indent=`` switches json to its Python encoder)."""
    if not obj:
        return "{}"
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()) + "\n}\n"


def rewrite(handle, text):
    """Replace an open file's content."""
    handle.seek(0)
    handle.write(text.encode())
    handle.truncate()
    handle.flush()


def stack_text(parts):
    """stack.json's text from ``StackTable.parts()``: msprobe's grouped layout, one stack
    per line, each stack's frames as encoded when it was first seen."""
    if not parts:
        return "{}"
    return "{\n" + ",\n".join(f' "{i}": [{json.dumps(names)}, {frames}]'
                                for i, (names, frames) in enumerate(parts)) + "\n}\n"


def write_meta(folder, stack_parts, construct):
    """stack.json (from ``StackTable.parts()``) and construct.json (a dict)."""
    for name, text in (("stack.json", stack_text(stack_parts)), ("construct.json", one_key_per_line(construct))):
        with open(os.path.join(folder, name), "r+b") as f:
            rewrite(f, text)


def append_entries(handle, count, entries):
    """Append ``entries`` to an open dump.json whose "data" holds ``count`` entries; returns
    the new count."""
    append_text(handle, encode_entries(count, entries))
    return count + len(entries)


class EntryProcessError(Exception):
    """The helper process cannot take entries (any more)."""


class EntryProcess:
    """The training process's end of the helper: send entries, wait for them to be written."""

    def __init__(self, proc):
        self._proc = proc
        self._out = proc.stdin
        self._in = proc.stdout
        self._synced = 0

    @classmethod
    def start(cls):
        """Start a helper, or None where this interpreter cannot run one."""
        if not sys.executable:
            return None
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    start_new_session=True, bufsize=0)
        except (OSError, ValueError):
            return None
        return cls(proc)

    @property
    def pid(self):
        return self._proc.pid

    def open(self, path, count):
        self._send(("open", path, count))

    def send(self, entries):
        """Hand entries over; ValueError (nothing sent) for values marshal cannot carry."""
        self._write(marshal.dumps(("entries", entries)))

    def send_meta(self, stack_parts, construct):
        """stack.json and construct.json, to be written beside dump.json; ValueError
        (nothing sent) for values marshal cannot carry."""
        self._write(marshal.dumps(("meta", stack_parts, construct)))

    def sync(self):
        """Block until everything sent so far is on disk."""
        self.request_sync()
        self.wait_sync()

    def request_sync(self):
        """Ask for an acknowledgement of everything sent so far (``wait_sync`` reads it)."""
        self._synced += 1
        self._send(("sync", self._synced))

    def wait_sync(self):
        try:
            got = self._in.read(_LEN.size)
        except OSError as exc:
            raise EntryProcessError(f"helper process unreachable: {exc}") from None
        if len(got) != _LEN.size or _LEN.unpack(got)[0] != self._synced:
            raise EntryProcessError("helper process stopped answering")

    def close(self, timeout=10):
        try:
            self._send(("exit",))
            self._out.close()
        except (EntryProcessError, OSError):
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._in.close()

    def _send(self, message):
        self._write(marshal.dumps(message))

    def _write(self, payload):
        try:
            self._out.write(_LEN.pack(len(payload)) + payload)
        except (OSError, ValueError) as exc:   # broken pipe, or closed
            raise EntryProcessError(f"helper process gone: {exc}") from None


# ---- the helper process ---------------------------------------------------------------
def _read_exact(stream, n):
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def main():
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    handle, count, folder = None, 0, None
    try:
        while True:
            head = _read_exact(stdin, _LEN.size)
            if head is None:
                return
            body = _read_exact(stdin, _LEN.unpack(head)[0])
            if body is None:
                return
            message = marshal.loads(body)
            kind = message[0]
            if kind == "entries":
                count = append_entries(handle, count, message[1])
            elif kind == "open":
                if handle is not None:
                    handle.close()
                handle, count = open(message[1], "r+b"), message[2]
                folder = os.path.dirname(message[1])
            elif kind == "meta":
                write_meta(folder, message[1], message[2])
            elif kind == "sync":
                stdout.write(_LEN.pack(message[1]))
                stdout.flush()
            elif kind == "exit":
                return
    finally:
        if handle is not None:
            handle.close()


if __name__ == "__main__":
    main()
