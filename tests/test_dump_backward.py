"""Backward entries (issue #2, item 5) checked against gradients computed by autograd.

A backward entry's ``input`` holds the grads w.r.t. the API's outputs, its ``output`` the
grads w.r.t. its inputs in argument order (None where no gradient flows).
"""
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_summary, load_dump
from models import MAKERS, train_step


def _grads(fn, leaves, weight):
    """(grads w.r.t. the API's outputs, grads w.r.t. ``leaves``) for loss = sum(weight * fn())."""
    out = fn()
    loss = (out * weight).sum()
    g_out = torch.autograd.grad(loss, out, retain_graph=True)[0]
    g_in = torch.autograd.grad(loss, leaves, allow_unused=True)
    return g_out, g_in


def test_linear_backward_in_argument_order(dump_once):
    torch.manual_seed(0)
    x0 = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(3, 6, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    g = torch.randn(4, 3)
    x = x0 * 1.0  # a non-leaf input, as inside a model

    def run():
        out = F.linear(x, w, b)
        (out * g).sum().backward(inputs=[x0, w, b])

    data, _ = dump_once(run)
    g_out, (gx, gw, gb) = _grads(lambda: F.linear(x, w, b), [x, w, b], g)
    entry = data["Functional.linear.0.backward"]
    assert len(entry["input"]) == 1 and len(entry["output"]) == 3
    assert_summary(entry["input"][0], g_out)
    assert_summary(entry["output"][0], gx)
    assert_summary(entry["output"][1], gw)  # weight as given, not transposed
    assert_summary(entry["output"][2], gb)


def test_multi_output_apis_with_outputs_that_get_no_gradient(dump_once):
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)

    def run():
        a, b = torch.split(x, 2, dim=0)          # only a is used
        p, q, r = x.chunk(3, dim=1)              # only q is used
        values, indices = torch.max(x, dim=1)    # indices are not differentiable
        (a * 2).sum().backward(retain_graph=True)
        (q * 3).sum().backward(retain_graph=True)
        values.sum().backward()

    data, _ = dump_once(run)
    split = data["Torch.split.0.backward"]
    assert_summary(split["input"][0], torch.full((2, 6), 2.0))
    assert split["input"][1] is None
    expected = torch.zeros(4, 6)
    expected[:2] = 2.0
    assert_summary(split["output"][0], expected)
    assert split["output"][1:] == [None] * (len(split["output"]) - 1)  # split_size: not a tensor

    chunk = data["Tensor.chunk.0.backward"]
    assert chunk["input"][0] is None and chunk["input"][2] is None
    assert_summary(chunk["input"][1], torch.full((4, 2), 3.0))
    expected = torch.zeros(4, 6)
    expected[:, 2:4] = 3.0
    assert_summary(chunk["output"][0], expected)

    mx = data["Torch.max.0.backward"]
    assert_summary(mx["input"][0], torch.ones(4))
    assert mx["input"][1] is None
    expected = torch.zeros(4, 6).scatter_(1, x.argmax(dim=1, keepdim=True), 1.0)
    assert_summary(mx["output"][0], expected)


def test_in_place_apis_on_non_leaf_tensors(dump_once):
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.randn(3, 4, requires_grad=True)
    g = torch.randn(3, 4)

    def run():
        h = x * 1.0
        h.add_(y, alpha=2.0)
        F.relu(h, inplace=True)
        (h * g).sum().backward()
        return h.detach()

    data, h = dump_once(run)
    grad_h = g * (h > 0)  # grad w.r.t. relu_'s output and h after add_
    relu = data["Functional.relu.0.backward"]
    assert_summary(relu["input"][0], g)
    assert_summary(relu["output"][0], grad_h)
    add = data["Tensor.add_.0.backward"]
    assert_summary(add["input"][0], grad_h)
    assert_summary(add["output"][0], grad_h)          # w.r.t. self (before the update)
    assert_summary(add["output"][1], 2.0 * grad_h)    # w.r.t. other, scaled by alpha
    assert torch.equal(x.grad, grad_h) and torch.equal(y.grad, 2.0 * grad_h)


def test_in_place_on_a_view_does_not_raise_and_grads_are_unchanged(dump_once):
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)

    def run():
        h = x * 1.0
        v = h.transpose(0, 1)
        v.mul_(2.0)
        h[0].add_(1.0)
        (h ** 2).sum().backward()
        return x.grad.clone()

    data, dumped_grad = dump_once(run)
    x.grad = None
    run()
    assert torch.equal(dumped_grad, x.grad)
    assert {"Tensor.transpose.0.forward", "Tensor.mul_.0.forward", "Tensor.__getitem__.0.forward",
            "Tensor.add_.0.forward"} <= set(data)


def test_in_place_on_a_view_records_grads_through_the_base(dump_once):
    """mul_ on a view reaches its input through the base (CopySlices): the grad is cut back
    to the view. The transpose that made the view loses its node to autograd's rewrite, so
    it has no backward entry (a documented limit)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    g = torch.randn(4, 3)

    def run():
        h = x * 1.0
        v = h.transpose(0, 1)
        v.mul_(2.0)
        (v * g).sum().backward()

    data, _ = dump_once(run)
    mul = data["Tensor.mul_.0.backward"]
    assert_summary(mul["input"][0], g)
    assert_summary(mul["output"][0], 2.0 * g)      # grad w.r.t. the view before mul_
    assert torch.equal(x.grad, 2.0 * g.t())


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_in_place_on_a_view_used_only_through_its_base_has_its_backward(dump_once, layout):
    """mul_ on a slice, then only the base is used: the slice's own node never runs, so
    the grads w.r.t. the output come from the base's CopySlices, cut to the slice (also
    when the base's gradient is laid out unlike the base: channels_last base)."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4, requires_grad=True)
    g = torch.randn(2, 3, 4, 4)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format

    def run():
        h = (x * 1.0).contiguous(memory_format=fmt)
        h[:, 1:, :, 1:3].mul_(2.0)
        (h * g).sum().backward()

    data, _ = dump_once(run)
    mul = data[next(k for k in data if k.startswith("Tensor.mul_.") and k.endswith(".backward"))]
    assert_summary(mul["input"][0], g[:, 1:, :, 1:3])
    assert_summary(mul["output"][0], 2.0 * g[:, 1:, :, 1:3])    # w.r.t. the slice before mul_
    expected = g.clone()
    expected[:, 1:, :, 1:3] *= 2.0
    assert torch.equal(x.grad, expected)


def test_api_whose_output_gets_no_gradient_has_no_backward_entry(dump_once):
    x = torch.randn(3, requires_grad=True)

    def run():
        torch.exp(x)              # result dropped
        torch.sin(x).sum().backward()

    data, _ = dump_once(run)
    assert "Torch.exp.0.forward" in data and "Torch.exp.0.backward" not in data
    assert_summary(data["Torch.sin.0.backward"]["output"][0], torch.cos(x.detach()))


def test_api_whose_nodes_run_in_part_is_finished_when_the_backward_pass_ends(dump_once):
    """meshgrid's outputs come from one node per input; with only the first output used,
    the second node never runs, so the entry is completed by the end of the pass (once
    per pass, for every record it touched), in each of two passes."""
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    y = torch.randn(4, requires_grad=True)

    def run():
        for k in (2.0, 5.0):
            a, b = torch.meshgrid(x, y, indexing="ij")   # only a is used
            (a * k).sum().backward()

    data, _ = dump_once(run)
    for n, k in enumerate((2.0, 5.0)):
        entry = data[f"Torch.meshgrid.{n}.backward"]
        assert_summary(entry["input"][0], torch.full((3, 4), k))
        assert entry["input"][1] is None
        assert_summary(entry["output"][0], torch.full((3,), 4 * k))
        assert entry["output"][1] is None

def test_sparse_gradient_does_not_break_backward(dump_once):
    w = torch.randn(10, 4, requires_grad=True)
    idx = torch.tensor([1, 2, 2])

    def run():
        F.embedding(idx, w, sparse=True).sum().backward()

    data, _ = dump_once(run)
    assert w.grad.is_sparse
    assert "Functional.embedding.0.forward" in data


@pytest.mark.parametrize("model_name", sorted(MAKERS))
def test_real_models_every_differentiable_forward_has_a_backward(dump_once, model_name):
    model, x, y = MAKERS[model_name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data, _ = dump_once(lambda: train_step(model, opt, x, y))
    names = list(data)
    first_bwd = next(i for i, n in enumerate(names) if n.endswith(".backward"))
    # the forward pass (the optimizer step after backward runs under no_grad)
    forwards = [n[: -len(".forward")] for n in names[:first_bwd]
                if any(o and o.get("requires_grad") for o in _flat(data[n].get("output", [])))]
    assert forwards, "nothing differentiable was dumped"
    missing = [n for n in forwards if n + ".backward" not in data]
    assert missing == []
    for n in forwards:
        bwd = data[n + ".backward"]
        assert len(bwd["input"]) == len(data[n + ".forward"]["output"])
        assert len(bwd["output"]) >= 1


def test_real_model_parameter_grads_match_autograd(dump_once):
    """Each Linear's dumped weight/bias grad equals the .grad autograd leaves on the parameter."""
    model, x, y = MAKERS["mlp"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: params (and so grads) stay comparable
    data, _ = dump_once(lambda: train_step(model, opt, x, y))
    for i, layer in enumerate([model.fc1, model.fc2, model.head]):
        out = data[f"Functional.linear.{i}.backward"]["output"]
        assert_summary(out[1], layer.weight.grad)
        assert_summary(out[2], layer.bias.grad)


@pytest.mark.parametrize("model_name", sorted(MAKERS))
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_training_is_bitwise_identical_with_dumping(make_debugger, model_name, task):
    """3 seeded training steps with and without dumping: same losses, params and grads, bit for bit."""
    def train(dump):
        model, x, y = MAKERS[model_name]()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        dbg = make_debugger(task=task) if dump else None
        losses = []
        for _ in range(3):
            if dbg:
                dbg.start()
            losses.append(train_step(model, opt, x, y).detach())
            if dbg:
                dbg.stop()
                dbg.step()
        return losses, [p.detach().clone() for p in model.parameters()], [p.grad.clone() for p in model.parameters()]

    off = train(False)
    on = train(True)
    for a, b in zip(off, on):
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


def _flat(items):
    for it in items:
        if isinstance(it, list):
            yield from _flat(it)
        elif isinstance(it, dict):
            yield it


def test_deferred_gradient_fetch_gives_the_same_entries(make_debugger, dump_dir, monkeypatch):
    """The accelerator path (one host fetch per backward entry) forced on the CPU."""
    from probe.dump.entry_builder import EntryBuilder
    from probe.dump.stats import SummaryCache

    def dumped(defer, path):
        monkeypatch.setattr(EntryBuilder, "defer_grad_fetch", defer)
        monkeypatch.setattr(SummaryCache, "defer_on_cpu", defer)
        model, x, y = MAKERS["gpt"]()
        dbg = make_debugger(dump_path=path)
        dbg.start()
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
        dbg.stop()
        dbg.step()
        return load_dump(path)

    plain = dumped(False, dump_dir + "/plain")
    deferred = dumped(True, dump_dir + "/deferred")
    backward = [name for name in plain if name.endswith(".backward")]
    assert backward and list(plain) == list(deferred)
    for name in backward:
        assert deferred[name] == plain[name], name


def test_async_dump_fetches_at_flush_and_gives_the_same_entries(make_debugger, dump_dir, monkeypatch):
    """async_dump on an accelerator: numbers fetched at dump.json flushes, not per call
    (forced on the CPU here); the entries must equal a normal dump's."""
    from probe.dump.stats import SummaryCache

    def dumped(path, **kwargs):
        model, x, y = MAKERS["gpt"]()
        dbg = make_debugger(dump_path=path, **kwargs)
        dbg.start()
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.01), x, y)
        dbg.stop()
        dbg.step()
        return load_dump(path)

    plain = dumped(dump_dir + "/plain")
    monkeypatch.setattr(SummaryCache, "defer_on_cpu", True)
    deferred = dumped(dump_dir + "/async", async_dump=True)
    assert list(plain) == list(deferred)
    for name in plain:
        assert deferred[name] == plain[name], name
