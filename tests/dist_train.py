"""A 2-rank data-parallel training run of a tiny transformer, dumped at every step.

    python tests/dist_train.py ROOT PORT RANK WORLD

One process per rank (the test starts them), gloo on 127.0.0.1. Each process runs
every case of ``CASES`` one after another (one torch import for all of them) and dumps
each into ``ROOT/{case}/step{N}/rank{R}/``:

- ``bench``, ``bench2``: clean fp32 runs, same seeds: bitwise equal to each other;
- ``kernel``: rank 1 at step 1 runs under a TorchDispatchMode that scales the output of
  ``aten.gelu`` by 1.01 (a kernel bug on one card);
- ``collective``: rank 1 at step 1 gets a scaled ``all_reduce`` result (a bad link):
  the fault sits inside the collective call, so the dump records it as its output.

Gradients are averaged by an ``all_reduce`` per parameter from Python, which probe sees
(DDP's Reducer calls the collective from C++, where no Python patch can see it).
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models import make_gpt  # noqa: E402

CASES = ("bench", "bench2", "kernel", "collective")
STEPS = 3
FAULT_RANK, FAULT_STEP, SCALE = 1, 1, 1.01


class ScaleGelu(TorchDispatchMode):
    """A faulty kernel: gelu's output scaled."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.gelu.default:
            out = out * SCALE
        return out


class FaultyAllReduce:
    """all_reduce whose result is scaled on this rank while ``on``."""

    def __init__(self, real):
        self.real, self.on = real, False

    def __call__(self, tensor, *args, **kwargs):
        work = self.real(tensor, *args, **kwargs)
        if self.on:
            with torch.no_grad():
                tensor.mul_(SCALE)
        return work


def run_case(case, root, rank, world):
    from probe import PrecisionDebugger
    model, _, _ = make_gpt(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)          # each rank its own batch
    faulty = None
    if case == "collective" and rank == FAULT_RANK:
        faulty = FaultyAllReduce(dist.all_reduce)
        dist.all_reduce = faulty              # before probe patches it: probe records its result
    dbg = PrecisionDebugger(dump_path=os.path.join(root, case), task="statistics", level="L1")
    try:
        for step in range(STEPS):
            x = torch.randint(0, 50, (2, 8), generator=gen)
            y = torch.randint(0, 50, (2, 8), generator=gen)
            fault = rank == FAULT_RANK and step == FAULT_STEP
            dbg.start()
            opt.zero_grad()
            if case == "kernel" and fault:
                with ScaleGelu():
                    out = model(x)
            else:
                out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
            if faulty is not None:
                faulty.on = fault
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
            if faulty is not None:
                faulty.on = False
            opt.step()
            dbg.stop()
            dbg.step()
    finally:
        dbg.close()
        if faulty is not None:
            dist.all_reduce = faulty.real


def main():
    root, port, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case in CASES:
            run_case(case, root, rank, world)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
