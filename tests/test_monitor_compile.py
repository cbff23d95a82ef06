"""The monitor on a torch.compile'd model: its forward hook runs eagerly (a graph break
where dynamo meets it, never traced), training is bitwise the run without the monitor, the
watched modules' activations are recorded on logged steps, and steps that are not logged
reuse the compiled code: nothing is compiled again after the first logged steps."""
import csv
import logging
import os

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")
from models import make_gpt, train_step  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

from probe import Monitor  # noqa: E402

STEPS = 6


def _train(out_dir=None):
    dynamo.reset()
    counters.clear()
    model, x, y = make_gpt()
    compiled = torch.compile(model, backend="aot_eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = None
    if out_dir is not None:
        mon = Monitor(output_dir=out_dir, activations=True, interval=2)
        mon.set_monitor(model, optimizer=opt)
    losses = [train_step(compiled, opt, x, y).detach() for _ in range(STEPS)]
    frames = dict(counters["frames"])
    losses += [train_step(compiled, opt, x, y).detach() for _ in range(STEPS)]
    if mon is not None:
        mon.close()
    assert dict(counters["frames"]) == frames, "compiled again after the first logged steps"
    return losses, [p.detach().clone() for p in model.parameters()], frames, list(counters["graph_break"])


def test_compiled_model_is_monitored_without_changing_training(tmp_path, caplog):
    plain_losses, plain_params, plain_frames, _ = _train()
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"):
        losses, params, frames, breaks = _train(str(tmp_path))
    # dynamo never traced the hook: its only graph breaks are the calls of the eager hook,
    # and it warned of no recompiles
    assert breaks and all("torch.compiler.disable" in b for b in breaks), breaks[:2]
    assert not [r for r in caplog.records if r.name.startswith("torch._dynamo")], caplog.records[:2]
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    assert all(torch.equal(a, b) for a, b in zip(plain_params, params))
    with open(os.path.join(tmp_path, "metrics_rank0.csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in rows}) == list(range(0, 2 * STEPS, 2))
    model, _, _ = make_gpt()
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for step in (0, 2, 4):
        seen = {r["name"] for r in rows if int(r["step"]) == step and r["output_norm"]}
        assert set(linears) <= seen, (step, sorted(set(linears) - seen))
    # the model's code is compiled once for the steps with the hook (split at each hooked
    # module) and once without, then reused: no compile per step (``_train`` checks)
    assert frames.get("ok", 0) > plain_frames.get("ok", 0)
