"""DDP and FSDP2 under the debugger, two gloo ranks (tests/data_parallel_train.py, one
process per rank): each parameter's gradient is recorded after the wrapper's reduction
(``Module.*.parameters_grad.N``, at L1 and mix), the same on both ranks and equal to the
mean of the ranks' own gradients; FSDP2's all-gathers and reduce-scatters are recorded
with their outputs and its sharded gradients as local shards with their layout; training
is bitwise the same as without the debugger."""
import json
import os
import re
import sys

import pytest
import torch
from gloo_ranks import free_port, run_ranks

WORLD = 2
STEPS = 3
STATS = ("Max", "Min", "Mean", "Norm")
_GRAD_ENTRY = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.parameters_grad\.(?P<k>\d+)$")

pytestmark = [
    pytest.mark.slow,   # several processes or compiled graphs: minutes on a busy machine
    pytest.mark.skipif(sys.platform != "linux", reason="gloo on 127.0.0.1, Linux"),
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built"),
]


def _train(out, wrapper, timeout=300):
    """Both ranks of tests/data_parallel_train.py; a rank that hangs fails the test after
    ``timeout`` seconds."""
    codes, said = run_ranks("data_parallel_train.py", out, WORLD, [wrapper], timeout,
                            f"{wrapper} training on {WORLD} gloo ranks")
    assert not any(codes), "\n".join(said)
    results = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=True) for r in range(WORLD)]
    if "skip" in results[0]:
        pytest.skip(results[0]["skip"])
    return results, said


def _dump(out, case, step, rank):
    with open(os.path.join(out, case, f"step{step}", f"rank{rank}", "dump.json"), encoding="utf-8") as fh:
        return json.load(fh)["data"]


def _reduced_grads(data, inner_prefix):
    """{parameter name: (entry name, its summary)} of a dump's parameters_grad entries;
    ``inner_prefix`` is the wrapper's path to the user's model (DDP: ``module``)."""
    grads = {}
    for name, entry in data.items():
        m = _GRAD_ENTRY.match(name)
        if m is None:
            continue
        path = m["path"]
        if inner_prefix:
            path = "" if path == inner_prefix else path[len(inner_prefix) + 1:]
        for p_name, (summary,) in entry.items():
            grads[f"{path}.{p_name}" if path else p_name] = (name, summary)
    return grads


def _stats(t):
    w = t.detach().double()
    return [w.max().item(), w.min().item(), w.mean().item(), w.norm().item()]


def _close(recorded, t):
    return all(abs(r - e) <= 1e-5 * max(1.0, abs(e)) + 1e-9 for r, e in zip([recorded[k] for k in STATS], _stats(t)))


def _bitwise(results):
    for res in results:
        plain = res["final"]["plain"]
        for case in ("L1", "mix"):
            assert len(res["final"][case]) == len(plain)
            assert all(torch.equal(a, b) for a, b in zip(plain, res["final"][case])), case


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    return out, *_train(out, "ddp")


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory):
    from probe.torch_compat import FSDP2_NOT_ON_CPU, FSDP2_RUNS_ON_CPU, fully_shard_api
    if fully_shard_api() is None:
        pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard: torch.distributed.fsdp from 2.6, "
                    "torch.distributed._composable.fsdp in 2.3-2.5)")
    if not FSDP2_RUNS_ON_CPU:   # the gloo ranks run on the CPU
        pytest.skip(FSDP2_NOT_ON_CPU)
    out = tmp_path_factory.mktemp("fsdp2")
    return out, *_train(out, "fsdp2")


def test_ddp_trains_bitwise_under_the_debugger(ddp_run):
    _, results, _ = ddp_run
    _bitwise(results)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_ddp_gradients_are_recorded_after_the_all_reduce_on_every_rank(ddp_run, level):
    out, results, said = ddp_run
    names = set(results[0]["local"][0])
    for step in range(STEPS):
        per_rank = [_reduced_grads(_dump(out, level, step, r), "module") for r in range(WORLD)]
        local = [results[r]["local"][step] for r in range(WORLD)]
        for rank, grads in enumerate(per_rank):
            assert set(grads) == names, (level, step, rank, names ^ set(grads))
            # one reduction per step: the micro-batch under no_sync() is not read on its own
            assert {entry.rsplit(".", 1)[1] for entry, _ in grads.values()} == {"0"}
        differs = 0
        for p in names:
            a, b = per_rank[0][p][1], per_rank[1][p][1]
            assert [a[k] for k in STATS] == [b[k] for k in STATS], (level, step, p)   # the same on both ranks
            mean = (local[0][p] + local[1][p]) / WORLD
            assert _close(a, mean), (level, step, p, a, _stats(mean))              # the reduced gradient
            differs += not _close(a, local[0][p])
        assert differs > len(names) // 2       # not rank 0's own gradient: the ranks saw different data
    assert sum("after DDP's all-reduce" in s for s in said) == WORLD   # said once per process (and run)


def test_fsdp2_trains_bitwise_under_the_debugger(fsdp2_run):
    _, results, _ = fsdp2_run
    _bitwise(results)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_fsdp2_collectives_are_recorded_with_their_outputs(fsdp2_run, level):
    out, _, _ = fsdp2_run
    for step in range(STEPS):
        dumps = [_dump(out, level, step, r) for r in range(WORLD)]
        for kind in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            names = [[n for n in d if n.startswith(f"Distributed.{kind}.")] for d in dumps]
            assert names[0] == names[1] and len(names[0]) >= 3, (kind, names)   # one per FSDP group at least
            for name in names[0]:
                outputs = [d[name]["output"] for d in dumps]
                assert all(len(o) == 1 and o[0]["Max"] is not None for o in outputs), (name, outputs)
                if kind == "all_gather_into_tensor":   # what every rank gathered: the same tensor
                    assert [outputs[0][0][k] for k in STATS] == [outputs[1][0][k] for k in STATS]
                    assert outputs[0][0]["shape"][0] == WORLD * dumps[0][name]["input_args"][1]["shape"][0]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_fsdp2_gradients_are_local_shards_after_the_reduce_scatter(fsdp2_run, level):
    out, results, _ = fsdp2_run
    names = set(results[0]["local"][0]) - {"pos"}   # the root's own parameter: the root is not dumped
    for step in range(STEPS):
        per_rank = [_reduced_grads(_dump(out, level, step, r), "") for r in range(WORLD)]
        for rank, grads in enumerate(per_rank):
            assert set(grads) == names, (level, step, rank, names ^ set(grads))
            mean = {p: (results[0]["local"][step][p] + results[1]["local"][step][p]) / WORLD for p in names}
            for p in names:
                summary = grads[p][1]
                full = mean[p]
                assert summary["shape"] == list(full.shape)
                assert summary["placements"] == ["Shard(dim=0)"] and summary["mesh_shape"] == [WORLD]
                rows = -(-full.shape[0] // WORLD)          # torch.chunk's split of dim 0
                shard = full[rank * rows:(rank + 1) * rows]
                assert summary["local_shape"] == list(shard.shape), (p, summary)
                if summary["global_offset"] is not None:
                    assert summary["global_offset"][0] == rank * rows
                assert _close(summary, shard), (level, step, rank, p, summary, _stats(shard))


def test_fsdp2_optimizer_sees_sharded_parameters_as_local_shards(fsdp2_run):
    """The optimizer's calls on FSDP2's parameters record each rank's shard with its layout."""
    out, _, _ = fsdp2_run
    data = _dump(out, "L1", 0, 0)
    sharded = [a for name, e in data.items() if name.startswith("Tensor.") for a in e.get("input_args", [])
               if isinstance(a, dict) and "placements" in a]
    assert sharded and all(a["placements"] == ["Shard(dim=0)"] and "local_shape" in a for a in sharded)


@pytest.fixture
def one_rank_group(monkeypatch):
    dist = torch.distributed
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Net(torch.nn.Module):
    """A class of its own: no other test compiles it (dynamo's code cache is per process,
    and a model whose class has compiled code counts as compiled)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def _ddp_steps(dbg, steps=2):
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(4, 8)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    for _ in range(steps):
        if dbg:
            dbg.start(ddp)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    return [p.detach().clone() for p in ddp.parameters()]


def test_a_failure_reading_reduced_gradients_is_logged_once_and_training_goes_on(
        one_rank_group, make_debugger, dump_dir, monkeypatch):
    import logging

    from conftest import LogCapture, load_dump

    from probe.dump.entry_builder import EntryBuilder
    plain = _ddp_steps(None)

    def broken(self, g):
        raise RuntimeError("no statistics today")
    monkeypatch.setattr(EntryBuilder, "grad_seen", broken)
    with LogCapture("probe", logging.WARNING) as log:
        dumped = _ddp_steps(make_debugger(level="L1"))
    assert all(torch.equal(a, b) for a, b in zip(plain, dumped))
    said = [m for m in log.messages if "parameters_grad failed" in m]
    assert len(said) == 1 and "no statistics today" in said[0], log.messages
    data = load_dump(dump_dir, rank_dir="rank0")
    assert "Functional.linear.0.forward" in data and not any("parameters_grad" in n for n in data)


def test_a_plain_model_at_l1_gets_no_parameter_gradients(make_debugger, dump_dir):
    """L1 records APIs; only a data-parallel wrapper's reduced gradients are added."""
    from conftest import load_dump
    model, x = _Net(), torch.randn(4, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dbg = make_debugger(level="L1")
    dbg.start(model)
    model(x).pow(2).mean().backward()
    opt.step()
    dbg.stop()
    dbg.step()
    data = load_dump(dump_dir)
    assert "Functional.linear.0.forward" in data and not any("parameters_grad" in n for n in data)


def test_fsdp2_on_a_cpu_it_cannot_run_on_is_said_once(one_rank_group, make_debugger):
    """torch 2.3-2.6's FSDP2 fails on the CPU at its first all-gather, without probe too:
    start() says so in one line, so that torch's AttributeError is not taken for probe's."""
    import logging

    from conftest import LogCapture

    from probe.torch_compat import FSDP2_RUNS_ON_CPU, fully_shard_api
    fully_shard = fully_shard_api()
    if fully_shard is None or FSDP2_RUNS_ON_CPU:
        pytest.skip(f"torch {torch.__version__}: " + ("no FSDP2" if fully_shard is None else "FSDP2 runs on the CPU"))
    model = _Net()
    fully_shard(model)
    dbg = make_debugger(level="L1")
    with LogCapture("probe", logging.WARNING) as log:
        for _ in range(2):
            dbg.start(model)
            dbg.stop()
            dbg.step()
    said = [m for m in log.messages if "cannot run on the CPU" in m]
    assert len(said) == 1 and "record_event" in said[0], log.messages
