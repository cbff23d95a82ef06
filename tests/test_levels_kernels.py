"""Level L2 (issue #3, item 3): every aten kernel, forward and backward, named
``Aten.{op}.{overload}.{N}.forward`` and filtered by the YAML's aten section.

The reference is what a dispatch mode of the test itself sees in an identical run.
"""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_summary, load_dump, torch_stats
from level_models import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from probe.torch_compat import op_name


def _yaml_aten():
    from probe.hook_module.registry import load_registry
    return set(load_registry().ops["aten"])


class Recorder(TorchDispatchMode):
    """The test's own view: aten ops in call order, their outputs' statistics, and whether
    autograd ran them. Outputs are not kept: a live reference stops AccumulateGrad from
    stealing a gradient buffer, which changes the kernels run (an extra copy_)."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = op_name(func)
        if op in self.ops:
            backward = torch._C._current_autograd_node() is not None
            stats = None
            if isinstance(out, torch.Tensor) and out.numel() and out.is_floating_point():
                stats = torch_stats(out)
            self.calls.append((f"Aten.{op}.{func._overloadname}", stats, backward))
        return out


def _named(calls):
    counts, names = {}, []
    for op, _, _ in calls:
        n = counts.get(op, 0)
        counts[op] = n + 1
        names.append(f"{op}.{n}.forward")
    return names


def _one_step(dbg=None, recorder=None):
    tm = tiny_model()
    model, x, y = tm.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if dbg:
        dbg.start()
    if recorder:
        with recorder:
            loss = tm.train_step(model, opt, x, y)
    else:
        loss = tm.train_step(model, opt, x, y)
    if dbg:
        dbg.stop()
        dbg.step()
    return loss


def test_kernels_are_the_ops_a_dispatch_mode_sees(make_debugger, dump_dir):
    rec = Recorder(_yaml_aten())
    _one_step(recorder=rec)
    _one_step(make_debugger(level="L2"))
    data = load_dump(dump_dir)
    expected = _named(rec.calls)
    assert list(data) == expected
    assert any(b for _, _, b in rec.calls) and any(not b for _, _, b in rec.calls)
    assert "Aten.threshold_backward.default.0.forward" in data      # a backward kernel
    for name, (_, stats, _) in zip(expected, rec.calls):
        if stats is not None:
            for key, value in stats.items():
                assert data[name]["output"][0][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (name, key)


def test_kernels_name_the_api_they_ran_under(make_debugger, dump_dir):
    _one_step(make_debugger(level="L2"))
    data = load_dump(dump_dir)
    assert data["Aten.addmm.default.0.forward"]["api"] == "Functional.linear.0.forward"
    assert data["Aten.addmm.default.4.forward"]["api"] == "Functional.linear.4.forward"
    assert data["Aten.native_layer_norm.default.1.forward"]["api"] == "Functional.layer_norm.1.forward"
    # backward kernels point at the backward of the API whose autograd node ran them
    assert data["Aten.threshold_backward.default.0.forward"]["api"] == "Functional.relu.1.backward"
    assert data["Aten.nll_loss_backward.default.0.forward"]["api"] == "Functional.nll_loss.0.backward"
    # the optimizer's in-place updates
    assert data["Aten.add_.Tensor.0.forward"]["api"] == "Tensor.add_.0.forward"
    assert load_dump(dump_dir, name="construct.json") == {}


def test_every_backward_kernel_names_its_api_also_inside_multi_node_apis(make_debugger, dump_dir):
    """A 3-D linear, a chunk (tuple output), batched matmuls and cross_entropy each make
    several autograd nodes; the kernels of every one of them name the API."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 24)
    x = torch.randn(2, 5, 8, requires_grad=True)
    target = torch.randint(0, 8, (10,))
    dbg = make_debugger(level="L2")
    dbg.start()
    q, k, v = lin(x).chunk(3, dim=-1)
    att = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    F.cross_entropy(att.reshape(10, 8), target).backward()
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    names = list(data)
    first_bwd = names.index("Aten.ones_like.default.0.forward")      # the seed of backward
    backward = {k: v.get("api") for k, v in list(data.items())[first_bwd + 1:]}
    assert len(backward) > 20 and all(a and a.endswith(".backward") for a in backward.values()), \
        [k for k, a in backward.items() if not a]
    mm = [a for k, a in backward.items() if k.startswith(("Aten.mm.", "Aten.sum."))]
    assert mm and set(mm) == {"Functional.linear.0.backward"}
    assert backward["Aten.cat.default.0.forward"] == "Tensor.chunk.0.backward"
    assert backward["Aten._log_softmax_backward_data.default.0.forward"] == "Functional.cross_entropy.0.backward"
    assert {a for k, a in backward.items() if k.startswith("Aten.bmm.")} == {
        "Tensor.__matmul__.0.backward", "Tensor.__matmul__.1.backward"}


def test_aten_section_of_the_yaml_filters(make_debugger, dump_dir, tmp_path):
    yaml_path = tmp_path / "ops.yaml"
    yaml_path.write_text("functional:\n  - linear\naten:\n  - addmm\n  - mm\n")
    _one_step(make_debugger(level="L2", wrap_ops_yaml=str(yaml_path)))
    data = load_dump(dump_dir)
    assert data and {k.split(".")[1] for k in data} == {"addmm", "mm"}
    assert len([k for k in data if k.startswith("Aten.addmm.")]) == 5
    # mm runs only in backward (the weight and input grads of each linear)
    assert all(v["api"].endswith(".backward") for k, v in data.items() if k.startswith("Aten.mm."))


def test_L2_in_place_kernel_inputs_are_taken_before_the_kernel(make_debugger, dump_dir):
    x = torch.randn(3, 4)
    expected_in = x.clone()
    dbg = make_debugger(level="L2")
    dbg.start()
    F.relu(x, inplace=True)
    dbg.stop()
    dbg.step()
    entry = load_dump(dump_dir)["Aten.relu_.default.0.forward"]
    assert_summary(entry["input_args"][0], expected_in)
    assert_summary(entry["output"][0], expected_in.clamp(min=0))
