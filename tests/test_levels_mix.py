"""Level mix and construct.json (issue #3, item 2), module_dump / module_dump_end.

The reference for names and the forward tree is msprobe 26.2's own mix dump of the same
tiny-model run; the tree's shape is checked on models with kwargs, dataclass outputs and
a module called twice.
"""
import pytest
import torch
from conftest import assert_summary, load_dump
from level_models import SharedNet, make_hf, tiny_model
from test_levels_modules import msprobe_step, run_tiny

MIX = "v26_mix_statistics_fp32"


def assert_tree(construct, data):
    """construct.json is a forest: every parent is itself a key (or None), no cycles,
    and every dumped forward/backward entry is in it."""
    for child, parent in construct.items():
        assert parent is None or parent in construct, (child, parent)
        seen = {child}
        while parent is not None:
            assert parent not in seen, f"cycle through {parent}"
            seen.add(parent)
            parent = construct[parent]
    for name in data:
        if name.endswith((".forward", ".backward")) or ".forward." in name or ".backward." in name:
            assert name in construct, name


def mirror(name):
    """The forward entry a backward entry belongs to."""
    if name.endswith(".backward"):
        return name[: -len("backward")] + "forward"
    return name.replace(".backward.", ".forward.")


def test_tiny_model_mix_matches_msprobe(make_debugger, dump_dir):
    run_tiny(make_debugger, "mix")
    for step in (0, 1):
        data = load_dump(dump_dir, step)
        construct = load_dump(dump_dir, step, name="construct.json")
        ref = msprobe_step(step, dump=MIX)
        ref_construct = msprobe_step(step, "construct.json", dump=MIX)
        assert set(data) == set(ref)
        forward = [k for k in ref if ".forward" in k]
        assert [k for k in data if ".forward" in k] == forward
        assert_tree(construct, data)
        for name, parent in ref_construct.items():
            if ".backward" not in name:
                assert construct[name] == parent, name
        # msprobe leaves some backward parents null; here each mirrors its forward's
        for name, parent in construct.items():
            if ".backward" in name:
                fwd_parent = construct[mirror(name)]
                assert parent == (None if fwd_parent is None else fwd_parent.replace(".forward.", ".backward.")), name
        assert construct["optimizer"] is None
        assert [k for k, v in construct.items() if v == "optimizer"] == [f"Tensor.add_.{i}.forward" for i in range(14)]


def test_apis_map_to_the_module_that_called_them(make_debugger, dump_dir):
    model, ids, labels, mask = make_hf()
    shared = SharedNet()
    x = torch.randn(4, 8)
    dbg = make_debugger(level="mix")
    dbg.start([model, shared])
    model(ids, labels=labels, attention_mask=mask).loss.backward()
    shared(x).sum().backward()
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    construct = load_dump(dump_dir, name="construct.json")
    assert_tree(construct, data)
    owner_class = {"Functional.linear": "Linear", "Functional.embedding": "Embedding",
                   "Functional.layer_norm": "LayerNorm", "Torch.tanh": "Tanh"}
    checked = 0
    for name, parent in construct.items():
        api = name.rsplit(".", 2)[0]
        if api in owner_class:
            direction = name.rsplit(".", 1)[1]
            assert parent.startswith("Module.") and f".{owner_class[api]}.{direction}." in parent, (name, parent)
            checked += 1
    assert checked >= 12
    # the mask multiply runs in Encoder.forward, outside its submodules
    assert construct["Tensor.__mul__.0.forward"] == "Module.0.lm.encoder.Encoder.forward.0"
    # the shared block's second call has its own subtree
    tanh_parents = {construct[k] for k in construct if k.startswith("Torch.tanh.") and k.endswith(".forward")}
    assert tanh_parents == {"Module.1.block.1.Tanh.forward.0", "Module.1.block.1.Tanh.forward.1"}
    assert construct["Module.1.block.1.Tanh.forward.1"] == "Module.1.block.Sequential.forward.1"
    # the loss is computed in the HF model's forward; the root's own forward is not dumped
    assert construct["Functional.cross_entropy.0.forward"] == "Module.0.lm.HFStyleLM.forward.0"
    assert construct["Module.0.lm.HFStyleLM.forward.0"] is None


def test_L1_construct_stays_empty(make_debugger, dump_dir):
    run_tiny(make_debugger, "L1", steps=1)
    assert load_dump(dump_dir, name="construct.json") == {}
    assert not any(k.startswith("Module.") for k in load_dump(dump_dir))


def test_module_dump_dumps_one_module_whole(make_debugger, dump_dir):
    import probe
    tm = tiny_model()
    model, x, y = tm.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    block_in, block_out = [], []
    model.blocks[0].register_forward_hook(
        lambda m, a, out: block_in.append(a[0].detach().clone()) or block_out.append(out.detach().clone()))
    dbg = make_debugger(level="L1")
    dbg.start()
    probe.module_dump(model.blocks[0], "first_block")
    tm.train_step(model, opt, x, y)
    probe.module_dump_end()
    dbg.stop()
    dbg.step()
    dbg.start()                      # after module_dump_end: APIs inside the block again
    tm.train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()

    data = load_dump(dump_dir, 0)
    fwd = data["Module.first_block.Block.forward.0"]
    assert_summary(fwd["input_args"][0], block_in[0])
    assert_summary(fwd["output"][0], block_out[0])
    assert "Module.first_block.Block.backward.0" in data
    linears = [k for k in data if k.startswith("Functional.linear.") and k.endswith(".forward")]
    assert len(linears) == 3         # blocks.1's two and the head; none from inside blocks.0
    assert "Functional.layer_norm.1.forward" not in data
    later = load_dump(dump_dir, 1)
    assert not any(k.startswith("Module.") for k in later)
    assert len([k for k in later if k.startswith("Functional.linear.") and k.endswith(".forward")]) == 5


def test_module_dump_needs_a_module(make_debugger):
    import probe
    make_debugger(level="L1")
    with pytest.raises(TypeError, match="module"):
        probe.module_dump("blocks.0", "x")
