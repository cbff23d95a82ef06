"""The writer owns every dump file; a background thread does the I/O.

dump.json grows by appending: each flush seeks back over the closing braces, writes the
new entries (one per line) and the braces again, so the file is valid JSON after every
flush and total I/O stays linear (msprobe rewrites the whole file every 1,000 entries).
stack.json and construct.json are small and replaced atomically (temp file +
``os.replace``). Tensor files are written in the same FIFO as the entries that name them,
so a flushed entry's file is already on disk. The queue is bounded in bytes: when the
disk falls behind, the training thread waits rather than memory growing.
"""
import json
import os
import queue
import shutil
import threading
import time

import numpy as np

_HEADER_KEYS = ("task", "level", "framework", "dump_data_dir")
_FOOTER = b"\n }\n}\n"
_FLUSH_ENTRIES = 2000
_FLUSH_SECONDS = 1.0
_MAX_PENDING_BYTES = 512 << 20


def _atomic_write_json(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _write_npy(path, arr):
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, allow_pickle=False)


class _DumpJson:
    """One growing dump.json."""

    def __init__(self, path, header):
        self.path = path
        self.count = 0
        head = "{\n" + "".join(f' {json.dumps(k)}: {json.dumps(header.get(k))},\n' for k in _HEADER_KEYS)
        with open(path, "wb") as f:
            f.write(head.encode() + b' "data": {' + _FOOTER)

    def append(self, entries):
        parts = []
        for name, body in entries:
            sep = ",\n" if self.count else "\n"
            parts.append(f"{sep}  {json.dumps(name)}: {json.dumps(body)}")
            self.count += 1
        with open(self.path, "r+b") as f:
            f.seek(-len(_FOOTER), os.SEEK_END)
            f.write("".join(parts).encode() + _FOOTER)


class DumpWriter:
    """Files of one dump run. Methods are called from the training thread."""

    def __init__(self, task, level):
        self.header = {"task": task, "level": level, "framework": "pytorch", "dump_data_dir": None}
        self._queue = queue.SimpleQueue()
        self._pending = []           # entries not yet handed to the thread
        self._pending_dir = None
        self._last_flush = time.monotonic()
        self._bytes = 0
        self._bytes_cv = threading.Condition()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="probe-writer", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------
    def open_dir(self, rank_dir, with_tensors):
        """Start a fresh step/rank directory, replacing what an earlier run left there."""
        self._flush_pending()
        self._pending_dir = rank_dir
        self._queue.put(("open", rank_dir, with_tensors))

    def add_entry(self, name, body):
        self._pending.append((name, body))
        if len(self._pending) >= _FLUSH_ENTRIES or time.monotonic() - self._last_flush > _FLUSH_SECONDS:
            self._flush_pending()

    def add_tensor(self, file_name, array):
        """Queue a CPU numpy array for ``dump_tensor_data/file_name``."""
        size = array.nbytes
        with self._bytes_cv:
            while self._bytes and self._bytes + size > _MAX_PENDING_BYTES:
                self._bytes_cv.wait()
            self._bytes += size
        self._queue.put(("tensor", file_name, array))

    def write_meta(self, stack_json, construct_json):
        self._flush_pending()
        self._queue.put(("meta", stack_json, construct_json))

    def sync(self):
        """Block until everything queued is on disk."""
        self._flush_pending()
        done = threading.Event()
        self._queue.put(("sync", done))
        while not done.wait(0.5):
            if not self._thread.is_alive():
                break

    def close(self):
        self.sync()
        self._queue.put(("stop",))
        self._thread.join(timeout=30)

    @property
    def error(self):
        return self._error

    def _flush_pending(self):
        self._last_flush = time.monotonic()
        if self._pending:
            self._queue.put(("entries", self._pending))
            self._pending = []

    # ---- writer thread ---------------------------------------------------
    def _run(self):
        rank_dir = dump_json = None
        while True:
            item = self._queue.get()
            kind = item[0]
            try:
                if kind == "stop":
                    return
                if kind == "sync":
                    item[1].set()
                elif kind == "open":
                    rank_dir, with_tensors = item[1], item[2]
                    if os.path.isdir(rank_dir):
                        shutil.rmtree(rank_dir)
                    os.makedirs(rank_dir)
                    header = dict(self.header)
                    if with_tensors:
                        data_dir = os.path.join(rank_dir, "dump_tensor_data")
                        os.makedirs(data_dir)
                        header["dump_data_dir"] = data_dir
                    dump_json = _DumpJson(os.path.join(rank_dir, "dump.json"), header)
                    for name in ("stack.json", "construct.json"):
                        _atomic_write_json(os.path.join(rank_dir, name), {})
                elif kind == "entries":
                    dump_json.append(item[1])
                elif kind == "tensor":
                    try:
                        _write_npy(os.path.join(rank_dir, "dump_tensor_data", item[1]), item[2])
                    finally:
                        with self._bytes_cv:
                            self._bytes -= item[2].nbytes
                            self._bytes_cv.notify_all()
                elif kind == "meta":
                    _atomic_write_json(os.path.join(rank_dir, "stack.json"), item[1])
                    _atomic_write_json(os.path.join(rank_dir, "construct.json"), item[2])
            except Exception as exc:  # never kill the thread: report once, keep going
                if self._error is None:
                    self._error = exc
                    import logging
                    logging.getLogger("probe").error("probe: writing dump files failed: %s", exc)
