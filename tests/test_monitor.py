"""Monitor on a tiny HF GPT-2 trained with AdamW on the CPU: what is recorded, where it
goes, which step and layer an alert names, and that the run itself is unchanged."""
import csv
import json
import logging
import math
import os

import pytest
import torch

from probe import Monitor
from probe.errors import ConfigError
from probe.torch_compat import GLOBAL_HOOKS_TAKE_KWARGS, TORCH

transformers = pytest.importorskip("transformers")

CORRUPT_STEP = 25
LAYER = "transformer.h.1.mlp.c_fc"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a shared 2-core machine, thread hand-offs make a tiny
    model's step 10-20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def called_modules(model, x):
    """Names of the submodules a forward of ``model`` calls (seen by the test's own hooks)."""
    called = []
    handles = [m.register_forward_hook(lambda mod, a, o, n=n: called.append(n))
               for n, m in model.named_modules() if n]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return set(called)


def make_gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [torch.randint(0, 64, (4, 16), generator=g) for _ in range(8)]
    return model, opt, batches


def train(model, opt, batches, steps, corrupt_at=None, before_step=None):
    losses = []
    for step in range(steps):
        x = batches[step % len(batches)]
        if step == corrupt_at:
            with torch.no_grad():
                model.get_submodule(LAYER).weight.mul_(10.0)
        out = model(x, labels=x)
        out.loss.backward()
        if before_step is not None:
            before_step(step)
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.detach())
    return losses


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_alerts(out_dir):
    path = os.path.join(out_dir, "alerts.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def corrupted_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("mon_corrupt"))
    model, opt, batches = make_gpt2()
    with Monitor(output_dir=out, activations=True) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 40, corrupt_at=CORRUPT_STEP)
    return out, mon


def test_corrupted_weight_is_the_first_alert_at_its_step(corrupted_run):
    out, mon = corrupted_run
    alerts = read_alerts(out)
    assert alerts, "a weight scaled x10 raised no alert"
    for a in alerts:
        assert {"step", "rank", "name", "metric", "value", "expected"} <= set(a)
    assert min(a["step"] for a in alerts) == CORRUPT_STEP    # nothing before it, in warm-up or after
    first = alerts[0]
    assert first["step"] == CORRUPT_STEP and first["first"] is True
    assert first["module"] == LAYER and first["name"].startswith(LAYER)
    # the anomaly reached later layers (their activations) and earlier ones (their gradients)
    at_step = [a for a in alerts if a["step"] == CORRUPT_STEP]
    assert sum(a["first"] for a in at_step) == 1
    assert any(a["name"] == "transformer.ln_f" for a in at_step)
    assert any(a["metric"] == "grad_norm" and not a["name"].startswith(LAYER) for a in at_step)
    assert [vars(a) for a in mon.alerts] == alerts


def test_alerts_are_logged_once_until_recovery(tmp_path, caplog):
    model, opt, batches = make_gpt2()
    with caplog.at_level(logging.WARNING, logger="probe.monitor"):
        with Monitor(output_dir=str(tmp_path), weights=True, gradients=False, optimizer=False,
                     update_ratio=False) as mon:
            mon.set_monitor(model, optimizer=opt)
            train(model, opt, batches, 30, corrupt_at=15)
    lines = [r.getMessage() for r in caplog.records if "weight_norm" in r.getMessage()]
    # the scaled weight is alerted at each step until the new level fills half the window
    # (the median moves to it: "recovered"); the log has it once
    steps = [a.step for a in mon.alerts if a.name == f"{LAYER}.weight"]
    assert steps == list(range(15, 15 + len(steps))) and len(steps) > 5
    assert len([m for m in lines if f"{LAYER}.weight" in m]) == 1
    assert "step 15: first anomaly at " + LAYER in lines[0]


def test_clean_run_raises_no_alert(tmp_path):
    model, opt, batches = make_gpt2(seed=3)
    with Monitor(output_dir=str(tmp_path), activations=True, update_ratio=True) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 45)
    assert mon.alerts == []
    assert read_alerts(str(tmp_path)) == []
    assert len(read_csv(tmp_path / "metrics_rank0.csv")) > 45 * 40


def test_csv_has_one_row_per_step_and_name_with_the_true_values(tmp_path):
    model, opt, batches = make_gpt2()
    expected = {}
    names = [n for n, _ in model.named_parameters()]

    def before_step(step):   # what the monitor must report, computed here independently
        if step % 5 == 0:
            expected[step] = {n: (p.detach().norm().item(), p.grad.norm().item()) for n, p in model.named_parameters()}
    with Monitor(output_dir=str(tmp_path), interval=5, activations=True, update_ratio=True) as mon:
        mon.set_monitor(model, optimizer=opt)
        losses = train(model, opt, batches, 22, before_step=before_step)
    rows = read_csv(tmp_path / "metrics_rank0.csv")
    by_step = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    assert sorted(by_step) == [0, 5, 10, 15, 20]
    modules = called_modules(model, batches[0])
    assert "transformer.h.1.mlp.c_fc" in modules
    for step, step_rows in by_step.items():
        seen = [r["name"] for r in step_rows]
        assert len(seen) == len(set(seen))                      # one row per step and name
        assert set(names) | modules | {"train", "<model>"} == set(seen)
        row = {r["name"]: r for r in step_rows}
        for n in names:
            w, g = expected[step][n]
            assert float(row[n]["weight_norm"]) == pytest.approx(w, rel=1e-5)
            assert float(row[n]["grad_norm"]) == pytest.approx(g, rel=1e-5)
            assert float(row[n]["exp_avg_norm"]) > 0
        assert float(row["train"]["loss"]) == pytest.approx(losses[step].item(), rel=1e-6)
        assert float(row["transformer.h.0"]["output_nonfinite"]) == 0
    # the first AdamW update is lr * sign(g) on each element: ||update|| = lr * sqrt(numel) / ||w||
    row0 = {r["name"]: r for r in by_step[0]}
    w = dict(model.named_parameters())["transformer.h.0.mlp.c_fc.weight"]
    ratio = 1e-3 * math.sqrt(w.numel()) / expected[0]["transformer.h.0.mlp.c_fc.weight"][0]
    assert float(row0["transformer.h.0.mlp.c_fc.weight"]["update_ratio"]) == pytest.approx(ratio, rel=2e-2)


def test_tensorboard_event_files_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model, opt, batches = make_gpt2()
    with Monitor(output_dir=str(tmp_path), activations=True, formats=["tensorboard", "csv"]) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 6)
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "rank0"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("transformer.h.1.mlp.c_fc.weight/weight_norm", "transformer.h.1.mlp.c_fc.weight/grad_norm",
                "transformer.h.1.mlp.c_fc.weight/exp_avg_sq_norm", "transformer.h.1.mlp.c_fc/output_norm",
                "transformer.h.1.mlp.c_fc/input_max", "train/loss"):
        assert tag in tags
    events = acc.Scalars("transformer.h.1.mlp.c_fc.weight/weight_norm")
    assert [e.step for e in events] == list(range(6))
    rows = [r for r in read_csv(tmp_path / "metrics_rank0.csv") if r["name"] == "transformer.h.1.mlp.c_fc.weight"]
    assert [e.value for e in events] == pytest.approx([float(r["weight_norm"]) for r in rows], rel=1e-6)


def test_tensorboard_is_written_by_default_said_once_and_can_be_turned_off(tmp_path, caplog):
    """As msprobe's monitor: TensorBoard event files without asking, where tensorboard is
    installed; the log says once where; a formats list without it turns it off."""
    pytest.importorskip("tensorboard")
    model, opt, batches = make_gpt2()
    with caplog.at_level(logging.INFO, logger="probe.monitor"):
        with Monitor(output_dir=str(tmp_path / "on")) as mon:
            mon.set_monitor(model, optimizer=opt)
            train(model, opt, batches, 3)
    log_dir = tmp_path / "on" / "tensorboard" / "rank0"
    assert "tensorboard" in mon.options.formats
    assert [f for f in os.listdir(log_dir) if f.startswith("events.out.tfevents")]
    said = [r.getMessage() for r in caplog.records if "TensorBoard event files" in r.getMessage()]
    assert len(said) == 1 and str(log_dir) in said[0], said
    assert (tmp_path / "on" / "metrics_rank0.csv").exists()          # csv and alerts as before
    with Monitor(output_dir=str(tmp_path / "off"), formats=["csv", "alerts"]) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 2)
    assert not (tmp_path / "off" / "tensorboard").exists() and (tmp_path / "off" / "metrics_rank0.csv").exists()


def test_monitoring_leaves_training_bitwise_identical(tmp_path):
    def run(monitored):
        model, opt, batches = make_gpt2()
        mon = None
        if monitored:
            mon = Monitor(output_dir=str(tmp_path), activations=True, grad_pre_reduction=True, update_ratio=True)
            mon.set_monitor(model, optimizer=opt)
        losses = train(model, opt, batches, 12)
        if mon is not None:
            mon.close()
        return model, opt, losses
    m0, o0, l0 = run(False)
    m1, o1, l1 = run(True)
    assert all(torch.equal(a, b) for a, b in zip(l0, l1))
    for (n, a), b in zip(m0.named_parameters(), m1.parameters()):
        assert torch.equal(a, b), n
    for p0, p1 in zip(m0.parameters(), m1.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(o0.state[p0][key], o1.state[p1][key])
    rows = read_csv(tmp_path / "metrics_rank0.csv")
    pre = [r for r in rows if r["grad_norm_pre"]]
    assert pre and all(r["grad_norm_pre"] == r["grad_norm"] for r in pre)   # no reduction: the same grads


def test_nan_is_alerted_at_once_and_first_in_call_order(tmp_path):
    model, opt, batches = make_gpt2()
    with Monitor(output_dir=str(tmp_path), activations=True) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 3)                          # inside warm-up
        with torch.no_grad():
            model.get_submodule("transformer.h.0.attn.c_proj").weight[0, 0] = float("nan")
        train(model, opt, batches, 1)
    first = mon.alerts[0]
    assert (first.step, first.kind, first.module, first.first) == (3, "nonfinite", "transformer.h.0.attn.c_proj", True)
    counts = [a for a in mon.alerts if a.name == "transformer.h.0.attn.c_proj" and a.metric == "output_nonfinite"]
    assert counts and counts[0].value == 4 * 16    # one NaN weight: one NaN column of every token's output


def test_loop_without_optimizer_manual_step_and_log_loss(tmp_path):
    model, _, batches = make_gpt2()
    with Monitor(output_dir=str(tmp_path), optimizer=False, update_ratio=True) as mon:
        mon.set_monitor(model)
        for step in range(4):
            x = batches[step]
            loss = model(x).logits.float().logsumexp(-1).mean()   # no labels: no output.loss
            loss.backward()
            mon.log_loss(loss)
            mon.step()          # the step's weights and gradients: before the update
            with torch.no_grad():
                for p in model.parameters():
                    p -= 1e-3 * p.grad
                    p.grad = None
    rows = read_csv(tmp_path / "metrics_rank0.csv")
    assert sorted({int(r["step"]) for r in rows}) == [0, 1, 2, 3]
    assert all(r["loss"] for r in rows if r["name"] == "train")
    # no optimizer: no update ratio (there is no update to see)
    assert all(r["grad_norm"] and not r["update_ratio"] for r in rows if r["name"].endswith(".weight"))


@pytest.mark.skipif(TORCH < (2, 3), reason="a GradScaler on the CPU (torch.amp.GradScaler) came with torch 2.3")
def test_grad_scaler_scale_is_recorded(tmp_path):
    model, opt, batches = make_gpt2()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with Monitor(output_dir=str(tmp_path)) as mon:
        mon.set_monitor(model, optimizer=opt, scaler=scaler)
        for step in range(3):
            x = batches[step]
            scaler.scale(model(x, labels=x).loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    rows = [r for r in read_csv(tmp_path / "metrics_rank0.csv") if r["name"] == "train"]
    assert [float(r["loss_scale"]) for r in rows] == [1024.0] * 3


def test_bad_options_are_one_line_errors(tmp_path):
    cases = [({"interval": 0}, "interval"), ({"formats": ["csv", "xlsx"]}, "xlsx"),
             ({"alert_threshold": -1}, "alert_threshold"), ({"dump_level": "L2"}, "dump_level"),
             ({"activations": "yes"}, "activations"), ({"grad_pre_reduction": 1}, "grad_pre_reduction"),
             ({"modules": ["regex(a[)"]}, "modules"), ({"alert_warmup": 30}, "alert_warmup"),
             ({"weights": False, "gradients": False, "optimizer": False}, "nothing to monitor")]
    for kwargs, word in cases:
        with pytest.raises(ConfigError) as err:
            Monitor(output_dir=str(tmp_path), **kwargs)
        assert word in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown keyword argument 'intervall'"):
        Monitor(intervall=3)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "monitor": {"interval": 2, "colour": 1}}))
    with pytest.raises(ConfigError, match=r"config.json: monitor.colour: unknown key"):
        Monitor(config_path=str(path))
    path.write_text(json.dumps({"task": "statistics"}))
    with pytest.raises(ConfigError, match="monitor"):
        Monitor(config_path=str(path))


def test_config_file_section_and_module_filter(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "monitor": {
        "interval": 2, "activations": True, "modules": ["regex(h\\.1\\.mlp)"], "formats": ["csv"]}}))
    model, opt, batches = make_gpt2()
    with Monitor(config_path=str(path), output_dir=str(tmp_path / "out")) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 4)
    rows = read_csv(tmp_path / "out" / "metrics_rank0.csv")
    assert sorted({int(r["step"]) for r in rows}) == [0, 2]
    assert {r["name"] for r in rows} - {"train"} == {n for n, _ in model.named_modules() if "h.1.mlp" in n} | \
        {n for n, _ in model.named_parameters() if "h.1.mlp" in n}
    assert not os.path.exists(tmp_path / "out" / "alerts.jsonl")


def test_missing_tensorboard_is_one_clear_error_only_when_asked(tmp_path, monkeypatch, caplog):
    import sys
    for name in [n for n in sys.modules if n.startswith(("tensorboard", "torch.utils.tensorboard"))] + \
            ["tensorboard", "torch.utils.tensorboard"]:
        monkeypatch.setitem(sys.modules, name, None)   # as if not installed
    with pytest.raises(ConfigError, match=r"pip install probe\[monitor\]"):
        Monitor(output_dir=str(tmp_path), formats=["tensorboard"])
    model, opt, batches = make_gpt2()
    with Monitor(output_dir=str(tmp_path), formats=["csv", "alerts"]) as mon:
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 2)
    assert len({r["step"] for r in read_csv(tmp_path / "metrics_rank0.csv")}) == 2
    # by default: no TensorBoard, no error, said in the log
    with caplog.at_level(logging.INFO, logger="probe.monitor"):
        with Monitor(output_dir=str(tmp_path / "default")) as mon:
            mon.set_monitor(model, optimizer=opt)
            train(model, opt, batches, 2)
    assert mon.options.formats == ("csv", "alerts") and not (tmp_path / "default" / "tensorboard").exists()
    assert [r for r in caplog.records if "tensorboard is not installed" in r.getMessage()]


def test_a_monitor_failure_never_stops_training(tmp_path, caplog):
    model, opt, batches = make_gpt2()
    ref_model, ref_opt, _ = make_gpt2()
    with caplog.at_level(logging.WARNING, logger="probe.monitor"):
        mon = Monitor(output_dir=str(tmp_path), activations=True)
        mon.set_monitor(model, optimizer=opt)
        train(model, opt, batches, 2)
        mon.outputs[0].file.close()          # the CSV's file is gone: every later write fails
        train(model, opt, batches, 4)
        mon.close()
    train(ref_model, ref_opt, batches, 2)
    train(ref_model, ref_opt, batches, 4)
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1 and "CsvOutput" in failures[0].getMessage()
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)


def test_loss_fn_module_and_evaluation_forwards(tmp_path):
    """A plain model: the loss comes from the hooked loss module; a no_grad evaluation
    forward between steps is not mixed into the step's activations."""
    from models import make_gpt
    model, x, y = make_gpt(seed=0, n_layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    expected = []
    with Monitor(output_dir=str(tmp_path), activations=True) as mon:
        mon.set_monitor(model, optimizer=opt, loss_fn=loss_fn)
        for _ in range(3):
            out = model(x)
            loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            expected.append((loss.item(), out.detach().norm().item()))
            with torch.no_grad():
                model(torch.cat([x, x, x]))      # evaluation: 3x the rows, 1.7x the norm
            opt.step()
            opt.zero_grad()
    rows = read_csv(tmp_path / "metrics_rank0.csv")
    losses = [float(r["loss"]) for r in rows if r["name"] == "train"]
    norms = [float(r["output_norm"]) for r in rows if r["name"] == "<model>"]
    assert losses == pytest.approx([e[0] for e in expected], rel=1e-6)
    assert norms == pytest.approx([e[1] for e in expected], rel=1e-5)


def test_csv_rows_are_what_csv_writer_writes(tmp_path):
    """The CSV output formats its rows itself (layout cached per key set, numbers by
    orjson): the file must be what ``csv.writer`` writes for the same rows."""
    from probe.monitor.outputs import CsvOutput
    from probe.monitor.records import StepStats
    columns = ["output_norm", "weight_norm", "grad_norm", "loss"]
    steps = [
        ([("a.b", "output_norm"), ("a.b", "weight_norm"), ('odd,"name"', "grad_norm"), ("x", "other")],
         [1e-05, 1e16, float("nan"), 3.0]),
        ([("a.b", "output_norm"), ("a.b", "weight_norm"), ('odd,"name"', "grad_norm"), ("x", "other")],
         [0.1, -2.5e-7, float("inf"), 4.0]),
        ([("train", "loss"), ("a.b", "weight_norm")], [2, 123456789.125]),     # another key set
    ]
    out = CsvOutput(str(tmp_path / "m.csv"), columns)
    for step, (keys, values) in enumerate(steps):
        out.write(StepStats(step, 3, keys, values, [(0, i, 0) for i in range(len(keys))], {}), [])
    out.close()
    expected = tmp_path / "expected.csv"
    with open(expected, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["step", "rank", "name"] + columns)
        for step, (keys, values) in enumerate(steps):
            rows = {}
            for (name, metric), v in zip(keys, values):
                if metric in columns:
                    rows.setdefault(name, [step, 3, name] + [""] * len(columns))[3 + columns.index(metric)] = v
            w.writerows(rows.values())
    got, want = list(csv.reader(open(tmp_path / "m.csv"))), list(csv.reader(open(expected)))
    assert len(got) == len(want) == 1 + 2 + 2 + 2 and got[0] == want[0]
    for g, e in zip(got[1:], want[1:]):
        assert g[:3] == e[:3]
        assert [float(x) if x else None for x in g[3:]] == pytest.approx(
            [float(x) if x else None for x in e[3:]], nan_ok=True)


def test_device_statistics_reach_the_host_in_one_transfer_per_logged_step(tmp_path, monkeypatch):
    """On an accelerator every statistic of a step stays on the device until one fetch.
    The CPU summarises on the spot, so the accelerators' path (``stats.device_reductions``,
    0-d device tensors) is taken for every tensor here; every host conversion made by
    probe's code is counted: one ``tolist`` per logged step, none on the other steps."""
    import collections
    import sys

    import probe
    from probe.dump import stats
    monkeypatch.setattr(stats, "reductions", stats.device_reductions)
    probe_dir = os.path.dirname(probe.__file__)
    calls = collections.Counter()

    def count(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(probe_dir):
                calls[name] += 1
            return original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, wrapper)
    for name in ("tolist", "item", "__float__", "__bool__", "__int__", "__index__", "cpu", "numpy", "to"):
        count(name)
    model, opt, batches = make_gpt2()
    per_step = []
    with Monitor(output_dir=str(tmp_path), activations=True, update_ratio=True, grad_pre_reduction=True,
                 interval=3) as mon:
        mon.set_monitor(model, optimizer=opt)
        for _ in range(9):
            before = dict(calls)
            train(model, opt, batches, 1)
            per_step.append({k: v - before.get(k, 0) for k, v in calls.items() if v != before.get(k, 0)})
    assert per_step == [{"tolist": 1}, {}, {}] * 3
    rows = read_csv(tmp_path / "metrics_rank0.csv")
    assert sorted({int(r["step"]) for r in rows}) == [0, 3, 6]
    fc = [r for r in rows if r["name"] == LAYER]
    assert len(fc) == 3 and all(float(r["output_norm"]) > 0 and float(r["input_max"]) > 0 for r in fc)
    weights = [r for r in rows if r["name"] == LAYER + ".weight"]
    assert all(float(r["weight_norm"]) > 0 and float(r["grad_norm_pre"]) > 0 and
               float(r["exp_avg_sq_norm"]) > 0 and float(r["update_ratio"]) > 0 for r in weights)


def test_module_called_with_keyword_arguments_only(tmp_path, caplog):
    """Its input statistics come from its keyword arguments where global hooks get them
    (torch 2.6 on); before, the monitor says once that they are not recorded."""
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(input=x).sum()

    torch.manual_seed(0)
    model = Outer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="probe"), Monitor(output_dir=str(tmp_path), activations=True) as mon:
        mon.set_monitor(model, optimizer=opt)
        for _ in range(2):
            model(torch.randn(2, 4)).backward()
            opt.step()
            opt.zero_grad()
    rows = [r for r in read_csv(tmp_path / "metrics_rank0.csv") if r["name"] == "inner"]
    said = [r.getMessage() for r in caplog.records if "keyword arguments" in r.getMessage()]
    if GLOBAL_HOOKS_TAKE_KWARGS:
        assert rows and all(r["input_norm"] for r in rows) and not said
    else:
        assert rows and not any(r["input_norm"] for r in rows) and len(said) == 1 and "inner" in said[0]
