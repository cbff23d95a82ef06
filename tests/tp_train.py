"""A two-layer MLP trained with tensor parallelism on gloo ranks (one process each):
``parallelize_module`` with fc1 colwise and fc2 rowwise, a DeviceMesh over the CPU.

    python tests/tp_train.py OUT PORT RANK WORLD DUMP_RANKS [--task tensor] [--fault R:S[:SCALE]]
                             [--megatron] [--single]

DUMP_RANKS: "none" (no debugger), "all" or a comma list ("0"): the config's rank filter.
Writes OUT/losses_rank{R}.pt (the losses and the final local weights), and the dump under
OUT/dump when a debugger runs.

- ``--task tensor``: dump tensors instead of statistics;
- ``--fault R:S[:SCALE]``: on rank R at step S, fc1's matrix product is a wrong kernel
  (its output scaled by SCALE, default 1.05) -- a fault on one card;
- ``--megatron``: no DTensor: fc1 is a column-parallel linear on plain tensors (each rank
  holds its rows of the weight and bias, the output is all-gathered), fc2 replicated, as
  Megatron-style code does it; the dump records local shapes and no layout;
- ``--single``: one process, no process group: the same model, data and seed on one device
  (PORT, RANK and WORLD are ignored), the bench of a tensor-parallel run.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class ScaleMatmul(TorchDispatchMode):
    """A wrong kernel: the matrix product's output scaled (inside the API call, so the dump
    records the scaled output as the API's)."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
            out = out * self.scale
        return out


class Gather(torch.autograd.Function):
    """Megatron's gather from the tensor-parallel region: all_gather forward, split backward."""

    @staticmethod
    def forward(ctx, h):
        ctx.rank, ctx.world, ctx.chunk = dist.get_rank(), dist.get_world_size(), h.shape[-1]
        parts = [torch.empty_like(h) for _ in range(ctx.world)]
        dist.all_gather(parts, h.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.chunk:(ctx.rank + 1) * ctx.chunk].contiguous()


class MegatronMLP(nn.Module):
    """fc1 column-parallel on plain tensors (this rank's rows of its weight and bias), fc2
    replicated: parameters in the MLP's order, so the optimizer's calls pair by name."""

    def __init__(self, full, rank, world):
        super().__init__()
        rows = full.fc1.out_features // world
        take = slice(rank * rows, (rank + 1) * rows)
        self.w1 = nn.Parameter(full.fc1.weight.detach()[take].clone())
        self.b1 = nn.Parameter(full.fc1.bias.detach()[take].clone())
        self.fc2 = full.fc2
        self.fault = None

    def forward(self, x):
        if self.fault is not None:
            with ScaleMatmul(self.fault):
                h = F.linear(x, self.w1, self.b1)
        else:
            h = F.linear(x, self.w1, self.b1)
        return self.fc2(F.relu(Gather.apply(h)))


class FaultyFc1(nn.Module):
    """Runs fc1 under a wrong matrix-product kernel while ``fault`` holds a scale."""

    def __init__(self, model):
        super().__init__()
        self.model, self.fault = model, None

    def forward(self, x):
        m = self.model
        if self.fault is not None:
            with ScaleMatmul(self.fault):
                h = m.fc1(x)
        else:
            h = m.fc1(x)
        return m.fc2(F.relu(h))


def _options(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="statistics")
    parser.add_argument("--fault", default=None, help="RANK:STEP[:SCALE]")
    parser.add_argument("--megatron", action="store_true")
    parser.add_argument("--single", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    opts = parser.parse_args(argv)
    return opts, parse_fault(opts.fault)


def parse_fault(text):
    """``--fault RANK:STEP[:SCALE]`` as (rank, step, scale), scale 1.05 by default; None if not given."""
    if not text:
        return None
    parts = text.split(":")
    return int(parts[0]), int(parts[1]), float(parts[2]) if len(parts) > 2 else 1.05


def _model(opts, rank, world):
    torch.manual_seed(0)
    model = MLP()
    if opts.single:
        return FaultyFc1(model)
    if opts.megatron:
        return MegatronMLP(model, rank, world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    return FaultyFc1(model)


def main():
    out, port, rank, world, dump_ranks = sys.argv[1:6]
    opts, fault = _options(sys.argv[6:])
    rank, world = int(rank), int(world)
    torch.set_num_threads(1)
    if opts.single:
        rank, world = 0, 1
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = _model(opts, rank, world)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = None
    if dump_ranks != "none":
        from probe import PrecisionDebugger
        ranks = [] if dump_ranks == "all" else [int(r) for r in dump_ranks.split(",")]
        dbg = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task=opts.task, level="L1", rank=ranks)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(opts.steps):
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        model.fault = fault[2] if fault is not None and (rank, step) == fault[:2] else None
        if dbg:
            dbg.start()
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
        losses.append(loss.detach().clone())
    if dbg:
        dbg.close()
    weights = [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()]
    torch.save({"losses": losses, "weights": weights}, os.path.join(out, f"losses_rank{rank}.pt"))
    if not opts.single:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
