"""The end of a ``probe`` command's process, without freeing what it no longer needs.

A compare of the 100k-entry pair of bench/compare.py holds some ten million small objects
(rows, pairs, columns, the diagnosis); freeing them one by one when the command returns
took ~3 s of its ~18, for a process about to end anyway.  A command that runs as the
``probe`` program (``cli.console_main`` sets ``ENDING``) hands what it holds to ``keep``;
``end`` then flushes the standard streams and logging and ends the process at once
(``os._exit``: no atexit handlers, so only where something was kept).  Called from Python
(``probe.cli.main``, ``probe.compare.compare``), nothing is kept and everything is freed.
"""
from __future__ import annotations

import logging
import os
import sys

ENDING = False          # set by the ``probe`` program: the process ends with its command
_kept: list = []


def keep(obj) -> None:
    """Hold ``obj`` until the process ends, where it ends with the command."""
    if ENDING:
        _kept.append(obj)


def end(rc: int):
    """End the process with status ``rc``: at once where a command kept its objects."""
    if _kept:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        logging.shutdown()
        os._exit(rc)
    sys.exit(rc)
