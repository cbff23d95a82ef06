"""Files written whole or not at all.

A writer that fails half-way (a full disk, a text that cannot be encoded, an interrupt)
must not leave half a workbook beside the previous compare's summary, nor a script cut
off mid-line. Each file is written under a temporary name in its own folder (so the
rename is atomic: same file system) and renamed to its name once complete; on failure
the temporary file is removed and whatever had the name before is left as it was.

    with replaced_when_written(path) as tmp:      # one file
        write(tmp)

    with WrittenTogether() as files:              # several: renamed only when all are done
        write_a(files.path(a))
        write_b(files.path(b))
"""
from __future__ import annotations

import contextlib
import os
import secrets
from typing import Iterator


def temporary_name(path: str) -> str:
    """A name beside ``path`` that no other writer (process or thread) picks."""
    return f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


@contextlib.contextmanager
def replaced_when_written(path: str) -> Iterator[str]:
    """Yield a temporary name for ``path``; rename it to ``path`` when the block ends
    without an error, remove it when it raises."""
    tmp = temporary_name(path)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    os.replace(tmp, path)


class WrittenTogether:
    """The outputs of one job (a compare's workbook, CSV, page and summary): each written
    under a temporary name, all renamed at the end of the block if it raised nothing,
    none otherwise. A reader never sees one of them without the others being complete."""

    def __init__(self):
        self.pending: list = []       # (temporary name, final name)

    def path(self, final: str) -> str:
        """The temporary name to write ``final`` to."""
        tmp = temporary_name(final)
        self.pending.append((tmp, final))
        return tmp

    def __enter__(self) -> WrittenTogether:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        pending, self.pending = self.pending, []
        if kind is not None:
            for tmp, _ in pending:
                _remove(tmp)
            return
        try:
            for tmp, final in pending:
                os.replace(tmp, final)
        except BaseException:
            for tmp, _ in pending:
                _remove(tmp)
            raise
