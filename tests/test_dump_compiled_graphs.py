"""Registered APIs inside torch.compile'd (inductor) graphs, dumped as an eager run names
them: HF GPT-2 and Llama from configs and a small transformer, compiled on the CPU and
trained with AdamW for several steps.

Checked: the compiled dump pairs with the eager dump by name, with statistics equal within
float32 reordering; training is bitwise the same compiled run without the debugger; no
graph break or recompile is added; a wrong inductor lowering is named by the compare at
its step, and a clean compiled run against eager names nothing; what is left unhooked is
said once.
"""
import contextlib
import glob
import json
import logging
import math
import os

import pytest

torch = pytest.importorskip("torch")
from conftest import LogCapture  # noqa: E402
from inductor_fault import wrong_lowering  # noqa: E402
from models import make_gpt, train_step  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402
from probe.dump import compiled_graphs  # noqa: E402
from probe.torch_compat import TORCH  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not compiled_graphs.SUPPORTED,
                                reason="torch < 2.5: compiled graphs are dumped only where they run eagerly")]
STEPS = 3


def _hf(kind):
    import real_runs
    g = torch.Generator().manual_seed(1)
    model = real_runs.MODELS[kind]()
    batches = [real_runs._batch(kind, g) for _ in range(STEPS)]
    return model, batches, lambda m, x, y: real_runs._loss(kind, m, x, y)


def _tiny():
    model, x, y = make_gpt(d=32, n_layers=2)

    def loss_fn(m, x, y):
        out = m(x)
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return model, [(x, y)] * STEPS, loss_fn


MODELS = {"tiny": _tiny, "gpt2": lambda: _hf("gpt2"), "llama": lambda: _hf("llama")}


def train(kind, root=None, compiled=True, task="statistics", fault=None):
    """STEPS AdamW steps; the parameters after them. ``root``: dump there (L1)."""
    import torch._dynamo as dynamo
    dynamo.reset()
    model, batches, loss_fn = MODELS[kind]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    run = torch.compile(model) if compiled else model
    return _train_steps(model, opt, batches, lambda x, y: loss_fn(run, x, y), root, task, fault)


def _train_steps(model, opt, batches, loss, root, task="statistics", fault=None):
    """An optimizer step on ``loss(*batch)`` for each batch, dumped at L1 under ``root``
    when given; the parameters after them."""
    import torch._dynamo as dynamo
    dbg = PrecisionDebugger(dump_path=str(root), task=task, level="L1") if root else None
    try:
        with fault if fault is not None else contextlib.nullcontext():
            for batch in batches:
                if dbg:
                    dbg.start()
                opt.zero_grad()
                loss(*batch).backward()
                opt.step()
                if dbg:
                    dbg.stop()
                    dbg.step()
    finally:
        if dbg:
            dbg.close()
        dynamo.reset()
    return [p.detach().clone() for p in model.parameters()]


def data(root, step=0):
    (path,) = glob.glob(os.path.join(str(root), f"step{step}", "*", "dump.json"))
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["data"]


def stats(entry):
    """(Max, Min, Mean, Norm) of every tensor of an entry, in order."""
    found = []

    def walk(v):
        if isinstance(v, dict):
            if "Max" in v:
                found.append((v["Max"], v["Min"], v["Mean"], v["Norm"]))
            else:
                for x in v.values():
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    for part in ("input_args", "input_kwargs", "output", "input"):
        walk(entry.get(part))
    return found


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled_tiny")
    runs = {"compiled": train("tiny", root / "compiled"), "plain": train("tiny"),
            "eager": train("tiny", root / "eager", compiled=False)}
    return root, runs


def test_names_and_statistics_pair_with_eager(tiny_runs):
    """Every call of the compiled model is in the dump under the name an eager run gives it,
    forward and backward, at every step, and its statistics are the eager run's within
    float32 reordering (at the first step: after it the weights differ as much)."""
    root, _ = tiny_runs
    for step in range(STEPS):
        compiled, eager = data(root / "compiled", step), data(root / "eager", step)
        inside = [k for k in eager if k.startswith(("Functional.", "Tensor.view", "Tensor.transpose"))
                  and not k.startswith("Functional.cross_entropy")]
        assert inside and any(k.endswith(".backward") for k in inside)
        # a view's or transpose's backward computes nothing in a compiled graph: no entry
        wanted = [k for k in inside if k.endswith(".forward") or k.startswith("Functional.")]
        missing = [k for k in wanted if k not in compiled]
        assert not missing, missing
        assert not [k for k in compiled if k not in eager], "names an eager run does not give"
        if step:
            continue   # AdamW turns the runs' float32 differences into different weights
        for name in wanted:
            a, b = stats(compiled[name]), stats(eager[name])
            assert len(a) == len(b), name
            for sa, sb in zip(a, b):
                for x, y in zip(sa, sb):
                    assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5 * (1 + abs(sb[0]) + abs(sb[1]))), \
                        (name, sa, sb)


def test_training_is_bitwise_the_compiled_run_without_probe(tiny_runs):
    _, runs = tiny_runs
    assert all(torch.equal(a, b) for a, b in zip(runs["compiled"], runs["plain"]))


def test_stack_and_module_of_a_compiled_call(tiny_runs):
    """The stack of a call inside the graph is its FX node's: the model's line, innermost first."""
    root, _ = tiny_runs
    (stack_path,) = glob.glob(os.path.join(str(root / "compiled"), "step0", "*", "stack.json"))
    with open(stack_path, encoding="utf-8") as fh:
        stacks = json.load(fh)
    frames = next(f for names, f in stacks.values() if "Functional.gelu.0.forward" in names)
    assert "models.py" in frames[0] and "F.gelu" in frames[0], frames[0]
    assert not any(os.sep + "probe" + os.sep + "dump" in f for f in frames)


def test_tensor_mode_saves_the_tensors_and_stays_bitwise(tmp_path, tiny_runs):
    _, runs = tiny_runs
    params = train("tiny", tmp_path / "t", task="tensor")
    assert all(torch.equal(a, b) for a, b in zip(params, runs["plain"]))
    entries = data(tmp_path / "t")
    gelu = entries["Functional.gelu.0.forward"]["output"][0]
    folder = glob.glob(os.path.join(str(tmp_path / "t"), "step0", "*", "dump_tensor_data"))[0]
    import numpy as np
    saved = np.load(os.path.join(folder, gelu["data_name"]), allow_pickle=False)
    assert saved.shape == tuple(gelu["shape"])
    assert math.isclose(float(saved.max()), gelu["Max"], rel_tol=1e-6)
    grad = entries["Functional.gelu.0.backward"]["input"][0]
    assert os.path.exists(os.path.join(folder, grad["data_name"]))


def test_no_graph_break_or_recompile_added():
    from torch._dynamo.utils import counters

    def compiles(root):
        counters.clear()
        train("tiny", root)
        return dict(counters["stats"]), sum(counters["graph_break"].values())

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        with_probe = compiles(os.path.join(tmp, "d"))
    without = compiles(None)
    assert with_probe == without


def test_a_wrong_lowering_is_named_at_its_step_and_a_clean_run_names_nothing(tmp_path, tiny_runs):
    from real_runs import compare_steps
    root, _ = tiny_runs
    clean = compare_steps(root / "compiled", root / "eager", tmp_path / "clean", steps=STEPS)
    for _, summary in clean:
        assert summary["first_divergence"]["name"] is None, summary["verdict"]
    # gelu is decomposed before lowering: erf, inside it, is what inductor lowers
    train("tiny", tmp_path / "faulty", fault=wrong_lowering(torch.ops.aten.erf.default, 1.02))
    ((_, summary),) = compare_steps(tmp_path / "faulty", root / "eager", tmp_path / "cmp", steps=[0])
    assert summary["first_divergence"]["name"] == "Functional.gelu.0.forward", summary["verdict"]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_hf_models_compiled_against_eager(tmp_path, kind):
    """HF models: bitwise training, and the compare of compiled against eager names nothing
    while pairing the calls inside the graphs (their forward linears, with statistics)."""
    from real_runs import compare_steps
    params = train(kind, tmp_path / "c")
    assert all(torch.equal(a, b) for a, b in zip(params, train(kind)))
    train(kind, tmp_path / "e", compiled=False)
    compiled, eager = data(tmp_path / "c"), data(tmp_path / "e")
    # GPT-2's Conv1D is an addmm, Llama's projections linears: matrix products inside the graph
    products = [k for k in compiled if k.startswith(("Functional.linear.", "Torch.addmm.")) and k in eager]
    assert sum(k.endswith(".forward") for k in products) >= 4, sorted(compiled)
    assert sum(k.endswith(".backward") for k in products) >= 4, sorted(compiled)
    for _, summary in compare_steps(tmp_path / "c", tmp_path / "e", tmp_path / "cmp", steps=STEPS):
        assert summary["first_divergence"]["name"] is None, summary["verdict"]


def test_a_half_precision_graph_is_left_unhooked_and_said_once(tmp_path):
    import torch._dynamo as dynamo
    dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).to(torch.bfloat16)
    run = torch.compile(model)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    with LogCapture("probe", logging.WARNING) as log:
        for _ in range(2):
            dbg.start()
            run(torch.randn(4, 8, dtype=torch.bfloat16)).float().sum().backward()
            dbg.stop()
            dbg.step()
    dbg.close()
    dynamo.reset()
    said = [r.getMessage() for r in log.records if "not instrumented" in r.getMessage()]
    assert len(said) == 1 and "bfloat16" in said[0], said
    assert not any(k.startswith("Functional.linear") for k in data(tmp_path))


def construct(root, step=0):
    (path,) = glob.glob(os.path.join(str(root), f"step{step}", "*", "construct.json"))
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _mix_run(root, compiled):
    import torch._dynamo as dynamo
    dynamo.reset()
    torch.manual_seed(0)
    model, x, y = make_gpt(d=32, n_layers=2)
    opt = torch.optim.AdamW(model.parameters())
    run = torch.compile(model) if compiled else model
    dbg = PrecisionDebugger(dump_path=str(root), task="statistics", level="mix")
    for _ in range(2):
        dbg.start(run)
        train_step(run, opt, x, y)
        dbg.stop()
        dbg.step()
    dbg.close()
    dynamo.reset()


def test_mix_level_dumps_the_graphs_apis_and_no_module_entries(tmp_path):
    """At mix a compiled model's modules are not hooked (its graph would recompile each step),
    but the APIs inside its graphs are dumped as at L1, each under the module an eager mix
    run puts it under in construct.json (from the FX nodes' nn_module_stack)."""
    _mix_run(tmp_path / "compiled", compiled=True)
    _mix_run(tmp_path / "eager", compiled=False)
    entries = data(tmp_path / "compiled", step=1)
    assert sum(k.startswith("Functional.linear.") and k.endswith(".forward") for k in entries) >= 4
    assert "Functional.gelu.0.backward" in entries
    assert not any(k.startswith("Module.") for k in entries)
    for step in (0, 1):
        got, want = construct(tmp_path / "compiled", step), construct(tmp_path / "eager", step)
        placed = {k: v for k, v in got.items() if v is not None}
        assert len(placed) >= 10, got
        for name in ("Functional.linear.0.forward", "Functional.gelu.1.forward", "Functional.gelu.0.backward"):
            assert got[name] is not None and got[name] == want[name], (name, got[name], want[name])
        wrong = {k: (v, want[k]) for k, v in placed.items() if k in want and want[k] != v}
        assert not wrong, wrong


def test_l1_construct_holds_the_module_of_each_compiled_call(tiny_runs):
    """At L1 no module hook runs, eager or compiled; a compiled call's module comes from its
    FX node, so construct.json holds it (an eager L1 dump's stays empty)."""
    root, _ = tiny_runs
    got = construct(root / "compiled")
    assert construct(root / "eager") == {}
    fc = [v for k, v in got.items() if k.startswith("Functional.gelu.0.")]
    assert fc and all(v and v.startswith("Module.blocks.0.TransformerBlock.") for v in fc), got
    assert {v.rsplit(".", 2)[1] for v in fc} == {"forward", "backward"}, fc


_jitter_calls = [0]


def _jitter_op():
    """``probe_test::jitter``: a kernel whose result changes from one run to the next, as a
    Triton kernel's that sums by atomic additions does (an embedding's gradient on CUDA)."""
    if not hasattr(torch.ops.probe_test, "jitter"):
        @torch.library.custom_op("probe_test::jitter", mutates_args=())
        def jitter(x: torch.Tensor) -> torch.Tensor:
            _jitter_calls[0] += 1
            return x * (1 + 1e-6 * _jitter_calls[0])

        @jitter.register_fake
        def _(x):
            return torch.empty_like(x)
    return torch.ops.probe_test.jitter


def _jittery_train(root):
    import torch._dynamo as dynamo
    dynamo.reset()
    jitter = _jitter_op()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(x):
        h = model(x)
        return h.square().mean(), jitter(h.detach())     # the loss; a value no run reproduces
    run = torch.compile(step)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return _train_steps(model, opt, [(x,)] * STEPS, lambda x: run(x)[0], root)


def test_a_value_the_plain_graph_does_not_reproduce_is_left_out_of_the_check(tmp_path):
    """A graph output that differs between two runs of the graph without probe can't be held
    to bitwise: the check leaves it out (said once) and keeps the instrumented graph, whose
    other outputs and gradients are bitwise; training stays the run without probe."""
    with LogCapture("probe", logging.WARNING) as log:
        params = _jittery_train(tmp_path)
    said = [r.getMessage() for r in log.records]
    assert sum("differ between two runs" in m for m in said) == 1, said
    assert not any("left unhooked" in m for m in said), said
    entries = data(tmp_path, step=STEPS - 1)
    assert {"Functional.linear.0.forward", "Functional.gelu.0.forward", "Functional.linear.1.forward",
            "Functional.linear.1.backward"} <= set(entries), sorted(entries)
    assert all(torch.equal(a, b) for a, b in zip(params, _jittery_train(None)))


def _loss_calls(root):
    """A compiled cross-entropy (as HF's ``ForCausalLMLoss`` ends) over six batches of
    logits, the first all zeros (a zero-initialised head), dumped at L1 under ``root``
    when given; each batch's logits gradient, and the tensors each call's forward saved
    for its backward."""
    import torch._dynamo as dynamo
    dynamo.reset()
    g = torch.Generator().manual_seed(3)
    batches = [torch.zeros(8, 16, 128)] + [torch.randn(8, 16, 128, generator=g) for _ in range(5)]
    labels = torch.randint(0, 128, (8, 16), generator=g)

    def causal_lm_loss(logits, labels):   # transformers' ForCausalLMLoss, its steps
        labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1),
                                                 ignore_index=-100)
    run = torch.compile(causal_lm_loss)
    dbg = PrecisionDebugger(dump_path=str(root), task="statistics", level="L1") if root else None
    grads, saved = [], []

    def pack(t):   # what the compiled forward saves for its backward, call by call
        saved[-1].append(t.detach().clone())
        return t
    try:
        for logits in batches:
            logits = logits.clone().requires_grad_(True)
            if dbg:
                dbg.start()
            saved.append([])
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = run(logits, labels)
            loss.backward()
            if dbg:
                dbg.stop()
                dbg.step()
            grads.append(logits.grad)
    finally:
        if dbg:
            dbg.close()
        dynamo.reset()
    return grads, saved


def _same_bits(a, b):
    if a.dtype == torch.float32:
        a, b = a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    return a.dtype == b.dtype and torch.equal(a, b)


def test_a_graph_is_partitioned_as_without_probe_whatever_its_first_inputs(tmp_path):
    """probe's statistics read the softmax's inputs and outputs; AOT autograd's partitioner,
    seeing them, saved the softmax for the backward where the graph without probe saves
    the row maxima and log-sum-exps and recomputes it in its backward, with another kernel
    (on torch 2.6 HF Llama's loss gradient differed at step 1 by 3.8e-8). The first call's
    bitwise check compares numbers, which agree on most inputs (all-zero logits here). Now
    the forward saves, call by call, bitwise what it saves without probe, every gradient
    is bitwise, and the calls are dumped at every step."""
    with LogCapture("probe", logging.WARNING) as log:
        grads, saved = _loss_calls(tmp_path)
    plain_grads, plain_saved = _loss_calls(None)
    assert [[(tuple(t.shape), t.dtype) for t in c] for c in saved] == \
        [[(tuple(t.shape), t.dtype) for t in c] for c in plain_saved]
    assert all(_same_bits(a, b) for c, p in zip(saved, plain_saved) for a, b in zip(c, p))
    differ = [i for i, (a, b) in enumerate(zip(grads, plain_grads)) if not torch.equal(a, b)]
    assert not differ, differ
    said = [r.getMessage() for r in log.records]
    assert not any("partitioned otherwise" in m or "left unhooked" in m for m in said), said
    # cross_entropy's backward inside a compiled graph is not dumped on torch 2.6 (nor was
    # it before this change); on 2.13 it is (versions between: asserted, not yet run)
    wanted = {"Functional.cross_entropy.0.forward"} | \
        ({"Functional.cross_entropy.0.backward"} if TORCH >= (2, 7) else set())
    for step in range(len(plain_grads)):
        entries = data(tmp_path, step)
        assert wanted <= set(entries), sorted(entries)
