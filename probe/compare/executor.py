"""Where a run's pairs are compared: here, in local worker processes, or on a Dask cluster.

Local: one process per pair at a time, ``min(pairs, cores)`` processes, each comparing its
pair single-threaded (no pools inside pools). The workers are *spawned* fresh
interpreters that import only probe: a spawn or forkserver child normally re-imports the
parent's ``__main__`` first, so a pool started from a plain script without an
``if __name__ == "__main__":`` guard would run the script again in every child (and
recurse). The parent's ``__main__`` is hidden from multiprocessing while the workers
start, so there is nothing to re-run.

Dask: ``scheduler="tcp://host:8786"`` (or any ``concurrent.futures.Executor``, e.g.
``Client(...).get_executor()``) runs the pairs on a cluster whose workers can read the
dumps and write the output folder (a shared file system). Needs ``probe[dask]``.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import types
from concurrent.futures import as_completed
from probe.errors import ConfigError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def library_main():
    """While inside, ``__main__`` is an empty module: processes started here (spawn,
    forkserver) get nothing to re-import but the library their work needs."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = main


def local_processes(n_jobs: int, processes: int | None = None) -> int:
    """Worker processes for ``n_jobs`` pairs: one per pair, at most one per core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if processes is not None and processes < 1:
        raise ConfigError(f"processes must be >= 1, got {processes}")
    return max(1, min(n_jobs, processes or cores))


def dask_executor(scheduler: str):
    """(executor, client) on an existing Dask cluster at ``scheduler``."""
    try:
        from distributed import Client
    except ImportError:
        raise ImportError("--scheduler needs dask.distributed: pip install 'probe[dask]'") from None
    client = Client(scheduler)
    return client.get_executor(pure=False), client


def map_pairs(fn, jobs: list, executor=None, scheduler: str | None = None,
              processes: int | None = None, on_error=None):
    """Yield ``fn(job)`` for every job, as each finishes (``fn`` must be a module-level
    function of the library: workers import it by name). ``on_error(job, exc)``: what to
    yield for a job whose worker died (a crashed process, a lost Dask worker) instead of
    raising."""
    def outcome(fut, job):
        try:
            return fut.result()
        except Exception as exc:
            if on_error is None:
                raise
            log.warning("probe compare: a worker failed on %s: %s", getattr(job, "key", job), exc)
            return on_error(job, exc)

    client = None
    if executor is None and scheduler:
        executor, client = dask_executor(scheduler)
    try:
        if executor is not None:
            futures = {executor.submit(fn, job): job for job in jobs}
            for fut in as_completed(futures):
                yield outcome(fut, futures[fut])
            return
        n = local_processes(len(jobs), processes)
        if n == 1:
            for job in jobs:
                yield fn(job)
            return
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"))
        try:
            with library_main():             # workers start inside submit()
                futures = {pool.submit(fn, job): job for job in jobs}
            for fut in as_completed(futures):
                yield outcome(fut, futures[fut])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        if client is not None:
            client.close()
