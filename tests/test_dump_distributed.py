"""Under torch.distributed: rank folders, the rank filter, and Distributed.* entries (gloo, one rank)."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
from conftest import load_dump


@pytest.fixture
def one_rank_group(monkeypatch):
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
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
