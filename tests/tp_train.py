"""A two-layer MLP trained with tensor parallelism on gloo ranks (one process each):
``parallelize_module`` with fc1 colwise and fc2 rowwise, a DeviceMesh over the CPU.

    python tests/tp_train.py OUT PORT RANK WORLD DUMP_RANKS

DUMP_RANKS: "none" (no debugger), "all" or a comma list ("0"): the config's rank filter.
Writes OUT/losses_rank{R}.pt (the losses and the final local weights), and the dump under
OUT/dump when a debugger runs.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    out, port, rank, world, dump_ranks = sys.argv[1:6]
    rank, world = int(rank), int(world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    torch.manual_seed(0)
    model = MLP()
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = None
    if dump_ranks != "none":
        from probe import PrecisionDebugger
        ranks = [] if dump_ranks == "all" else [int(r) for r in dump_ranks.split(",")]
        dbg = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task="statistics", level="L1", rank=ranks)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
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
    weights = [p.to_local().detach().clone() for p in model.parameters()]
    torch.save({"losses": losses, "weights": weights}, os.path.join(out, f"losses_rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
