"""Two gloo ranks on 127.0.0.1: per-rank files, gradient norms before and after the reduction.

Each rank trains the same small GPT (tests/models.py) on different batches, once with a
manual ``all_reduce`` of the gradients (averaged) and once under DDP; the worker computes,
with its own torch calls, the local and the reduced gradient norms the monitor must report.
"""
import copy
import csv
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import free_port
from models import make_gpt

from probe import Monitor

pytestmark = pytest.mark.slow   # several processes or compiled graphs: minutes on a busy machine

STEPS = 3
WORLD = 2


def _batches(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 50, (2, 8), generator=g)


def _loss(model, x, y):
    out = model(x)
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        reference = {}
        for mode in ("manual", "ddp"):
            model, _, _ = make_gpt(seed=0, n_layers=2)
            shadow = copy.deepcopy(model)               # the same weights, no reduction: local grads
            trained = torch.nn.parallel.DistributedDataParallel(model) if mode == "ddp" else model
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            mon = Monitor(output_dir=os.path.join(out_dir, mode), formats=["csv", "alerts"])
            mon.set_monitor(model, optimizer=opt)
            ref = reference[mode] = []
            for step in range(STEPS):
                x, y = _batches(rank, step)
                shadow.load_state_dict(model.state_dict())
                shadow.zero_grad()
                _loss(shadow, x, y).backward()
                local = {n: p.grad.norm().item() for n, p in shadow.named_parameters()}
                _loss(trained, x, y).backward()
                if mode == "manual":
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                        p.grad /= WORLD
                reduced = {n: p.grad.norm().item() for n, p in model.named_parameters()}
                opt.step()
                opt.zero_grad()
                ref.append({"local": local, "reduced": reduced})
            mon.close()
        with open(os.path.join(out_dir, f"reference_rank{rank}.json"), "w") as f:
            json.dump(reference, f)
    finally:
        dist.destroy_process_group()


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_two_gloo_ranks_write_per_rank_files_and_pre_post_reduction_norms(tmp_path):
    # spawn, not fork: a fork of the test process inherits the locks of whatever threads
    # earlier tests left (dynamo's, writers') and a child can hang on one (seen in CI)
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    refs = []
    for rank in range(WORLD):
        with open(tmp_path / f"reference_rank{rank}.json") as f:
            refs.append(json.load(f))
    for mode in ("manual", "ddp"):
        out = tmp_path / mode
        assert sorted(os.listdir(out)) == ["alerts.jsonl", "metrics_rank0.csv", "metrics_rank1.csv"]
        assert os.path.getsize(out / "alerts.jsonl") == 0       # a clean run: no alert on either rank
        post = {}
        for rank in range(WORLD):
            rows = _rows(out / f"metrics_rank{rank}.csv")
            assert {r["rank"] for r in rows} == {str(rank)}
            assert sorted({int(r["step"]) for r in rows}) == list(range(STEPS))
            for step in range(STEPS):
                ref = refs[rank][mode][step]
                by_name = {r["name"]: r for r in rows if int(r["step"]) == step}
                for name, local in ref["local"].items():
                    assert float(by_name[name]["grad_norm_pre"]) == pytest.approx(local, rel=1e-5), (mode, name)
                    assert float(by_name[name]["grad_norm"]) == pytest.approx(ref["reduced"][name], rel=1e-5)
                    post.setdefault((step, name), []).append(float(by_name[name]["grad_norm"]))
        for (step, name), values in post.items():
            assert values[0] == pytest.approx(values[1], rel=1e-6)     # the reduced gradient is the same on both
            pre = [refs[r][mode][step]["local"][name] for r in range(WORLD)]
            assert pre[0] != pre[1]                                    # ranks saw different data
            assert values[0] <= sum(pre) / WORLD * (1 + 1e-6)          # ||mean of grads|| <= mean of norms
