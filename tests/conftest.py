"""Shared fixtures for the dump tests: a fresh dump folder, debuggers closed after each test."""
import json
import logging
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")


def load_dump(dump_path, step=0, rank_dir="rank", name="dump.json"):
    """The parsed ``{dump_path}/step{step}/{rank_dir}/{name}`` (``data`` for dump.json)."""
    with open(os.path.join(str(dump_path), f"step{step}", rank_dir, name), encoding="utf-8") as f:
        doc = json.load(f)
    return doc["data"] if name == "dump.json" else doc


@pytest.fixture
def dump_dir(tmp_path_factory):
    """A new, empty folder whose path holds only characters dump_path allows."""
    return str(tmp_path_factory.mktemp("dump"))


@pytest.fixture
def make_debugger(dump_dir):
    """``make_debugger(**kwargs)`` -> PrecisionDebugger on ``dump_dir``; closed after the test."""
    from probe import PrecisionDebugger
    made = []

    def make(**kwargs):
        kwargs.setdefault("dump_path", dump_dir)
        dbg = PrecisionDebugger(**kwargs)
        made.append(dbg)
        return dbg

    yield make
    for dbg in made:
        dbg.close()


@pytest.fixture
def dump_once(make_debugger, dump_dir):
    """``dump_once(fn, **kwargs)``: run ``fn()`` as one dumped step; return (step-0 data, fn's result)."""
    def run(fn, **kwargs):
        dbg = make_debugger(**kwargs)
        dbg.start()
        try:
            result = fn()
        finally:
            dbg.stop()
        dbg.step()
        return load_dump(dump_dir), result
    return run


def torch_stats(t):
    """Max/Min/Mean/Norm of ``t`` computed by torch in float64 (the reference values)."""
    import torch
    w = t.detach().to(torch.float64)
    return {"Max": w.max().item(), "Min": w.min().item(), "Mean": w.mean().item(),
            "Norm": torch.linalg.vector_norm(w).item()}


def assert_summary(summary, t, rel=1e-5):
    """A dumped tensor summary describes ``t``: dtype, shape and torch's own statistics."""
    assert summary is not None, "no summary where a tensor was expected"
    assert summary["type"] == "torch.Tensor"
    assert summary["dtype"] == str(t.dtype)
    assert summary["shape"] == list(t.shape)
    expected = torch_stats(t)
    for key, value in expected.items():
        assert summary[key] == pytest.approx(value, rel=rel, abs=1e-7, nan_ok=True), key


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module: on a shared, loaded machine torch's thread pool makes
    each of a compare's thousands of tiny tensor ops wait for a busy core (x40 the CPU time)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class LogCapture(logging.Handler):
    """The records of one logger and its children at ``level`` and above, also where the
    logger does not propagate to the root (torch's), which pytest's caplog would miss.

        with LogCapture("torch._dynamo", logging.DEBUG) as log: ...
        log.messages
    """

    def __init__(self, name, level):
        super().__init__(level)
        self.logger = logging.getLogger(name)
        self.records = []

    def __enter__(self):
        self.saved_level = self.logger.level
        self.logger.setLevel(self.level)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.saved_level)

    def emit(self, record):
        self.records.append(record)

    @property
    def messages(self):
        return [r.getMessage() for r in self.records]


def _pt_loads():
    from probe.torch_compat import SAFE_WEIGHTS_ONLY
    return SAFE_WEIGHTS_ONLY


# Tests that read .pt files back (msprobe's tensor dumps, probe's pt format, the toolbox's
# captures): before torch 2.6 probe refuses them (weights_only can be bypassed, CVE-2025-32434)
needs_pt_loads = pytest.mark.skipif(not _pt_loads(), reason="torch < 2.6: probe refuses to load .pt files "
                                    "(torch.load's weights_only can be bypassed, CVE-2025-32434)")
