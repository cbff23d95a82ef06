"""One function computed in a forked child process while this process goes on.

Reading the bench dump while the NPU dump is read: both are pure Python and hold the GIL,
so only a second process puts the second core to work.  A fork shares the parent's data
without pickling it; only the result comes back, through a pipe.  (Fit for a child that
builds data of its own: one that walks the parent's objects touches their reference
counts, and copy-on-write then copies every page it touched, on both sides.)

    job = Forked(lambda: expensive(data))
    ...                      # other work here, meanwhile
    value = job.result()     # the child's value; or computed here if the child failed

Whatever goes wrong in the child (no fork on this platform, the child killed, an
exception, an unpicklable result) ends in the same place: ``result()`` calls the function
in this process, so an error surfaces with its normal traceback and nothing is lost.
"""
from __future__ import annotations

import os


def _child(fn, conn):
    try:
        value = (True, fn())
    except BaseException:           # re-raised by running fn in the parent
        value = (False, None)
    try:
        conn.send(value)
    except BaseException:           # e.g. unpicklable: the parent computes it
        conn.send((False, None))
    finally:
        conn.close()


class Forked:
    """``fn()`` in a forked child when ``enabled`` and the machine has a second core."""

    def __init__(self, fn, enabled: bool = True):
        self.fn, self.proc, self.conn = fn, None, None
        if not enabled or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
            return
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        try:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(fn, send), daemon=True)
            proc.start()
        except OSError:             # no processes or pipes to be had: computed in result()
            return
        send.close()
        self.proc, self.conn = proc, recv

    def result(self):
        if self.proc is not None:
            proc, conn, self.proc, self.conn = self.proc, self.conn, None, None
            try:
                ok, value = conn.recv()
                if ok:
                    return value
            except (EOFError, OSError):        # the child died before sending
                pass
            finally:
                conn.close()
                proc.join()
        return self.fn()

    def cancel(self):
        """Stop the child (when this process will not ask for its result)."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.join()
            self.conn.close()
            self.proc = self.conn = None
