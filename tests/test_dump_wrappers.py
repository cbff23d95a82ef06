"""A user's wrapper put in an API's place (``F.silu = npu_silu``, calling the saved
original, as porting patches do) runs exactly once under the debugger, the call is dumped
once under the API's name, and the outputs are bitwise those of the plain run."""
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from conftest import load_dump  # noqa: E402

SCALE = 1.01


def _scaled(orig, seen, key):
    def npu_wrapper(*args, **kwargs):
        seen[key] = seen.get(key, 0) + 1
        return orig(*args, **kwargs) * SCALE
    return npu_wrapper


def _counted(orig, seen, key):
    def npu_wrapper(*args, **kwargs):
        seen[key] = seen.get(key, 0) + 1
        return orig(*args, **kwargs)
    return npu_wrapper


# (owner, attribute, API name, wrapper kind, call)
CASES = [
    (F, "silu", "Functional.silu", _scaled, lambda x: F.silu(x)),
    (F, "gelu", "Functional.gelu", _scaled, lambda x: F.gelu(x)),
    (F, "layer_norm", "Functional.layer_norm", _scaled, lambda x: F.layer_norm(x, (8,))),
    (torch, "matmul", "Torch.matmul", _scaled, lambda x: torch.matmul(x, x.T)),
    (torch.Tensor, "split", "Tensor.split", _counted, lambda x: torch.cat(x.split(3, dim=1), dim=1)),
    (torch.Tensor, "softmax", "Tensor.softmax", _scaled, lambda x: x.softmax(-1)),
]


def _run(case, x):
    return case[4](x)


@pytest.mark.parametrize("when", ["before_start", "after_start"])
@pytest.mark.parametrize("case", CASES, ids=[c[2] for c in CASES])
def test_wrapper_runs_once(case, when, make_debugger, dump_dir):
    owner, attr, api, kind, call = case
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    original = getattr(owner, attr)
    own = attr in vars(owner)   # Tensor.softmax lives on TensorBase: restored by deleting
    seen = {}

    def restore():
        if own:
            setattr(owner, attr, original)
        elif attr in vars(owner):
            delattr(owner, attr)
    try:
        setattr(owner, attr, kind(original, seen, attr))
        plain = call(x)
        assert seen[attr] == 1
        if when == "after_start":   # the debugger resolved torch's own function
            restore()
            dbg = make_debugger(task="statistics", level="L1")
            dbg.start()
            setattr(owner, attr, kind(original, seen, attr))
        else:                       # the debugger met the wrapper where the API was
            dbg = make_debugger(task="statistics", level="L1")
            dbg.start()
        got = call(x)
        dbg.stop()
        assert seen[attr] == 2, f"the wrapper ran {seen[attr] - 1} times under the debugger"
        dbg.step()
        got_after = call(x)
        assert seen[attr] == 3
    finally:
        restore()
    assert torch.equal(plain, got) and torch.equal(plain, got_after)
    data = load_dump(dump_dir)
    entries = [k for k in data if k.startswith(api + ".") and k.endswith(".forward")]
    assert entries == [api + ".0.forward"], list(data)
    assert data[api + ".0.forward"]["output"][0]["shape"] == list(
        (plain if not isinstance(plain, tuple) else plain[0]).shape) or attr == "split"


def test_bare_wrapper_inside_a_model_trains_identically(make_debugger):
    """The issue's case: a model calling F.silu, patched to a wrapper, trained 2 steps."""
    seen = {}
    original = F.silu

    def run(debug):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = make_debugger(task="statistics", level="L1") if debug else None
        for _ in range(2):
            if dbg:
                dbg.start()
            loss = model(torch.ones(4, 8)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if dbg:
                dbg.stop()
                dbg.step()
        return [p.detach().clone() for p in model.parameters()]
    try:
        F.silu = _scaled(original, seen, "silu")
        plain = run(False)
        n_plain = seen["silu"]
        debugged = run(True)
    finally:
        F.silu = original
    assert seen["silu"] == 2 * n_plain == 4
    assert all(torch.equal(a, b) for a, b in zip(plain, debugged))
