"""Two gloo ranks (torch.multiprocessing.spawn): every collective records the tensors it
wrote as its outputs on both ranks, the async form once its work completes."""
import json
import os

import pytest
from gloo_ranks import free_port

pytestmark = pytest.mark.slow   # several processes or compiled graphs: minutes on a busy machine

torch = pytest.importorskip("torch")
dist = torch.distributed
mp = pytest.importorskip("torch.multiprocessing")


def _stats(t):
    w = t.detach().double()
    return [w.max().item(), w.min().item(), w.mean().item(), w.norm().item()]


def _recorded(entry):
    return [[o["Max"], o["Min"], o["Mean"], o["Norm"]] for o in entry["output"]]


def _close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 * max(1.0, abs(y)) for x, y in zip(a, b))


def _gloo_lacks(world):
    """The collectives below that this torch's gloo does not implement, tried before the
    dump: torch 2.1's has no all_gather_into_tensor, all_to_all, reduce_scatter or
    reduce_scatter_tensor ("does not support"); those are not checked there."""
    x = torch.ones(4)
    tries = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(4 * world), x),
        "all_to_all": lambda: dist.all_to_all([torch.empty(2) for _ in range(world)], [x[:2]] * world),
        "reduce_scatter": lambda: dist.reduce_scatter(torch.empty(2), [x[:2]] * world),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(2), x),
    }
    lacks = set()
    for name, call in tries.items():
        try:
            call()
        except RuntimeError as exc:
            if "support" not in str(exc):
                raise
            lacks.add(name)
    return lacks


def _rank(rank, world, port, dump_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from probe import PrecisionDebugger
    lacks = _gloo_lacks(world)
    dbg = PrecisionDebugger(task="statistics", dump_path=dump_path, level="L1")
    base = torch.arange(1.0, 5.0) * (rank + 1)
    results = {}
    dbg.start()
    t = base.clone()
    dist.all_reduce(t)
    results["Distributed.all_reduce.0"] = [t]
    t = base.clone()
    dist.broadcast(t, src=1)
    results["Distributed.broadcast.0"] = [t]
    t = base.clone()
    dist.reduce(t, dst=0)
    results["Distributed.reduce.0"] = [t]
    out = [torch.empty(4) for _ in range(world)]
    dist.all_gather(out, base * 3)
    results["Distributed.all_gather.0"] = out
    if "all_gather_into_tensor" not in lacks:
        big = torch.empty(4 * world)
        dist.all_gather_into_tensor(big, base + 1)
        results["Distributed.all_gather_into_tensor.0"] = [big]
    if "all_to_all" not in lacks:
        got = [torch.empty(2) for _ in range(world)]
        dist.all_to_all(got, [base[:2] + 10 * r for r in range(world)])
        results["Distributed.all_to_all.0"] = got
    single = torch.empty(4)
    dist.all_to_all_single(single, base * 5)
    results["Distributed.all_to_all_single.0"] = [single]
    if "reduce_scatter" not in lacks:
        rs = torch.empty(2)
        dist.reduce_scatter(rs, [base[:2] * (r + 1) for r in range(world)])
        results["Distributed.reduce_scatter.0"] = [rs]
    if "reduce_scatter_tensor" not in lacks:
        rst = torch.empty(2)
        dist.reduce_scatter_tensor(rst, base * 2)
        results["Distributed.reduce_scatter_tensor.0"] = [rst]
    # torch 2.13's new names of the two (FSDP2 calls them): recorded under the registered names
    if hasattr(dist, "all_gather_single") and "all_gather_into_tensor" not in lacks:
        big = torch.empty(4 * world)
        dist.all_gather_single(big, base + 2)
        results["Distributed.all_gather_into_tensor.1"] = [big]
    if hasattr(dist, "reduce_scatter_single") and "reduce_scatter_tensor" not in lacks:
        rst = torch.empty(2)
        dist.reduce_scatter_single(rst, base * 3)
        results["Distributed.reduce_scatter_tensor.1"] = [rst]
    if rank == 0:
        dist.send(base * 7, dst=1)
    else:
        r = torch.zeros(4)
        dist.recv(r, src=0)
        results["Distributed.recv.0"] = [r]
    t = base.clone() * 11
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    results["Distributed.all_reduce.1"] = [t]
    dbg.stop()
    dbg.step()
    dbg.close()
    with open(os.path.join(dump_path, "step0", f"rank{rank}", "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    bad = []
    for name, tensors in results.items():
        entry = data.get(name + ".forward")
        if entry is None or None in entry["output"]:
            bad.append(f"{name}: {entry and entry['output']}")
        elif not all(_close(r, _stats(t)) for r, t in zip(_recorded(entry), tensors)) \
                or len(entry["output"]) != len(tensors):
            bad.append(f"{name}: recorded {_recorded(entry)} != {[_stats(t) for t in tensors]}")
    assert not [n for n in data if n.startswith(("Distributed.all_gather_single", "Distributed.reduce_scatter_single"))]
    assert results["Distributed.all_reduce.0"][0].tolist() == [3.0, 6.0, 9.0, 12.0]   # the op ran, once
    assert not bad, f"rank {rank}: " + "; ".join(bad)
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not available")
def test_two_gloo_ranks_record_collective_outputs(tmp_path):
    mp.spawn(_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
