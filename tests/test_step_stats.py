"""Accelerator statistics in a per-step device buffer (``probe.dump.step_stats``).

On the CPU the buffer's torch-ops path is run by routing CPU tensors through it, as an
accelerator's tensors go (``StepStats.on_cpu`` with ``SummaryCache.defer_on_cpu``): a real
GPT-2 trained for steps under bf16 autocast, dumped with the buffer and with the path
before it (``stats.device_reductions`` per tensor, fetched by ``stats.fetch``). The fused
Triton kernel runs only where a CUDA device and Triton are (skipped elsewhere).
"""
import math

import pytest
import torch
from real_runs import dump_json, run

from probe.dump import stats, step_stats
from probe.dump.step_stats import StepStats

ONE_PROGRAM = 1 << 16   # triton_stats.ONE_PROGRAM (that module imports only where Triton does)


def _read(root, steps):
    out = []
    for step in range(steps):
        with open(dump_json(root, step), "rb") as f:
            out.append(f.read())
    return out


def test_device_path_through_the_step_buffer_is_bitwise_the_per_tensor_path_with_one_transfer_a_flush(
        tmp_path, monkeypatch):
    monkeypatch.setattr(stats.SummaryCache, "defer_on_cpu", True)   # every tensor waits for the flush

    # before: each tensor's own reductions (device_reductions), one vector each, stats.fetch
    real_reductions = stats.reductions
    with monkeypatch.context() as m:
        m.setattr(stats, "reductions", lambda t, rows=None: stats.device_reductions(t))
        before = _read(run("gpt2", tmp_path / "before", task="statistics", steps=2, bf16=True), 2)

    # after: rows of the step's buffer, fetched in one transfer per flush
    assert stats.reductions is real_reductions
    monkeypatch.setattr(StepStats, "on_cpu", True)
    fetches, transfers, rows = [], [], []
    real_fetch, real_tolist = StepStats.fetch, torch.Tensor.tolist

    def fetch(self, pending):
        n = self.transfers
        calls = []
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "tolist", lambda t: calls.append(t.shape) or real_tolist(t))
            out = real_fetch(self, pending)
        fetches.append(len(pending))
        transfers.append((self.transfers - n, len(calls)))
        rows.extend(shape[0] for shape in calls)
        return out

    monkeypatch.setattr(StepStats, "fetch", fetch)
    after = _read(run("gpt2", tmp_path / "after", task="statistics", steps=2, bf16=True), 2)

    assert after == before
    assert b"torch.bfloat16" in after[0] and b'"Max": null' not in after[0]
    assert len(fetches) >= 2 and sum(fetches) > 200
    assert all(t == (1, 1) for t in transfers), transfers   # one host transfer a flush, nothing else
    assert max(rows) > 100


def test_rows_of_a_full_buffer_go_on_in_a_fresh_one_and_old_rows_stay_readable():
    """More tensors than a buffer has rows: a second buffer, both fetched together; rows
    handed out before a fetch keep their numbers after it (a fresh buffer is started)."""
    s = StepStats(rows=3)
    s.on_cpu = True
    ts = [torch.randn(5, 7) * (i + 1) for i in range(7)] + [torch.tensor([1.0, float("nan")]),
                                                            torch.tensor([float("inf"), 2.0]),
                                                            torch.arange(6, dtype=torch.int32),
                                                            torch.tensor([True, False])]
    pending = [s.add(t) for t in ts]
    assert len({id(p.slot[0]) for p in pending}) == 4
    got = s.fetch(pending)
    assert s.transfers == 1
    want = stats.fetch([stats.device_reductions(t) for t in ts])
    assert [list(map(str, g)) for g in got] == [list(map(str, w)) for w in want]
    assert math.isnan(got[7][0]) and got[8][0] == math.inf and got[9] == (5, 0, 2.5, want[9][3])
    assert got[10][:2] == (True, False)
    late = s.add(torch.ones(4))   # a fresh buffer: the first rows are not written again
    assert late.slot[0] is not pending[0].slot[0]
    assert s.fetch(pending[:1] + [late]) == [got[0], (1.0, 1.0, 1.0, 2.0)]


@pytest.mark.skipif(not torch.cuda.is_available() or step_stats.triton_kernels() is None, reason="needs Triton and a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("n", [1, 1000, ONE_PROGRAM, ONE_PROGRAM * 5 + 3])
def test_fused_rows_are_torch_rows_within_the_summation_order(dtype, n):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(n, generator=g, device="cuda") * 3 + 1).to(dtype)
    s = StepStats()
    fused = s.add(x)
    assert s.launches_fused == 1
    got = s.fetch([fused])[0]
    want = stats.fetch([stats.device_reductions(x)])[0]
    assert got[:2] == want[:2]                                    # extremes are exact
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert got[2] == pytest.approx(want[2], rel=tol, abs=tol * math.sqrt(n) * 4)
    assert got[3] == pytest.approx(want[3], rel=tol)
    bad = x.clone()
    bad[n // 2] = float("nan")
    inf = x.clone()
    inf[0] = float("inf")
    nan_row, inf_row = s.fetch([s.add(bad), s.add(inf)])
    assert all(math.isnan(v) for v in nan_row)
    assert inf_row[0] == math.inf and inf_row[2] == math.inf and inf_row[3] == math.inf


@pytest.mark.skipif(not torch.cuda.is_available() or step_stats.triton_kernels() is None, reason="needs Triton and a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_list_rows_are_torch_rows_within_the_summation_order(dtype):
    """The list kernel (two launches for many tensors) against each tensor's torch ops:
    sizes around its chunk, tensors before and after the first in memory, a view into the
    middle of another, NaN and Inf, rows written past the buffer's first."""
    g = torch.Generator(device="cuda").manual_seed(0)
    later = torch.randn(5000, generator=g, device="cuda").to(dtype)   # likely below the first in memory
    sizes = [1, 7, 16384, 16385, 3 * 16384 + 5, 1000, 200_003]
    ts = [(torch.randn(n, generator=g, device="cuda") * (k + 1) + k).to(dtype) for k, n in enumerate(sizes)]
    big = torch.randn(64, 1000, generator=g, device="cuda").to(dtype)
    nan, inf = ts[5].clone(), ts[3].clone()
    nan[17] = float("nan")
    inf[0] = float("inf")
    ts = ts + [later, big[3:40], nan, inf]
    s = StepStats()
    s.add(torch.ones(3, device="cuda"))   # the list's rows start after a row in use
    s.prefetch(ts)
    assert s.lists_fused == 1
    got = s.fetch([s.add(t) for t in ts])
    want = stats.fetch([stats.device_reductions(t) for t in ts])
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for t, a, b in zip(ts, got, want):
        if math.isnan(b[0]):
            assert all(math.isnan(v) for v in a), (a, b)
            continue
        assert a[:2] == b[:2], (t.numel(), a, b)                  # extremes are exact
        assert a[2] == pytest.approx(b[2], rel=tol, abs=4 * tol * b[3] / math.sqrt(t.numel())), (a, b)   # the Mean
        assert a[3] == pytest.approx(b[3], rel=tol), (a, b)


class _TorchKernels:
    """triton_stats' two entry points, written with torch ops on the CPU: what the wiring
    around the kernels does is tested here, the kernels themselves on a GPU."""
    lists: list = []

    @staticmethod
    def fused_row(t, row):
        step_stats._torch_row(t, row)

    @classmethod
    def fused_rows(cls, tensors, buf, first):
        cls.lists.append(len(tensors))
        for k, t in enumerate(tensors):
            step_stats._torch_row(t, buf[first + k])


def _foreach_dumps(tmp_path, monkeypatch, kernels):
    """A GPT-2 trained with AdamW(foreach) for 2 steps, dumped with each tensor started alone
    and then with ``kernels``' list kernel: (alone, with lists), the bytes of each step."""
    monkeypatch.setattr(stats.SummaryCache, "defer_on_cpu", True)
    monkeypatch.setattr(StepStats, "on_cpu", True)
    monkeypatch.setattr(step_stats, "_kernels", kernels)
    monkeypatch.setattr(step_stats, "lists_verified", {})
    monkeypatch.setattr(kernels, "lists", [])
    monkeypatch.setattr(step_stats, "fused_available", lambda t: t.dtype.is_floating_point and t.numel() > 0
                        and t.is_contiguous())
    with monkeypatch.context() as m:
        m.setattr(StepStats, "prefetch", lambda self, values: False)
        alone = _read(run("gpt2", tmp_path / "alone", task="statistics", steps=2, opt="adamw_foreach"), 2)
    assert not kernels.lists
    return alone, _read(run("gpt2", tmp_path / "lists", task="statistics", steps=2, opt="adamw_foreach"), 2)


def test_a_foreach_ops_lists_take_their_rows_together_and_the_dump_is_the_same(tmp_path, monkeypatch):
    """A foreach optimizer's lists are started together (``StepStats.prefetch``), each
    tensor then taking its own row: the dump of a GPT-2 trained with AdamW(foreach) is byte
    for byte the dump with each tensor started alone, and the lists did go together."""
    alone, together = _foreach_dumps(tmp_path, monkeypatch, _TorchKernels)
    assert together == alone
    assert b"_foreach_" in together[1] and b'"Max": null' not in together[1]
    assert max(_TorchKernels.lists) >= 10, _TorchKernels.lists   # the parameters' lists, not pairs
    assert list(step_stats.lists_verified.values()) == [True]   # its self-test passed, once


class _ShiftedKernels(_TorchKernels):
    """A list kernel that writes each tensor's row one place off: wrong numbers, no error."""

    @classmethod
    def fused_rows(cls, tensors, buf, first):
        cls.lists.append(len(tensors))
        for k, t in enumerate(tensors):
            step_stats._torch_row(t, buf[first + (k + 1) % len(tensors)])


def test_a_list_kernel_that_disagrees_with_the_torch_ops_is_said_once_and_set_aside(tmp_path, monkeypatch, caplog):
    """The list kernel is checked against the torch ops on lists of its own before its
    first use in a process; where it disagrees the dump keeps the torch ops' numbers (byte
    for byte the dump without it), said once, never run again."""
    alone, shifted = _foreach_dumps(tmp_path, monkeypatch, _ShiftedKernels)
    assert shifted == alone
    assert len(_ShiftedKernels.lists) == 1 and list(step_stats.lists_verified.values()) == [False]
    said = [r.getMessage() for r in caplog.records if "kernel for lists failed" in r.getMessage()]
    assert len(said) == 1 and "differ from the torch ops'" in said[0], said
