"""The writer owns every dump file; a background thread does the I/O.

dump.json grows by appending: each flush seeks back over the closing braces, writes the
new entries (one per line) and the braces again, so the file is valid JSON after every
flush and total I/O stays linear (msprobe rewrites the whole file every 1,000 entries).
Tensor files are written in the same FIFO as the entries that name them, so a flushed
entry's file is already on disk. The queue is bounded in bytes: when the disk falls
behind, the training thread waits rather than memory growing.

Creating files and folders is the slow part on many filesystems (hundreds of
microseconds each), so the next step's folder is made ahead, under a hidden staging
name, while the current step trains; opening a step is then one rename. A folder left
by an earlier run is renamed aside and deleted in the background.
"""
import io
import json
import logging
import os
import queue
import shutil
import threading
import time

import numpy as np

from probe.dump.entry_process import FOOTER as _FOOTER
from probe.dump.entry_process import (EntryProcess, EntryProcessError, append_entries, append_text,
                                      encode_entries, one_key_per_line, rewrite, stack_text)

_HEADER_KEYS = ("task", "level", "framework", "dump_data_dir")
_FLUSH_ENTRIES = 2000
_HELPER_BATCH = 16   # entries per hand-over to the helper process: it encodes while training runs
# Entries a step is expected to leave for stop() to encode here (while the helper writes the
# meta files): the batch before them goes out early, sized by the previous step's count.
_HELPER_TAIL = 6
_FLUSH_SECONDS = 1.0
_MAX_PENDING_BYTES = 512 << 20


_npy_headers = {}  # (dtype, shape) -> .npy header bytes


class _Process:
    """This process's id, updated in a forked child: ``os.getpid()`` is a system call,
    and ``add_entry`` asks on every entry whether it runs in the writer's process."""
    pid = os.getpid()


def _after_fork():
    _Process.pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def _write_npy(path, arr):
    """np.save's format with the header built once per (dtype, shape): formatting it is
    most of np.save's Python cost for the small tensors a model has by the hundred."""
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")   # (np.ascontiguousarray would turn a 0-d array into 1-d)
    key = (arr.dtype.str, arr.shape)
    header = _npy_headers.get(key)
    if header is None:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False, "shape": arr.shape})
        header = _npy_headers[key] = buf.getvalue()
    with open(path, "wb") as f:
        f.write(header)
        f.write(arr.data)


class _StepFiles:
    """The files of one step/rank folder, created under a staging name, kept open."""

    def __init__(self, rank_dir, header, with_tensors):
        self.rank_dir = rank_dir
        parent, name = os.path.split(rank_dir)
        self.made_parent = not os.path.isdir(parent)
        os.makedirs(parent, exist_ok=True)
        self.staging = os.path.join(parent, f".{name}.staging-{os.getpid()}")
        if os.path.exists(self.staging):
            shutil.rmtree(self.staging)
        os.makedirs(self.staging)
        header = dict(header)
        if with_tensors:
            os.makedirs(os.path.join(self.staging, "dump_tensor_data"))
            header["dump_data_dir"] = os.path.join(rank_dir, "dump_tensor_data")
        self.count = 0
        head = "{\n" + "".join(f' {json.dumps(k)}: {json.dumps(header.get(k))},\n' for k in _HEADER_KEYS)
        self.dump_path = os.path.join(rank_dir, "dump.json")
        self.dump = self._create("dump.json", head.encode() + b' "data": {' + _FOOTER)
        self.stack = self._create("stack.json", b"{}")
        self.construct = self._create("construct.json", b"{}")

    def _create(self, name, content):
        f = open(os.path.join(self.staging, name), "w+b")
        f.write(content)
        f.flush()
        return f

    def activate(self, trash):
        """Move into place, setting aside what an earlier run left there."""
        if os.path.lexists(self.rank_dir):
            aside = f"{self.staging}.old-{len(trash)}"
            os.rename(self.rank_dir, aside)
            trash.append(aside)
        os.rename(self.staging, self.rank_dir)
        self.staging = None

    def append(self, entries):
        self.count = append_entries(self.dump, self.count, entries)

    def append_text(self, text, n):
        """``n`` entries that ``encode_entries(self.count, ...)`` encoded."""
        append_text(self.dump, text)
        self.count += n

    def recount(self):
        """Entries dump.json holds on disk (after a helper process wrote some of them)."""
        self.dump.seek(0)
        self.count = len(json.loads(self.dump.read().decode())["data"])

    def write_meta(self, stack_parts, construct_json):
        """stack.json from ``StackTable.parts()``; construct.json from its dict."""
        rewrite(self.stack, stack_text(stack_parts))
        rewrite(self.construct, one_key_per_line(construct_json))

    def close(self):
        for f in (self.dump, self.stack, self.construct):
            f.close()
        if self.staging is not None:  # prepared but never used
            shutil.rmtree(self.staging, ignore_errors=True)
            if self.made_parent:
                try:
                    os.rmdir(os.path.dirname(self.rank_dir))
                except OSError:
                    pass


class DumpWriter:
    """Files of one dump run. Methods are called from the training thread.

    Statistics entries are encoded by a helper process (``entry_process``) where one can
    run, else by the training thread at flush points. At ``stop()`` the helper gets
    stack.json and construct.json to write, and the few entries not yet handed over are
    encoded here while it finishes: ``step()`` waits for no round of encoding in the
    helper, and the writer thread does not compete with this one for the GIL.
    """

    use_helper_process = True   # False: encode entries in this process (tests compare both)

    def __init__(self, task, level):
        self.header = {"task": task, "level": level, "framework": "pytorch", "dump_data_dir": None}
        self._queue = queue.SimpleQueue()
        self._pid = _Process.pid
        self._pending = []           # entries not yet written
        self._direct = False         # entries written by the calling thread (see open_dir)
        self._opened = threading.Event()   # set by the writer thread once the folder is in place
        self._meta_written = threading.Event()   # set by the writer thread after the last "meta"
        self._meta_written.set()
        self._meta_sent = 0
        self._helper = None          # EntryProcess; False once it failed or cannot run
        self._helper_files = None    # the _StepFiles the helper appends to
        self._unacked = False        # sent to the helper since its last acknowledgement
        self._meta_unacked = None    # (stack parts, construct) the helper has not confirmed yet
        self._sent = []              # entries the helper has not confirmed yet (written here if it dies)
        self._sent_base = 0          # entries in its dump.json before them
        self._flush_entries = _FLUSH_ENTRIES
        self._step_entries = 0       # entries added since the folder was opened
        self._early_flush_at = -1    # that count sends the batch before the expected tail
        self.before_flush = None     # called before entries are encoded (async_dump)
        self._current = None         # the open step folder (set by the writer thread)
        self._last_flush = time.monotonic()
        self._bytes = 0
        self._bytes_cv = threading.Condition()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="probe-writer", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------
    def open_dir(self, rank_dir, with_tensors):
        """Start a fresh step/rank folder, replacing what an earlier run left there."""
        self._flush_pending()
        # Without tensor files, entries leave from the training thread at flush points: to
        # the helper process, or written here (handing small writes to a thread costs more
        # in GIL hand-offs than the writes). With tensor files they go through the queue,
        # behind the files they name.
        self._direct = not with_tensors
        helper = self._direct and self._start_helper()
        self._flush_entries = _HELPER_BATCH if helper else _FLUSH_ENTRIES
        # A training loop's steps have the same entries: stop() then encodes only the last few
        self._early_flush_at = self._step_entries - _HELPER_TAIL if helper else -1
        self._step_entries = 0
        self._opened.clear()
        self._queue.put(("open", rank_dir, with_tensors))

    def prepare_dir(self, rank_dir, with_tensors):
        """Make the folder of a coming step ahead, off the training thread's path."""
        self._queue.put(("prepare", rank_dir, with_tensors))

    def add_entry(self, name, body):
        if _Process.pid != self._pid:   # a forked child must not write into the parent's files
            return
        self._pending.append((name, body))
        self._step_entries += 1
        if len(self._pending) >= self._flush_entries or self._step_entries == self._early_flush_at \
                or time.monotonic() - self._last_flush > _FLUSH_SECONDS:
            self._flush_pending()

    def add_tensor(self, file_name, array):
        """Queue a CPU numpy array for ``dump_tensor_data/file_name``."""
        if _Process.pid != self._pid:
            return
        size = array.nbytes
        with self._bytes_cv:
            while self._bytes and self._bytes + size > _MAX_PENDING_BYTES:
                self._bytes_cv.wait()
            self._bytes += size
        self._queue.put(("tensor", file_name, array))

    def write_meta(self, stack_parts, construct_json):
        """stack.json (``StackTable.parts()``) and construct.json: written by the helper
        process in direct mode, else by the writer thread after the entries' tensor files;
        ``sync`` waits for both."""
        if self._direct and self._meta_to_helper(stack_parts, construct_json):
            self._drain()
            return
        if not self._direct:
            self._flush_pending()    # the entries' tensor files go ahead in the queue
        self._meta_sent += 1
        self._meta_written.clear()
        self._queue.put(("meta", stack_parts, construct_json, self._meta_sent))
        if self._direct:
            self._drain()

    def sync(self):
        """Block until everything is on disk."""
        if self._direct:   # entries are written here or by the helper; the queue holds
            self._drain()              # only folder work and stack.json / construct.json
            self._wait_event(self._meta_written)
        else:
            self._flush_pending()
            self._wait_queue()

    def _wait_open(self):
        """Wait for the writer thread to have the current folder in place (a round trip
        through the queue costs ~60 us of thread hand-offs; this is usually done already)."""
        self._wait_event(self._opened)

    def _wait_event(self, event):
        while not event.wait(0.5):
            if not self._thread.is_alive():
                break

    def _wait_queue(self):
        done = threading.Event()
        self._queue.put(("sync", done))
        while not done.wait(0.5):
            if not self._thread.is_alive():
                break

    def _write_here(self, write):
        try:
            write(self._current)
        except Exception as exc:  # never into the training script
            self._report(exc)

    def close(self):
        self.sync()
        self._queue.put(("stop",))
        self._thread.join(timeout=30)
        if self._helper and _Process.pid == self._pid:
            self._helper.close()
        self._helper = False

    # ---- the helper process ----------------------------------------------
    def _start_helper(self):
        if self._helper is None and self.use_helper_process:
            self._helper = EntryProcess.start() or False
        return bool(self._helper)

    def _helper_target(self):
        """The open step's files, the helper told to append to them; None where it cannot.
        Raises EntryProcessError when the helper is gone."""
        files = self._current
        if not self._helper or files is None or _Process.pid != self._pid:
            return None
        if self._helper_files is not files:
            self._helper.open(files.dump_path, files.count)
            self._helper_files = files
        return files

    def _to_helper(self, entries):
        """Hand entries to the helper process; False where this process must write them."""
        try:
            files = self._helper_target()
            if files is None:
                return False
            if not self._sent:
                self._sent_base = files.count
            self._helper.send(entries)
        except EntryProcessError as exc:
            self._drop_helper(exc)
            return False
        except ValueError:   # a value marshal cannot carry: this batch is written here,
            self._sync_helper()          # after the helper's, and the helper is told the new
            self._helper_files = None    # count before its next batch
            return False
        files.count += len(entries)
        self._sent.extend(entries)
        self._unacked = True
        return True

    def _meta_to_helper(self, stack_parts, construct_json):
        """Hand stack.json and construct.json to the helper; False where it cannot take them."""
        self._wait_open()
        try:
            if self._helper_target() is None:
                return False
            self._helper.send_meta(stack_parts, construct_json)
        except EntryProcessError as exc:
            self._drop_helper(exc)
            return False
        except ValueError:   # marshal refuses a value: the writer thread writes them
            return False
        self._unacked = True
        self._meta_unacked = (stack_parts, construct_json)
        return True

    def _sync_helper(self):
        """Wait until the helper has written everything it was sent."""
        if self._unacked and self._helper and _Process.pid == self._pid:
            try:
                self._helper.sync()
            except EntryProcessError as exc:
                self._drop_helper(exc)
        self._acknowledged()

    def _acknowledged(self):
        self._unacked = False
        self._meta_unacked = None
        self._sent = []

    def _drain(self):
        """Direct mode: every entry so far onto disk. What is still pending is encoded here
        while the helper finishes what it was sent (at the end of a step, the meta files),
        and appended once it has: that overlaps the helper's round trip rather than adding to it."""
        entries = self._take_pending()
        if not entries and not self._unacked:
            return
        self._wait_open()
        files = self._current
        if entries and files is not None and self._helper and self._helper_files is files \
                and _Process.pid == self._pid:
            try:
                self._helper.request_sync()
                text = encode_entries(files.count, entries)
                self._helper.wait_sync()
            except EntryProcessError as exc:
                self._drop_helper(exc)    # writes what it lost; these are written below
            else:
                self._acknowledged()
                self._helper_files = None   # its count is behind now: re-opened before its next batch
                self._write_here(lambda f: f.append_text(text, len(entries)))
                return
        self._sync_helper()
        if entries:
            self._write_here(lambda f: f.append(entries))

    def _drop_helper(self, exc):
        """Encode here from now on, counting what the helper got onto disk."""
        logging.getLogger("probe").warning("probe: the dump's helper process failed (%s); "
                                           "entries are encoded in the training process from now on", exc)
        helper, self._helper = self._helper, False
        self._flush_entries = _FLUSH_ENTRIES
        self._early_flush_at = -1
        try:
            helper.close(timeout=2)
        except Exception:   # already gone
            pass
        files, self._helper_files = self._helper_files, None
        sent, meta = self._sent, self._meta_unacked
        self._acknowledged()
        if files is not None:
            try:
                files.recount()
                # what it was sent but had not written when it died is written here
                self._write_here(lambda _: files.append(sent[max(files.count - self._sent_base, 0):]))
            except Exception as err:   # cut short mid-write: report, keep going
                self._report(err)
        if meta is not None:   # perhaps never written: the writer thread writes it
            self._meta_sent += 1
            self._meta_written.clear()
            self._queue.put(("meta", *meta, self._meta_sent))

    def _take_pending(self):
        """The pending entries, complete (async_dump fills in their numbers here)."""
        self._last_flush = time.monotonic()
        if not self._pending:
            return []
        if self.before_flush is not None:
            try:
                self.before_flush()
            except Exception as exc:
                self._report(exc)
        entries, self._pending = self._pending, []
        return entries

    def _flush_pending(self):
        entries = self._take_pending()
        if not entries:
            return
        if self._direct:
            self._wait_open()
            if not self._to_helper(entries):
                self._write_here(lambda files: files.append(entries))
        else:
            self._queue.put(("entries", entries))

    def _report(self, exc):
        if self._error is None:
            self._error = exc
            logging.getLogger("probe").error("probe: writing dump files failed: %s", exc)

    # ---- writer thread ---------------------------------------------------
    def _run(self):
        current = prepared = None
        trash = []
        while True:
            item = self._queue.get()
            kind = item[0]
            try:
                if kind == "stop":
                    for files in (current, prepared):
                        if files is not None:
                            files.close()
                    for path in trash:
                        shutil.rmtree(path, ignore_errors=True)
                    return
                if kind == "sync":
                    item[1].set()
                elif kind == "open":
                    try:
                        rank_dir, with_tensors = item[1:]
                        if current is not None:
                            current.close()
                        if prepared is not None and prepared.rank_dir == rank_dir:
                            current, prepared = prepared, None
                        else:
                            current = _StepFiles(rank_dir, self.header, with_tensors)
                        current.activate(trash)
                        self._current = current
                    finally:
                        self._opened.set()
                elif kind == "prepare":
                    if prepared is not None:
                        prepared.close()
                    prepared = _StepFiles(item[1], self.header, item[2])
                elif kind == "entries":
                    current.append(item[1])
                elif kind == "tensor":
                    try:
                        path = os.path.join(current.rank_dir, "dump_tensor_data", item[1])
                        if item[1].endswith(".pt"):   # file_format pt: a CPU torch tensor
                            import torch
                            torch.save(item[2], path)
                        else:
                            _write_npy(path, item[2])
                    finally:
                        with self._bytes_cv:
                            self._bytes -= item[2].nbytes
                            self._bytes_cv.notify_all()
                elif kind == "meta":
                    try:
                        current.write_meta(item[1], item[2])
                    finally:
                        if item[3] == self._meta_sent:   # not when a newer one is queued
                            self._meta_written.set()
                while trash and self._queue.empty():  # idle: clear what earlier runs left
                    shutil.rmtree(trash.pop(), ignore_errors=True)
            except Exception as exc:  # never kill the thread: report once, keep going
                self._report(exc)
