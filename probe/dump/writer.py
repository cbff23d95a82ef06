"""The writer owns every dump file, in the training process (no helper process).

The training thread collects entries and, at flush points (every ``_FLUSH_ENTRIES``
entries, after ``_FLUSH_SECONDS``, at ``stop()``/``step()``), encodes them with orjson
(``encode``). A writer thread makes each step's folder and files as the step starts,
while it trains. Task ``statistics``: the training thread writes entries and meta files
itself (a hand-over at a flush would cost a GIL round trip, more than the writes). With
tensor files: the writer thread writes the files and the entries' bytes in one FIFO, so a flushed
entry's file is already on disk; the queue is bounded in bytes, so when the disk falls
behind the training thread waits rather than memory growing.

dump.json grows by appending: each flush writes over the closing braces the new entries
and the braces again, so the file is valid JSON after every flush and total I/O stays
linear (msprobe rewrites the whole file every 1,000 entries).

A dump says whether its step finished: the header carries ``"complete": false`` from the
start, and the step's end (``finish_step``: the debugger's ``step()``, or ``close()``
after ``stop()``) overwrites it in place with ``true `` once every entry is on disk (the
same five bytes: nothing moves). A run killed mid-step (SIGKILL, OOM, a crash) leaves
``false`` beside every entry flushed so far, still valid JSON; the compare then says the
dump is incomplete and compares what is there. A step whose writes failed is never
marked complete. msprobe's readers skip the key.

Failure semantics (a full disk, an unwritable folder):
* training goes on; one line is logged for the whole run (``_report``);
* every dump.json on disk stays valid JSON holding its last complete flush: a write that
  fails is rolled back (the file is cut back to its size before it, braces rewritten in
  place) and nothing more is appended to that step's files;
* stack.json and construct.json are rewritten in place, and written back as they were
  when that fails (a temp file and a rename per step cost ~1 ms on a busy disk);
* a step's folder is made once the step runs (by the writer thread after ``open_dir``,
  at ``start()``), never ahead of it: no folder exists
  for a step that did not run; a folder whose files cannot even be created is removed.
"""
import io
import logging
import os
import queue
import shutil
import threading
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from probe.dump.encode import FOOTER, encode_entries, header_text, one_key_per_line, stack_text
from probe.dump.math_modes import math_modes
from probe.log_once import LogOnce

log = logging.getLogger(__name__)

_HEADER_KEYS = ("task", "level", "framework", "dump_data_dir", "math_modes", "complete")
_COMPLETE_KEY = b'"complete": '
_DONE = b"true "              # written over the header's ``false``: the same length
_FLUSH_ENTRIES = 2000
_FLUSH_SECONDS = 1.0
_MAX_PENDING_BYTES = 512 << 20


# ---- the writer thread's work items ------------------------------------------------
class _Open(NamedTuple):
    rank_dir: str
    with_tensors: bool


class _Entries(NamedTuple):
    data: bytes     # encode_entries' text
    n: int          # entries in it


class _Tensor(NamedTuple):
    file_name: str
    array: Any      # a CPU numpy array


class _Meta(NamedTuple):
    stack_parts: list
    construct: dict


class _Sync(NamedTuple):
    done: threading.Event


class _Finish(NamedTuple):
    pass


class _Stop(NamedTuple):
    pass


_npy_headers: Dict[Tuple[str, tuple], bytes] = {}  # (dtype, shape) -> .npy header bytes


class _Process:
    """This process's id, updated in a forked child: ``os.getpid()`` is a system call,
    and ``add_entry`` asks on every entry whether it runs in the writer's process."""
    pid = os.getpid()


def _after_fork():
    _Process.pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def _write_npy(path, arr):
    """np.save's format with the header built once per (dtype, shape): formatting it is
    most of np.save's Python cost for the small tensors a model has by the hundred.
    A write that fails leaves no partial file."""
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")   # (np.ascontiguousarray would turn a 0-d array into 1-d)
    key = (arr.dtype.str, arr.shape)
    header = _npy_headers.get(key)
    if header is None:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False, "shape": arr.shape})
        header = _npy_headers[key] = buf.getvalue()
    try:
        with open(path, "wb") as f:
            f.write(header)
            f.write(arr.data)
    except BaseException:
        _remove(path)
        raise


def _make_dir(path):
    """Make folder ``path`` (and missing parents); False when it exists already."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
    return True


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_all(fd, data, offset):
    """pwrite all of ``data`` at ``offset`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _rewrite(fd, data, old):
    """The open file holds ``data``, or, if writing it fails, ``old`` again (written back
    into blocks the file already has: that needs no new space)."""
    try:
        _write_all(fd, data, 0)
        os.ftruncate(fd, len(data))
    except BaseException:
        try:
            _write_all(fd, old, 0)
            os.ftruncate(fd, len(old))
        except OSError:
            pass
        raise


class _StepFiles:
    """The files of one step/rank folder (writer thread only).

    A fresh folder is made in place and its three files created in it, the descriptors
    kept open: ~9 system calls, each 20-80 us on a container's overlay disk, ~0.3 ms a
    step less than making it under a staging name (bench/overhead.py, mid model). A folder
    an earlier run left is replaced whole: the new one is made under a staging name and
    renamed into place after the old one is set aside, so a reader never sees a mix.
    ``broken`` is set by the first failed write: the step's files keep what they hold.
    """

    def __init__(self, rank_dir, header, with_tensors, trash):
        self.rank_dir = rank_dir
        self.broken = False
        self.count = 0
        self.replaced = False    # an earlier run's folder was here
        header = dict(header, complete=False)
        if with_tensors:
            header["dump_data_dir"] = os.path.join(rank_dir, "dump_tensor_data")
        texts = (header_text({k: header.get(k) for k in _HEADER_KEYS}), b"{}", b"{}")
        parent = os.path.dirname(rank_dir)
        made_parent = _make_dir(parent)
        made = None              # the folder this call made, removed again on failure
        fds = []
        try:
            if _make_dir(rank_dir):
                made = rank_dir
                fds = self._create(rank_dir, texts, with_tensors)
            else:                # an earlier run's folder: replaced whole
                made = self._staging(rank_dir)
                fds = self._create(made, texts, with_tensors)
                aside = f"{made}.old-{len(trash)}"
                os.rename(rank_dir, aside)
                trash.append(aside)
                os.rename(made, rank_dir)
                self.replaced = True
        except BaseException:
            for fd in fds:
                os.close(fd)
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            if made_parent:   # no folder for a step whose files could not be made
                try:
                    os.rmdir(parent)
                except OSError:
                    pass
            raise
        self.dump_path = os.path.join(rank_dir, "dump.json")
        self._fd = fds[0]
        self._size = len(texts[0])
        self._complete_at = texts[0].rindex(_COMPLETE_KEY) + len(_COMPLETE_KEY)   # its ``false``
        # stack.json, construct.json: [fd, what they hold]
        self._meta = [[fd, text] for fd, text in zip(fds[1:], texts[1:])]

    @staticmethod
    def _staging(rank_dir):
        staging = os.path.join(os.path.dirname(rank_dir), f".{os.path.basename(rank_dir)}.staging-{os.getpid()}")
        if os.path.lexists(staging):
            shutil.rmtree(staging)
        os.mkdir(staging)
        return staging

    @staticmethod
    def _create(folder, texts, with_tensors):
        """dump.json, stack.json, construct.json in ``folder`` holding ``texts``: their
        open descriptors (closed again if one cannot be made)."""
        if with_tensors:
            os.mkdir(os.path.join(folder, "dump_tensor_data"))
        fds = []
        try:
            for file_name, text in zip(("dump.json", "stack.json", "construct.json"), texts):
                fds.append(os.open(os.path.join(folder, file_name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644))
                _write_all(fds[-1], text, 0)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def append(self, data, count):
        """Write ``data`` (``count`` entries) over the closing braces, and the braces after
        it; on failure the file is cut back to its previous content."""
        if self.broken:
            return
        start = self._size - len(FOOTER)
        try:
            _write_all(self._fd, data + FOOTER, start)
        except BaseException:
            self.broken = True
            try:   # the old size keeps the braces' blocks: rewriting them needs no new space
                os.ftruncate(self._fd, self._size)
                _write_all(self._fd, FOOTER, start)
            except OSError:
                pass
            raise
        self._size = start + len(data) + len(FOOTER)
        self.count += count

    def finish(self):
        """Mark dump.json complete: every entry of the step is in it (not when a write failed)."""
        if self.broken:
            return
        try:
            _write_all(self._fd, _DONE, self._complete_at)
        except BaseException:
            self.broken = True
            raise

    def write_tensor(self, file_name, array):
        if self.broken:
            return
        try:
            path = os.path.join(self.rank_dir, "dump_tensor_data", file_name)
            if file_name.endswith(".pt"):       # file_format pt: a CPU torch tensor
                import torch
                torch.save(array, path)
            else:
                _write_npy(path, array)
        except BaseException:
            self.broken = True
            raise

    def write_meta(self, stack_parts, construct):
        """stack.json from ``StackTable.parts()``; construct.json from its dict."""
        if self.broken:
            return
        try:
            for meta, data in zip(self._meta, (stack_text(stack_parts), one_key_per_line(construct))):
                if data != meta[1]:
                    _rewrite(meta[0], data, meta[1])
                    meta[1] = data
        except BaseException:
            self.broken = True
            raise

    def close(self):
        os.close(self._fd)
        for fd, _ in self._meta:
            os.close(fd)


class DumpWriter:
    """Files of one dump run. Public methods are called from the training thread."""

    def __init__(self, task, level):
        self.header = {"task": task, "level": level, "framework": "pytorch", "dump_data_dir": None}
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._pid = _Process.pid
        self._pending: List[Tuple[str, dict]] = []   # entries not yet encoded
        # fill in entries' numbers fetched from a device in one transfer (async_dump, compiled graphs)
        self.before_flush: List[Callable[[], None]] = []
        self._last_flush = time.monotonic()
        self._bytes = 0
        self._bytes_cv = threading.Condition()
        # entries arrive from the training thread and, for async collectives, from the
        # completion callback of a communication thread: one at a time (~0.1 us, uncontended)
        self._entries_lock = threading.RLock()
        self._said = LogOnce(log)
        # The writer thread makes each step's folder and files as the step starts, while it
        # trains (~9 system calls, 0.2-0.4 ms). Without tensor files ("direct") the training
        # thread then writes entries and meta files itself at flush points: a hand-over
        # there would cost a GIL round trip (~60 us idle, up to milliseconds on a loaded
        # machine) that the flush waits for, more than these few writes.
        self._direct = False
        self._trash: List[str] = []                # folders of earlier runs set aside
        self._current: Optional[_StepFiles] = None   # the open step's files (None: could not be made)
        self._opened = threading.Event()             # set by the writer thread once _Open is done
        self._opened.set()
        self._thread = threading.Thread(target=self._run, name="probe-writer", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------
    def open_dir(self, rank_dir, with_tensors, here=False):
        """Start a fresh step/rank folder, replacing what an earlier run left there.
        ``here``: made by this thread when no tensor files come (inference steps)."""
        self._flush_pending()
        self._wait_open()
        was_direct = self._direct
        if was_direct:
            self._close_here()
        self._direct = not with_tensors
        self.header["math_modes"] = math_modes()   # as this step starts (read by the writer thread)
        if here and self._direct and (was_direct or self._current is None):
            # Made here: handing the folder to the writer thread wakes it once a step, and on
            # a busy machine getting the GIL back took longer (0.7-1.8 ms a step, a tiny
            # Llama's decode steps under load) than the ~9 system calls themselves. A
            # training step keeps the hand-over: there the writer thread makes the files
            # while the step computes (20-80 us a system call on a container's disk).
            self._open_here(rank_dir)
            return
        self._opened.clear()
        self._queue.put(_Open(rank_dir, with_tensors))

    def _open_here(self, rank_dir):
        """Direct mode: this step's folder and files made by the training thread."""
        try:
            self._current = _StepFiles(rank_dir, self.header, False, self._trash)
        except Exception as exc:  # never into the training script
            self._report(exc)
            return
        if self._current.replaced:
            self._said_replaced(rank_dir)

    def add_entry(self, name, body):
        if _Process.pid != self._pid:   # a forked child must not write into the parent's files
            return
        with self._entries_lock:
            pending = self._pending
            pending.append((name, body))
            if len(pending) >= _FLUSH_ENTRIES or time.monotonic() - self._last_flush > _FLUSH_SECONDS:
                self._flush_pending()

    def add_tensor(self, file_name, array):
        """Queue a CPU numpy array for ``dump_tensor_data/file_name``."""
        if _Process.pid != self._pid:
            return
        size = array.nbytes
        with self._bytes_cv:
            self._wait_room(size)
            self._bytes += size
        self._queue.put(_Tensor(file_name, array))

    def wait_for_room(self, size):
        """Wait until ``size`` more bytes fit in the queue: called before a tensor's host
        copy is made, so that a tensor past the bound is copied once the copies before it
        are on disk, not held beside them (two 1 GiB copies where one would do)."""
        if _Process.pid != self._pid:
            return
        with self._bytes_cv:
            self._wait_room(size)

    def _wait_room(self, size):
        while self._bytes and self._bytes + size > _MAX_PENDING_BYTES:
            if not self._thread.is_alive():
                return
            self._bytes_cv.wait(0.5)

    def write_meta(self, stack_parts, construct_json):
        """stack.json (``StackTable.parts()``) and construct.json, after the entries so far."""
        self._flush_pending()
        if self._direct:
            self._write_here(lambda files: files.write_meta(stack_parts, construct_json))
        else:
            self._queue.put(_Meta(stack_parts, construct_json))

    def finish_step(self):
        """The step's dump is complete: its entries so far are written, then its dump.json is
        marked complete (``"complete": true``). Entries after it are still written (the
        backward of a call after ``stop()``), but a step is finished once."""
        self._flush_pending()
        if self._direct:
            self._write_here(lambda files: files.finish())
        else:
            self._queue.put(_Finish())

    def sync(self):
        """Block until everything is on disk."""
        self._flush_pending()
        if self._direct:
            self._wait_open()     # a step that wrote nothing has its folder too
            return
        done = threading.Event()
        self._queue.put(_Sync(done))
        self._wait_event(done)

    def _wait_open(self):
        """Wait for the writer thread to have made the current folder (usually done already)."""
        self._wait_event(self._opened)

    def _wait_event(self, event):
        while not event.wait(0.5):
            if not self._thread.is_alive():
                break

    def _write_here(self, write):
        """Direct mode: ``write(files)`` in this thread, once the writer thread has made them."""
        self._wait_open()
        try:
            if self._current is not None:
                write(self._current)
        except Exception as exc:  # never into the training script
            self._report(exc)

    def _close_here(self):
        files, self._current = self._current, None
        if files is not None:
            files.close()

    def close(self):
        self.sync()
        if self._direct:
            self._close_here()
        self._queue.put(_Stop())
        self._thread.join(timeout=30)

    def _flush_pending(self):
        with self._entries_lock:
            self._flush_pending_locked()

    def _flush_pending_locked(self):
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        for fill in self.before_flush:
            try:
                fill()
            except Exception as exc:
                self._report(exc)
        entries, self._pending = self._pending, []
        try:
            data = encode_entries(1, entries)   # the first comma of a step is dropped when written
        except Exception as exc:   # never into the training script
            self._report(exc)
            return
        if self._direct:
            self._write_here(lambda files: files.append(data if files.count else data[1:], len(entries)))
        else:
            self._queue.put(_Entries(data, len(entries)))

    def _said_replaced(self, rank_dir):
        """A run into a used dump_path: said once, when the first old folder is replaced."""
        step_dir = os.path.dirname(rank_dir)
        self._said.warning("replaced", "probe: dump_path %s holds an earlier dump (%s): this run replaces each "
                           "step folder of this rank that it dumps; the earlier run's other steps stay as they were",
                           os.path.dirname(step_dir), os.path.join(os.path.basename(step_dir), os.path.basename(rank_dir)))

    def _report(self, exc):
        self._said.error("write", "probe: writing dump files failed (%s: %s); training goes on, each dump.json "
                        "keeps its last complete flush", type(exc).__name__, exc)

    # ---- writer thread ---------------------------------------------------
    def _run(self):
        trash = self._trash
        while True:
            item = self._queue.get()
            kind = type(item)
            try:
                current = self._current
                if kind is _Entries:
                    if current is not None:
                        # encoded as if entries came before; the step's first line has no comma
                        data = item.data if current.count else item.data[1:]
                        current.append(data, item.n)
                elif kind is _Tensor:
                    try:
                        if current is not None:
                            current.write_tensor(item.file_name, item.array)
                    finally:
                        with self._bytes_cv:
                            self._bytes -= item.array.nbytes
                            self._bytes_cv.notify_all()
                elif kind is _Open:
                    try:
                        self._current = None
                        if current is not None:
                            current.close()
                        self._current = _StepFiles(item.rank_dir, self.header, item.with_tensors, trash)
                    finally:
                        self._opened.set()
                    if self._current.replaced:
                        self._said_replaced(item.rank_dir)
                elif kind is _Meta:
                    if current is not None:
                        current.write_meta(item.stack_parts, item.construct)
                elif kind is _Sync:
                    item.done.set()
                elif kind is _Finish:
                    if current is not None:
                        current.finish()
                elif kind is _Stop:
                    self._current = None
                    if current is not None:
                        current.close()
                    for path in trash:
                        shutil.rmtree(path, ignore_errors=True)
                    return
                while trash and self._queue.empty():  # idle: clear what earlier runs left
                    shutil.rmtree(trash.pop(), ignore_errors=True)
            except Exception as exc:  # never kill the thread: report once, keep going
                self._report(exc)
            # Not held while waiting for the next item: a written tensor's host copy (1 GiB
            # for a 1 GiB tensor) is freed now, not when the next item arrives.
            item = current = None
