"""An MLP trained data-parallel on gloo ranks (one process each) under DDP or FSDP2, or on
one device, with AdamW: the runs ``probe compare --npu DP_ROOT --bench SINGLE_ROOT`` pairs.

    python tests/dp_train.py OUT PORT RANK WORLD WRAPPER [--task tensor] [--fault R:S[:SCALE]]
                             [--steps N] [--level L1] [--no-optimizer-dump]

WRAPPER: ``ddp``, ``fsdp2`` (``fully_shard`` on each layer and on the root) or ``single``
(one process, no process group: PORT, RANK and WORLD are ignored). Every step draws one
global batch of 4 rows from the same generator; rank r of W trains on rows [r*4/W,
(r+1)*4/W) of it, the single run on all of it, from the same seed: the mean loss and the
wrappers' averaging make the reduced gradients the single run's.

- ``--task tensor``: dump tensors instead of statistics;
- ``--fault R:S[:SCALE]``: on rank R at step S, fc1's matrix product is a wrong kernel (its
  output scaled by SCALE, default 1.05; tests/tp_train.py's ScaleMatmul);
- ``--no-optimizer-dump``: the dump stops before the optimizer's step (it still runs), as a
  user who dumps forward and backward only has it.

Writes the dump under OUT/dump and OUT/weights_rank{R}.pt (the final local weights).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tp_train import ScaleMatmul, parse_fault  # noqa: E402

GLOBAL_BATCH = 4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.fault = None

    def forward(self, x):
        if self.fault is not None:
            with ScaleMatmul(self.fault):
                h = self.fc1(x)
        else:
            h = self.fc1(x)
        return self.fc2(F.relu(h))


def _options(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="statistics")
    parser.add_argument("--fault", default=None, help="RANK:STEP[:SCALE]")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--level", default="L1")
    parser.add_argument("--no-optimizer-dump", action="store_true")
    opts = parser.parse_args(argv)
    return opts, parse_fault(opts.fault)


def _wrap(model, wrapper):
    if wrapper == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if wrapper == "fsdp2":
        from probe.torch_compat import fully_shard_api
        fully_shard = fully_shard_api()
        if fully_shard is None:
            raise ImportError(f"torch {torch.__version__} has no FSDP2")
        fully_shard(model.fc1)
        fully_shard(model.fc2)
        fully_shard(model)
    return model


def main():
    out, port, rank, world, wrapper = sys.argv[1:6]
    opts, fault = _options(sys.argv[6:])
    rank, world = int(rank), int(world)
    torch.set_num_threads(1)
    if wrapper == "single":
        rank, world = 0, 1
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    inner = MLP()
    model = _wrap(inner, wrapper)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    from probe import PrecisionDebugger
    dbg = PrecisionDebugger(dump_path=os.path.join(out, "dump"), task=opts.task, level=opts.level)
    g = torch.Generator().manual_seed(1)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    for step in range(opts.steps):
        x, y = torch.randn(GLOBAL_BATCH, 16, generator=g), torch.randn(GLOBAL_BATCH, 8, generator=g)
        x, y = x[rows], y[rows]          # what a DistributedSampler hands this rank
        inner.fault = fault[2] if fault is not None and (rank, step) == fault[:2] else None
        dbg.start(model)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if opts.no_optimizer_dump:
            dbg.stop()
            opt.step()
        else:
            opt.step()
            dbg.stop()
        dbg.step()
    dbg.close()
    weights = [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()]
    torch.save(weights, os.path.join(out, f"weights_rank{rank}.pt"))
    if wrapper != "single":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
