"""Forked: a function run in a forked child; whatever goes wrong there, the value (or the
function's own exception) still comes back, computed in this process."""
import os
import threading

import pytest

from probe.compare.forked import Forked

PARENT = os.getpid()


def in_child():
    return os.getpid() != PARENT


def test_value_comes_from_the_child():
    job = Forked(lambda: (os.getpid(), [1.5] * 1000))
    pid, value = job.result()
    assert pid != PARENT and value == [1.5] * 1000


def test_a_dead_child_is_replaced_by_this_process():
    job = Forked(lambda: os._exit(3) if in_child() else "here")
    assert job.result() == "here"


def test_an_exception_in_the_child_is_raised_here_with_its_own_traceback():
    def fails():
        raise KeyError("missing key" if in_child() else "missing key here")
    with pytest.raises(KeyError, match="missing key here"):
        Forked(fails).result()


def test_an_unpicklable_result_is_computed_here():
    job = Forked(lambda: threading.Lock() if in_child() else "computed here")
    assert job.result() == "computed here"


def test_disabled_or_cancelled_runs_here():
    assert Forked(lambda: os.getpid(), enabled=False).result() == PARENT
    job = Forked(lambda: os.getpid())
    job.cancel()
    assert job.result() == PARENT
