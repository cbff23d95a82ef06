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
    """pip install builds _cstats when a C compiler is on the machine (else the fallback runs)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert stats._cstats is not None, "probe.dump._cstats was not built: run pip install -e . again"
