"""Tensor statistics: the compiled one-pass path and the numpy/torch fallback agree with torch.

Every case runs through both ``stats.reductions`` paths (the ``_cstats`` extension and,
with it switched off, numpy/torch) and is checked against torch's own float64 values.
"""
import shutil
import sysconfig

import pytest
import torch
from conftest import torch_stats

from probe.dump import stats

CASES = {
    "f32_small": lambda: torch.randn(7),
    "f32_block_multiple": lambda: torch.randn(4, 64),
    "f32_big_odd": lambda: torch.randn(100_003) * 3 + 1,        # GIL released, SSE tail
    "f32_weight": lambda: torch.randn(512, 256),
    "f32_zero_dim": lambda: torch.tensor(-2.5),
    "f32_large_values": lambda: torch.randn(1000) * 1e30,       # squares overflow float32
    "f32_tiny_values": lambda: torch.randn(1000) * 1e-30,
    # HF's additive attention mask (0 or float32's min): its sum overflows float32
    "f32_mask_sum_overflows_f32": lambda: torch.where(torch.rand(2, 1, 16, 16) > 0.5, 0.0,
                                                      torch.finfo(torch.float32).min),
    "f32_mask_big": lambda: torch.where(torch.rand(40_000) > 0.5, 0.0, torch.finfo(torch.float32).min),
    "bf16_sum_overflows_f32": lambda: torch.full((64,), -3e38, dtype=torch.bfloat16),
    "f64": lambda: torch.randn(333, dtype=torch.float64),
    "bf16": lambda: (torch.randn(1000) * 100).to(torch.bfloat16),
    "f16": lambda: (torch.randn(300) * 1000).to(torch.float16),
    "f16_subnormal": lambda: torch.tensor([1e-7, -3e-6, 5.9e-8, 0.0], dtype=torch.float16),
    "f16_sum_overflows_f16": lambda: torch.full((4096,), 60000.0, dtype=torch.float16),
    "i64": lambda: torch.randint(-10**12, 10**12, (50,)),
    "i32": lambda: torch.randint(-1000, 1000, (77,), dtype=torch.int32),
    "i16": lambda: torch.randint(-1000, 1000, (77,), dtype=torch.int16),
    "i8": lambda: torch.randint(-128, 127, (99,), dtype=torch.int8),
    "u8": lambda: torch.randint(0, 255, (99,), dtype=torch.uint8),
    "bool": lambda: torch.rand(40) > 0.3,
    "transposed": lambda: torch.randn(64, 96).t(),              # non-contiguous
    "sliced": lambda: torch.randn(10, 100)[:, 3:50],
    "neg_view": lambda: torch._neg_view(torch.randn(70)),
    "requires_grad": lambda: torch.randn(70, requires_grad=True),
    "nan": lambda: torch.tensor([1.0, float("nan"), 3.0] * 40),
    "nan_in_tail": lambda: torch.cat([torch.randn(128), torch.tensor([float("nan")])]),
    "inf": lambda: torch.tensor([1.0, float("inf"), -3.0] * 40),
    "inf_minus_inf": lambda: torch.tensor([-float("inf"), float("inf")] * 50),
    "bf16_nan": lambda: torch.tensor([1.0, float("nan"), -2.0], dtype=torch.bfloat16),
    "f64_nan": lambda: torch.tensor([float("nan"), 1.0], dtype=torch.float64),
}


@pytest.fixture(params=["compiled", "fallback"])
def path(request, monkeypatch):
    if request.param == "compiled":
        if stats._cstats is None:
            pytest.skip("probe.dump._cstats not built (no C compiler)")
    else:
        monkeypatch.setattr(stats, "_KINDS", {})
    return request.param


def _summary(t):
    r = stats.reductions(t)
    return stats.fetch([r])[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_matches_torch_float64(path, case):
    torch.manual_seed(0)
    t = CASES[case]()
    before = t.clone()
    mx, mn, mean, norm = _summary(t)
    expected = torch_stats(t)
    for key, value in zip(("Max", "Min", "Mean", "Norm"), (mx, mn, mean, norm)):
        assert value == pytest.approx(expected[key], rel=1e-5, abs=1e-7, nan_ok=True), key
    if t.dtype == torch.bool:
        assert type(mx) is bool and type(mn) is bool
    elif not t.dtype.is_floating_point:
        assert type(mx) is int and type(mn) is int
    assert torch.equal(t, before) or torch.isnan(t).any()     # the tensor is only read
    assert t.grad_fn is None


def test_compiled_path_has_float64_accuracy():
    """A sum whose float32 accumulation loses digits: the compiled path keeps them."""
    if stats._cstats is None:
        pytest.skip("probe.dump._cstats not built (no C compiler)")
    t = torch.cat([torch.full((1,), 1e8), torch.ones(1 << 20)])
    _, _, mean, norm = _summary(t)
    w = t.double()
    # float32 accumulation is off by ~1e-7 here
    assert mean == pytest.approx(w.mean().item(), rel=1e-9)
    assert norm == pytest.approx(w.norm().item(), rel=1e-9)


def test_empty_and_subclass_and_meta_tensors(path):
    assert _summary(torch.empty(0, 3)) == (None, None, None, None)
    assert _summary(torch.empty(4, device="meta")) == (None, None, None, None)

    class Sub(torch.Tensor):
        pass

    s = torch.randn(50).as_subclass(Sub)
    expected = torch_stats(s.as_subclass(torch.Tensor))
    assert _summary(s)[3] == pytest.approx(expected["Norm"], rel=1e-5)


def test_compiled_extension_is_built_where_a_compiler_is():
    """pip install builds _cstats and _cstack when a C compiler is on the machine (else
    the Python paths run)."""
    from probe.dump import stack
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert stats._cstats is not None, "probe.dump._cstats was not built: run pip install -e . again"
    assert stack._frame_key is not None, "probe.dump._cstack was not built: run pip install -e . again"


# ---- the whole summary dict in one compiled call (SummaryCache.summary) ---------------
_FAST_SKIPS = {"transposed", "sliced", "neg_view"}   # taken by reductions' path instead


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_summary_dict_equals_the_python_one(case):
    """What the collector writes for a tensor is the same dict, value for value and key
    for key in order, whether the compiled call or stats.reductions made it."""
    if stats._cstats is None:
        pytest.skip("probe.dump._cstats not built (no C compiler)")
    torch.manual_seed(0)
    t = CASES[case]()
    fast = stats.SummaryCache().summary(t)
    if case in _FAST_SKIPS:
        assert fast is None
        return
    mx, mn, mean, norm = _summary(t)
    slow = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape),
            "Max": mx, "Min": mn, "Mean": mean, "Norm": norm, "requires_grad": t.requires_grad}
    assert list(fast) == list(slow)
    for key in slow:
        same = fast[key] == slow[key] or (fast[key] != fast[key] and slow[key] != slow[key])   # NaN
        assert same and type(fast[key]) is type(slow[key]), key


def test_compiled_summary_is_none_where_python_must_decide():
    if stats._cstats is None:
        pytest.skip("probe.dump._cstats not built (no C compiler)")

    class Sub(torch.Tensor):
        pass

    cache = stats.SummaryCache()
    for t in (torch.empty(0, 3), torch.empty(4, device="meta"), torch.randn(50).as_subclass(Sub),
              torch.complex(torch.randn(3), torch.randn(3)), torch.randn(4, 4).t(), 3.0):
        assert cache.summary(t) is None
    cache.defer_on_cpu = True   # the accelerator path, on CPU tensors (tests)
    assert cache.summary(torch.randn(5)) is None


def test_compiled_summary_cache_follows_identity_and_version():
    """A tensor met again unchanged is not reduced again; changed in place it is, and
    the compiled and Python paths share one cache."""
    if stats._cstats is None:
        pytest.skip("probe.dump._cstats not built (no C compiler)")
    cache = stats.SummaryCache()
    t = torch.randn(100)
    first = cache.summary(t)
    assert cache.lookup(t) == (first["Max"], first["Min"], first["Mean"], first["Norm"])
    fake = (1.0, 2.0, 3.0, 4.0)
    cache.store(t, fake)                    # what the Python path stored is what it reads
    assert [cache.summary(t)[k] for k in ("Max", "Min", "Mean", "Norm")] == list(fake)
    t.add_(1)                               # a new version: reduced again
    again = cache.summary(t)
    assert again["Mean"] == pytest.approx(t.double().mean().item(), rel=1e-9)
    other = t.clone()                       # equal values, another tensor: its own entry
    assert cache.summary(other)["Mean"] == again["Mean"] and cache.lookup(other) is not None
    cache.clear()
    assert cache.lookup(t) is None


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_running_statistics_are_summarised_as_each_batch_norm_call_read_them(tmp_path, task):
    """batch_norm updates running_mean/var inside its kernel, with no version bump: the
    summary of a later call's running statistics must be of their values then, not a
    cached summary of what an earlier call read."""
    import json

    from probe import PrecisionDebugger

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = []   # what each batch_norm call reads as running_mean, in call order
    for m in net:
        if isinstance(m, torch.nn.BatchNorm2d):
            m.register_forward_pre_hook(lambda mod, _: seen.append(mod.running_mean.clone()))
    dbg = PrecisionDebugger(task=task, dump_path=str(tmp_path), level="L1")
    for _ in range(2):
        dbg.start()
        for _ in range(2):   # two forwards a step: each BatchNorm is called twice
            net(torch.randn(2, 3, 10, 10)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    calls = []
    for step in sorted(tmp_path.glob("step*")):
        data = json.loads(next(step.rglob("dump.json")).read_text())["data"]
        calls += [data[f"Functional.batch_norm.{i}.forward"] for i in range(4)]
    assert len(calls) == len(seen) == 8
    for entry, expected in zip(calls, seen):
        running_mean = entry["input_args"][1]
        assert running_mean["Max"] == pytest.approx(expected.max().item(), abs=1e-7)
        assert running_mean["Mean"] == pytest.approx(expected.mean().item(), abs=1e-7)
