"""A tiny GPT (tests/models.py) trained data-parallel on gloo ranks (one process each), under
DDP or FSDP2 (``fully_shard`` on each block and on the root), with AdamW.

    python tests/data_parallel_train.py OUT PORT RANK WORLD WRAPPER

WRAPPER: ``ddp`` or ``fsdp2``. Each process runs the cases ``plain`` (no debugger), ``L1``
and ``mix`` (a debugger at that level, ``start(model)`` given the wrapped model) one after
the other, from the same seeds, and writes ``OUT/rank{R}.pt``:

- ``final``: case -> the parameters after the last step (FSDP2: the rank's local shards);
- ``local``: step -> {parameter name: this rank's own gradient}, from an unwrapped copy of
  the model with the same weights on the same batches (what the wrapper reduces);
- ``skip``: why the wrapper cannot run here (this torch or its gloo), when it cannot.

Dumps go to ``OUT/{case}/step{N}/rank{R}/``. The last step accumulates two micro-batches,
the first under DDP's ``no_sync()``: one reduction for the step.
"""
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models import make_gpt  # noqa: E402

STEPS = 3
CASES = ("plain", "L1", "mix")


def micro_batches(rank, step):
    """Each rank its own batches; the last step two micro-batches."""
    g = torch.Generator().manual_seed(100 * rank + step)
    n = 2 if step == STEPS - 1 else 1
    return [(torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 50, (2, 8), generator=g)) for _ in range(n)]


def loss_of(model, x, y):
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def wrap(model, wrapper):
    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from probe.torch_compat import fully_shard_api
    fully_shard = fully_shard_api()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def local_grads(shadow, state, batches):
    """This rank's own accumulated gradients on ``batches``, from weights ``state``."""
    shadow.load_state_dict(state)
    shadow.zero_grad()
    for x, y in batches:
        loss_of(shadow, x, y).backward()
    return {n: p.grad.clone() for n, p in shadow.named_parameters()}


def full_state(model):
    """The unsharded weights (FSDP2's DTensor shards gathered), for the unwrapped copy."""
    inner = getattr(model, "module", model)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in inner.state_dict().items()}


def run_case(case, wrapper, out, rank, record):
    from probe import PrecisionDebugger
    model, _, _ = make_gpt(seed=0, n_layers=2)
    shadow = copy.deepcopy(model) if record is not None else None
    trained = wrap(model, wrapper)
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    dbg = None if case == "plain" else \
        PrecisionDebugger(dump_path=os.path.join(out, case), task="statistics", level=case)
    for step in range(STEPS):
        batches = micro_batches(rank, step)
        if shadow is not None:
            record[step] = local_grads(shadow, full_state(trained), batches)
        if dbg:
            dbg.start(trained)
        opt.zero_grad()
        for i, (x, y) in enumerate(batches):
            if wrapper == "ddp" and i < len(batches) - 1:
                with trained.no_sync():
                    loss_of(trained, x, y).backward()
            else:
                if wrapper == "fsdp2" and len(batches) > 1:
                    trained.set_requires_gradient_sync(i == len(batches) - 1)
                loss_of(trained, x, y).backward()
        opt.step()
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    return [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in trained.parameters()]


def main():
    out, port, rank, world, wrapper = sys.argv[1:6]
    rank, world = int(rank), int(world)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {"final": {}, "local": {}}
    try:
        for case in CASES:
            try:
                result["final"][case] = run_case(case, wrapper, out, rank,
                                                 result["local"] if case == "L1" else None)
            except RuntimeError as exc:   # this torch's gloo lacks a collective the wrapper uses
                if case != "plain" or "support" not in str(exc):
                    raise
                result["skip"] = f"{wrapper} on gloo, torch {torch.__version__}: {exc}".splitlines()[0]
                break
            dist.barrier()
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
