"""A torch.compile'd model trained under the debugger: of probe's code dynamo traces only
the function mode's first lines (``is_compiling()`` folds to True there and the plain torch
call goes into the graph), no recompiles or warnings come from it, training is bitwise the
run without the debugger, and the calls that run eagerly (the loss, the optimizer, the
backward's entry) are dumped."""
import inspect
import logging
import os
import re

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")
from conftest import LogCapture, load_dump  # noqa: E402
from models import make_gpt, train_step  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import probe  # noqa: E402
from probe.dump import compiled_graphs  # noqa: E402
from probe.hook_module import interceptor  # noqa: E402
from probe.torch_compat import DYNAMO_TRACES_FUNCTION_MODES, EAGER_FRAME_CODE, TORCH  # noqa: E402

pytestmark = pytest.mark.slow   # compiled graphs or several processes: minutes on a busy machine

# probe's package folder, not the clone's: a clone in a folder named "probe" holds the tests too
PACKAGE = os.path.dirname(os.path.abspath(probe.__file__)) + os.sep


def _lines_up_to_early_return(code_or_func, test):
    lines, first = inspect.getsourcelines(code_or_func)
    end = next(i for i, text in enumerate(lines) if test in text) + 1
    return {first + i for i in range(end + 1)}


def _mode_lines_dynamo_may_trace():
    """The mode's lines up to and including its ``is_compiling()`` early return, and those
    of run_eagerly's wrapper round it (``torch_compat``), up to its own."""
    mode = {("hook_module/interceptor.py".replace("/", os.sep), n)
            for n in _lines_up_to_early_return(interceptor._Mode.__torch_function__.__wrapped__, "_is_compiling()")}
    return mode | {("torch_compat.py", n) for n in _lines_up_to_early_return(EAGER_FRAME_CODE, "is_compiling()")}


def _probe_lines_traced(messages):
    """(file, line) of probe's code in dynamo's trace log."""
    pattern = re.compile(re.escape(PACKAGE) + r"(\S+?\.py):(\d+)")
    return {(m.group(1), int(m.group(2))) for msg in messages for m in pattern.finditer(msg)}


def _train(make_debugger=None, steps=3, level="L1", give=None):
    dynamo.reset()
    counters.clear()
    model, x, y = make_gpt()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = make_debugger(task="statistics", level=level) if make_debugger else None
    losses = []
    for _ in range(steps):
        if dbg:
            dbg.start({"original": model, "compiled": compiled}.get(give))
        losses.append(train_step(compiled, opt, x, y).detach())
        if dbg:
            dbg.stop()
            dbg.step()
    frames = dict(counters["frames"]), dict(counters["graph_break"])
    return losses, [p.detach().clone() for p in model.parameters()], frames


def test_compiled_model_under_debugger(make_debugger, dump_dir, caplog):
    plain_losses, plain_params, plain_frames = _train()
    with caplog.at_level(logging.WARNING), LogCapture("torch._dynamo", logging.DEBUG) as dynamo_log:
        losses, params, frames = _train(make_debugger)
    # dynamo compiled the model's frame and nothing of probe's: no graph break, no recompile
    assert frames == plain_frames, (frames, plain_frames)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    noise = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noise, noise[:3]
    # dynamo inlines the mode's entry (it is on the mode stack) through run_eagerly's wrapper
    # and stops at their early returns: nothing else of probe's is traced, so no guard or graph node comes from it
    traced = _probe_lines_traced(dynamo_log.messages)
    if DYNAMO_TRACES_FUNCTION_MODES:
        allowed = _mode_lines_dynamo_may_trace()
        assert traced and traced <= allowed, sorted(traced - allowed)
    else:   # torch < 2.5: dynamo does not trace function modes; probe's frames run eagerly
        assert not traced, sorted(traced)
    # its guards on probe: the modules of the mode and of its wrapper, and is_compiling,
    # which never change (no recompile)
    guarded = {m.group(1) for msg in dynamo_log.messages for m in re.finditer(r"source=G\['([^']*probe[^']*)'\]([.\w]*)", msg)}
    assert guarded <= {"__import_probe_dot_hook_module_dot_interceptor", "__import_probe_dot_torch_compat"}, guarded
    for step in range(3):
        data = load_dump(dump_dir, step=step)
        # eager: the loss and its backward, the optimizer's updates
        assert "Functional.cross_entropy.0.forward" in data and "Functional.cross_entropy.0.backward" in data
        assert any(k.startswith("Tensor.add_.") for k in data)
        # inside the compiled graph: not seen
        if DYNAMO_TRACES_FUNCTION_MODES:
            assert not any(k.startswith(("Functional.layer_norm.", "Functional.scaled_dot_product_attention."))
                           for k in data), sorted(data)
        else:   # torch < 2.5 compiles less of the model (graph breaks at the block's generator
            # and at the loop over blocks): some of its 5 linear calls still run compiled
            linears = [k for k in data if k.startswith("Functional.linear.") and k.endswith(".forward")]
            assert len(linears) < 5, sorted(data)


@pytest.mark.parametrize("give", ["compiled", "original"])
def test_compiled_model_at_mix_level_does_not_recompile_each_step(make_debugger, dump_dir, caplog, give):
    """L0/mix hook modules; hooks added and removed each step would change the guards dynamo
    keeps on them (a recompile per dumped step, warnings past the limit of 8). A model that
    runs compiled is left unhooked: at most one more compile, whichever model start() got."""
    steps = 10
    plain_losses, plain_params, plain_frames = _train(steps=steps)
    with caplog.at_level(logging.WARNING):
        losses, params, frames = _train(make_debugger, steps=steps, level="mix", give=give)
    extra = frames[0]["total"] - plain_frames[0]["total"]
    assert extra <= (0 if give == "compiled" else 1), (frames, plain_frames)
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    # The noise is torch's warnings. Its DEBUG records are not: pytest >= 9.2 also attaches
    # caplog's handler to loggers that do not propagate, and torch's structured-trace logger
    # (torch.__trace, always DEBUG) logs every compile there, the plain run's above included.
    # torch < 2.5 warns once that module hooks (probe's, on the first step) are partially supported.
    dynamo_noise = [r.getMessage() for r in caplog.records if r.name.startswith("torch") and r.levelno >= logging.WARNING
                    and not (TORCH < (2, 5) and give == "original" and "hooks are only partially" in r.getMessage())]
    assert not dynamo_noise, dynamo_noise[:2]
    said = [r.getMessage() for r in caplog.records if r.name.startswith("probe")]
    # the model's graphs go through aot_eager, not inductor: said once too (compiled_graphs)
    not_inductor = [m for m in said if "went through inductor" in m]
    said = [m for m in said if m not in not_inductor]
    assert len(said) == 1 and "torch.compile" in said[0], said
    # (said where start() got the compiled wrapper; the original is known compiled only later)
    assert len(not_inductor) == (1 if compiled_graphs.SUPPORTED and give == "compiled" else 0) \
        or give != "compiled" and len(not_inductor) <= 1, not_inductor
    data = load_dump(dump_dir, step=steps - 1)
    assert "Functional.cross_entropy.0.forward" in data          # eager APIs still dumped
    assert not any(k.startswith("Module.blocks.") for k in data), sorted(data)[:5]


class _Block:
    """A context manager of the user's: a graph break inside it makes dynamo run the whole
    frame that holds it eagerly (frames it calls are still compiled)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _head_run_eagerly(hidden, weight):
    with _Block():
        print("", end="")   # a graph break: dynamo cannot resume inside the block
        return F.linear(hidden, weight)


def _train_with_an_eager_head(make_debugger=None, steps=2):
    """make_gpt's model compiled with inductor, its output projected by a frame dynamo runs
    eagerly (HF Llama's lm_head after a graph break on torch 2.6 is the case met)."""
    dynamo.reset()
    counters.clear()
    model, x, y = make_gpt()
    torch.manual_seed(1)
    head = torch.nn.Parameter(torch.randn(50, 50) * 0.1)
    params = list(model.parameters()) + [head]
    opt = torch.optim.SGD(params, lr=0.1)

    def step(x, y):
        out = _head_run_eagerly(model(x), head)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    compiled = torch.compile(step)
    dbg = make_debugger(task="statistics", level="L1") if make_debugger else None
    for _ in range(steps):
        if dbg:
            dbg.start()
        opt.zero_grad()
        compiled(x, y).backward()
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    return dict(counters["stats"]), [p.detach().clone() for p in params]


def test_a_call_dynamo_runs_eagerly_is_dumped_and_not_compiled_apart(make_debugger, dump_dir):
    """A registered call dynamo leaves to run eagerly inside a compiled frame reaches probe's
    mode, whose frame dynamo compiled as a graph of its own (torch 2.5+): the call ran as
    inductor's kernel instead of the eager one and was not dumped. It runs eagerly, dumped
    forward and backward, and training is bitwise the run without probe."""
    plain_stats, plain_params = _train_with_an_eager_head()
    stats, params = _train_with_an_eager_head(make_debugger)
    assert stats == plain_stats, (stats, plain_stats)
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    data = load_dump(dump_dir, step=1)
    linears = [k for k in data if k.startswith("Functional.linear.")]
    last = max(linears, key=lambda k: int(k.split(".")[2]))   # the head's: the last one called
    n = last.split(".")[2]
    assert f"Functional.linear.{n}.forward" in data and f"Functional.linear.{n}.backward" in data, sorted(data)
