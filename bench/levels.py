"""Overhead of dumping at L0, mix, L1 and L2 on the fixture's tiny model, as a ratio to no dump.

    python bench/levels.py [--d 256] [--blocks 2] [--batch 8] [--steps 30] [--levels L0,mix,L1,L2]

Each level runs in the same process on the same model: a few warm-up steps, then per-step
times (forward, backward, SGD step, start/stop/step) over ``--steps``. The machine is
shared, so the best of ``--rounds`` interleaved rounds of the fastest quartile is reported:
other load only ever adds time.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _tiny():
    spec = importlib.util.spec_from_file_location("tiny_model", os.path.join(ROOT, "tests", "fixtures", "dump", "tiny_model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(level, args, tm):
    model, x, y = tm.make(d=args.d, n_blocks=args.blocks, batch=args.batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = None
    if level != "none":
        from probe import PrecisionDebugger
        dbg = PrecisionDebugger(dump_path=tempfile.mkdtemp(prefix="probe_bench_"), level=level)
    times = []
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        if dbg:
            dbg.start(model=model)
        tm.train_step(model, opt, x, y)
        if dbg:
            dbg.stop()
            dbg.step()
        times.append(time.perf_counter() - t)
    if dbg:
        dbg.close()
    kept = sorted(times[args.warmup:])
    return statistics.mean(kept[: max(1, len(kept) // 4)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--levels", default="L0,mix,L1,L2")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tm = _tiny()
    levels = ["none"] + args.levels.split(",")
    best = {}
    for _ in range(args.rounds):
        for level in levels:
            t = run(level, args, tm)
            best[level] = min(best.get(level, t), t)
    base = best["none"]
    print(f"model d={args.d} blocks={args.blocks} batch={args.batch}: no dump {base * 1e3:.2f} ms/step")
    for level in levels[1:]:
        print(f"  {level:4s} {best[level] * 1e3:8.2f} ms/step  x{best[level] / base:.2f}")


if __name__ == "__main__":
    main()
