"""One process per dump folder: an OS lock on ``{dump_path}/.probe-{rank folder}.lock``.

Two runs dumping into the same ``dump_path`` and rank at once mixed their files without a
word: dump.json came from one run and the tensor files from both (358 of 652 tensors
disagreed with its statistics). The debugger takes this lock before it makes its first
folder for a rank and holds it until ``close()``; a second process asking for the same
dump_path and rank is refused with one ``ConfigError`` line. Different ranks are
different files, so the ranks of one job never wait on each other.

``flock`` is released by the kernel when its process ends, however it ends: a crashed or
killed run leaves at most the empty file behind, never a lock that blocks the next run.
Where ``fcntl`` does not exist (Windows) there is no lock: two runs there must be kept
apart by hand, as before. A file system without locks (some network mounts answer
ENOLCK) gets one warning and no lock, rather than a refused run.
"""
from __future__ import annotations

import errno
import logging
import os
from typing import IO, Optional

from probe.errors import ConfigError

try:
    import fcntl
except ImportError:          # Windows: no flock; see the module docstring
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

_BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


def lock_path(dump_path: str, rank_folder: str) -> str:
    """The lock file of ``rank_folder`` (``rank0``, or ``rank`` without torch.distributed)."""
    return os.path.join(dump_path, f".probe-{rank_folder}.lock")


class FolderLock:
    """The lock of one ``dump_path`` and rank folder, taken by ``acquire()``."""

    def __init__(self, dump_path: str, rank_folder: str, source: str):
        self.dump_path = dump_path
        self.rank_folder = rank_folder
        self.source = source            # names config.json (or the keyword argument) in the refusal
        self.path = lock_path(dump_path, rank_folder)
        self._file: Optional[IO[bytes]] = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> None:
        """Take the lock, or raise a one-line ConfigError naming the process that holds it."""
        if fcntl is None or self._file is not None:
            return
        os.makedirs(self.dump_path, exist_ok=True)
        while True:
            f = open(self.path, "a+b")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                f.close()
                if exc.errno in _BUSY:
                    raise ConfigError(self._refusal()) from None
                log.warning("probe: no lock on %s (%s): nothing keeps a second run from dumping "
                            "into %s at the same time", self.path, exc.strerror or exc, self.dump_path)
                return
            # The holder before us removes the file as it lets go: a lock on the file it
            # removed guards nothing. Take it again unless the path is still this file.
            mine = os.fstat(f.fileno())
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                break
            f.close()
        f.truncate(0)
        f.write(f"{os.getpid()}\n".encode())
        f.flush()
        self._file = f

    def release(self) -> None:
        """Let go: the file is removed first (while still locked), then unlocked; a forked
        child that shares the descriptor does not keep it."""
        f, self._file = self._file, None
        if f is None or fcntl is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        finally:
            f.close()

    def _refusal(self) -> str:
        holder = ""
        try:
            with open(self.path, "rb") as f:
                pid = f.read(32).decode("ascii", "replace").strip()
            if pid.isdigit():
                holder = f" (pid {pid})"
        except OSError:
            pass
        return (f"{self.source}: dump_path: another process{holder} is dumping {self.rank_folder} into "
                f"{self.dump_path!r} now; two runs in one folder mix their files: give this run its own dump_path")
