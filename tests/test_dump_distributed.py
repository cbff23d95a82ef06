"""Under torch.distributed: rank folders, the rank filter, and Distributed.* entries (gloo, one rank)."""
import os

import pytest
import torch
import torch.distributed as dist
from conftest import load_dump
from gloo_ranks import free_port

pytestmark = pytest.mark.slow   # several processes or compiled graphs: minutes on a busy machine


@pytest.fixture
def one_rank_group(monkeypatch):
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(dbg):
    x = torch.randn(4, requires_grad=True)
    dbg.start()
    (x * 2).sum().backward()
    g = x.grad.clone()
    dist.all_reduce(g)
    dbg.stop()
    dbg.step()
    return g, x.grad


def test_rank_folder_and_distributed_entries(one_rank_group, make_debugger, dump_dir):
    g, grad = _train(make_debugger(rank=[0]))
    assert torch.equal(g, grad)          # all_reduce over one rank: unchanged, and it ran
    assert os.listdir(os.path.join(dump_dir, "step0")) == ["rank0"]
    data = load_dump(dump_dir, rank_dir="rank0")
    entry = data["Distributed.all_reduce.0.forward"]
    assert entry["input_args"][0]["shape"] == [4]
    assert "Tensor.__mul__.0.backward" in data


def test_rank_filter_skips_other_ranks(one_rank_group, make_debugger, dump_dir):
    _train(make_debugger(rank=[1]))
    assert not os.path.exists(os.path.join(dump_dir, "step0"))


class _AllReduceInBackward(torch.autograd.Function):
    """A tensor-parallel style Function: its backward all-reduces (here over one rank)."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


def test_a_collective_in_a_backward_on_another_thread_is_recorded(one_rank_group, make_debugger, dump_dir):
    """On an accelerator the autograd engine runs backward nodes on its device thread, which
    started no interceptor: a collective there (FSDP2's reduce-scatter, a Function's
    all-reduce) is recorded for the thread that runs the dump. Simulated with a thread."""
    import threading
    dbg = make_debugger()
    x = torch.randn(4, requires_grad=True)
    dbg.start()
    y = _AllReduceInBackward.apply(x).sum()
    worker = threading.Thread(target=y.backward)
    worker.start()
    worker.join(60)
    dbg.stop()
    dbg.step()
    assert torch.equal(x.grad, torch.ones(4))
    data = load_dump(dump_dir, rank_dir="rank0")
    assert data["Distributed.all_reduce.0.forward"]["output"][0]["Max"] == 1.0
