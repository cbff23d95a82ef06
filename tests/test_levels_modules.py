"""Level L0 (issue #3, item 1): modules' forward, backward and parameter gradients.

References are msprobe 26.2's own dump of the same tiny-model run and gradients computed
by autograd in a separate run without probe, never probe's own output.
"""
import json
import os

import pytest
import torch
import torch.nn as nn
from conftest import FIXTURES, assert_summary, load_dump
from level_models import InplaceNet, SharedNet, make_hf, tiny_model, train_steps

LEVELS = os.path.join(FIXTURES, "levels")


def msprobe_step(step, name="dump.json", dump="v26_L0_statistics_fp32"):
    """msprobe 26.2's own file of the tiny-model run (tests/fixtures/levels)."""
    with open(os.path.join(LEVELS, dump, f"step{step}", name)) as f:
        doc = json.load(f)
    return doc["data"] if name == "dump.json" else doc


def run_tiny(make_debugger, level, steps=2, **kwargs):
    tm = tiny_model()
    model, x, y = tm.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = make_debugger(level=level, **kwargs)
    for _ in range(steps):
        dbg.start(model=model)
        tm.train_step(model, opt, x, y)
        dbg.stop()
        dbg.step()
    return dbg


def same_stats(ours, theirs):
    """Two summaries (or nested lists/dicts of them) agree; None on our side may be [] on theirs."""
    if isinstance(theirs, dict) and "Max" in theirs:
        assert ours["shape"] == theirs["shape"] and ours["dtype"] == theirs["dtype"]
        for key in ("Max", "Min", "Mean", "Norm"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    elif isinstance(theirs, dict):
        assert set(ours) == set(theirs)
        for k in theirs:
            same_stats(ours[k], theirs[k])
    elif isinstance(theirs, list):
        # msprobe leaves out grads of inputs that need none; probe writes null for them
        ours = [o for o in ours if o is not None] if len(ours) != len(theirs) else ours
        assert len(ours) == len(theirs)
        for o, t in zip(ours, theirs):
            same_stats(o, t)
    else:
        assert ours == theirs


def test_tiny_model_modules_match_msprobe(make_debugger, dump_dir):
    run_tiny(make_debugger, "L0")
    for step in (0, 1):
        ours = load_dump(dump_dir, step)
        theirs = {k: v for k, v in msprobe_step(step).items() if k.startswith("Module.")}
        assert sorted(ours) == sorted(theirs)
        for name, entry in theirs.items():
            for key, value in entry.items():
                same_stats(ours[name][key], value)
        # forward order is call order, as msprobe's
        fwd = [k for k in theirs if ".forward." in k]
        assert [k for k in ours if ".forward." in k] == fwd
        # the forward half of construct.json is msprobe's
        construct = load_dump(dump_dir, step, name="construct.json")
        ref = msprobe_step(step, "construct.json")
        assert {k: construct[k] for k in fwd} == {k: ref[k] for k in fwd}


def _outputs_with_grads(model, run, modules):
    """Reference run: the outputs of ``modules`` per call, with .grad after backward."""
    seen = []

    def keep(module, args, out):
        out.retain_grad()
        seen.append((module, out))
    handles = [m.register_forward_hook(keep) for m in modules]
    run()
    for h in handles:
        h.remove()
    return seen


def test_shared_module_counts_calls_and_tied_weights(make_debugger, dump_dir):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ref_model = SharedNet()
    model = SharedNet()
    model.load_state_dict(ref_model.state_dict())
    seen = _outputs_with_grads(ref_model, lambda: ref_model(x).pow(2).sum().backward(), [ref_model.block])

    dbg = make_debugger(level="L0")
    dbg.start(model)
    model(x).pow(2).sum().backward()
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    for n in (0, 1):
        assert f"Module.block.Sequential.forward.{n}" in data
        assert f"Module.block.0.Linear.forward.{n}" in data
        assert_summary(data[f"Module.block.Sequential.forward.{n}"]["output"][0], seen[n][1])
        assert_summary(data[f"Module.block.Sequential.backward.{n}"]["input"][0], seen[n][1].grad)
    assert "Module.block.Sequential.forward.2" not in data
    # tied weight: both owners report the full gradient of the shared tensor
    for owner in ("inp", "out"):
        assert_summary(data[f"Module.{owner}.Linear.parameters_grad.0"]["weight"][0], ref_model.inp.weight.grad)
    assert_summary(data["Module.inp.Linear.parameters_grad.0"]["bias"][0], ref_model.inp.bias.grad)


def test_inplace_relu_modules(make_debugger, dump_dir):
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ref = InplaceNet()
    model = InplaceNet()
    model.load_state_dict(ref.state_dict())
    pre = []
    ref.fc.register_forward_hook(lambda m, a, out: pre.append(out.detach().clone()) and None)
    seen = _outputs_with_grads(ref, lambda: ref(x).sum().backward(), [ref.act])

    dbg = make_debugger(level="L0")
    dbg.start(model)
    out = model(x)
    out.sum().backward()
    dbg.stop()
    dbg.step()
    assert torch.equal(out, ref(x))
    data = load_dump(dump_dir)
    relu = data["Module.act.ReLU.forward.0"]
    assert_summary(relu["input_args"][0], pre[0])           # summarised before it was overwritten
    assert_summary(relu["output"][0], pre[0].clamp(min=0))
    assert_summary(data["Module.act.ReLU.backward.0"]["input"][0], seen[0][1].grad)
    assert "Module.act_view.ReLU.forward.0" in data
    # act_view's output is used only through its base (g): its grads come from the base's
    # CopySlices, cut to the slice; checked against the gradient worked out by hand
    g_pre = ref.fc2(ref.act(ref.fc(x))).detach()[:, :4]
    grad_g = torch.ones(4, 3) @ ref.head.weight.detach()
    view_bwd = data["Module.act_view.ReLU.backward.0"]
    assert_summary(view_bwd["input"][0], grad_g[:, :4])
    assert_summary(view_bwd["output"][0], grad_g[:, :4] * (g_pre > 0))
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_hf_style_dataclass_outputs(make_debugger, dump_dir):
    model, ids, labels, mask = make_hf()
    dbg = make_debugger(level="L0")
    dbg.start(model)
    out = model(ids, labels=labels, attention_mask=mask)
    out.loss.backward()
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    fwd = data["Module.lm.HFStyleLM.forward.0"]
    assert fwd["input_args"][0]["dtype"] == "torch.int64"
    assert set(fwd["input_kwargs"]) == {"labels", "attention_mask"}
    (output,) = fwd["output"]
    assert list(output) == ["loss", "logits", "hidden_states", "aux"]
    assert_summary(output["loss"], out.loss)
    assert_summary(output["logits"], out.logits)
    assert output["aux"]["requires_grad"] is False
    # a plain dataclass, one field detached
    enc = data["Module.lm.encoder.Encoder.forward.0"]["output"][0]
    assert list(enc) == ["main", "side"] and enc["side"]["requires_grad"] is False
    bwd = data["Module.lm.encoder.Encoder.backward.0"]
    assert bwd["input"][1] is None and bwd["input"][0] is not None
    # outputs that get no gradient from outside: the record still completes
    lm_bwd = data["Module.lm.HFStyleLM.backward.0"]
    assert lm_bwd["input"][0]["Max"] == 1.0        # d loss / d loss
    assert lm_bwd["input"][-1] is None               # aux: detached
    assert "Module.lm.embed.Embedding.parameters_grad.0" in data


def test_model_list_prefixes_each_model(make_debugger, dump_dir):
    torch.manual_seed(0)
    a, b = nn.Sequential(nn.Linear(3, 3)), nn.Sequential(nn.Linear(3, 2))
    dbg = make_debugger(level="L0")
    dbg.start([a, b])
    b(a(torch.randn(2, 3))).sum().backward()
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    assert {"Module.0.0.Linear.forward.0", "Module.1.0.Linear.forward.0",
            "Module.0.0.Linear.backward.0", "Module.1.0.Linear.parameters_grad.0"} <= set(data)


def test_module_levels_need_a_model(make_debugger):
    from probe import ConfigError
    for level in ("L0", "mix"):
        dbg = make_debugger(level=level)
        with pytest.raises(ConfigError, match="model"):
            dbg.start()


def _train_models(dump=None):
    """Two SGD steps on three awkward models; returns every loss and parameter."""
    torch.manual_seed(0)
    models = [SharedNet(), InplaceNet()]
    hf, ids, labels, mask = make_hf()
    x = torch.randn(4, 8)
    everything = nn.ModuleList(models + [hf])

    def loss():
        return models[0](x).pow(2).mean() + models[1](x).sum() + hf(ids, labels=labels, attention_mask=mask).loss

    before = after = None
    if dump is not None:
        def before():
            dump.start(everything)

        def after():
            dump.stop()
            dump.step()
    return train_steps(everything, loss, before=before, after=after)


@pytest.mark.parametrize("level", ["L0", "mix", "L2"])
def test_training_is_bitwise_identical(make_debugger, dump_dir, level):
    ref_losses, ref_params = _train_models()
    losses, params = _train_models(make_debugger(level=level))
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
    assert len(load_dump(dump_dir, step=1)) > 20


def test_hook_failure_is_logged_and_training_goes_on(make_debugger, dump_dir, caplog, monkeypatch):
    import probe.dump.modules as modules

    def boom(*args, **kwargs):
        raise RuntimeError("hook broke")
    monkeypatch.setattr(modules.ModuleDumper, "_before", boom)
    torch.manual_seed(0)
    model = SharedNet()
    x = torch.randn(4, 8)
    expected = model(x)
    dbg = make_debugger(level="L0")
    dbg.start(model)
    with caplog.at_level("WARNING", logger="probe"):
        out = model(x)
        out.sum().backward()
    dbg.stop()
    dbg.step()
    assert torch.equal(out, expected)
    assert sum("hook broke" in r.getMessage() for r in caplog.records) == 5  # once per module name, not per call


def test_nothing_of_probe_stays_on_the_model_between_steps(make_debugger, dump_dir, tmp_path):
    """Between steps users save, copy or script the model (checkpoints, EMA copies): no
    hook of probe may be left on it, or pickling fails on its closures and a copy would
    record under the original's names."""
    import copy
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    x = torch.randn(2, 3)
    dbg = make_debugger(level="mix")
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert all(not p._backward_hooks for p in model.parameters())
    dbg.step()
    torch.save(model, tmp_path / "model.pt")          # pickles the whole module
    ema = copy.deepcopy(model)
    dbg.start(model)
    model(x).sum().backward()
    ema(torch.randn(5, 3))                            # the copy is not dumped
    dbg.stop()
    dbg.step()
    linears = [k for k in load_dump(dump_dir, step=1) if k.startswith("Module.0.Linear.forward")]
    assert linears == ["Module.0.Linear.forward.0"]
