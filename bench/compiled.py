"""What dumping a torch.compile'd model at L1 costs: step time of a compiled GPT-2-sized
block (d=768, 12 heads) with the debugger off and on, beside eager dumping of the same block.

    python bench/compiled.py [--device cuda] [--steps 20] [--batch 4] [--seq 128] [--layers 1]

Prints the median step (forward, backward, AdamW) of: compiled without probe, compiled with
L1 statistics dumped every step, compiled with the debugger built but idle (the in-graph
statistics alone), eager without probe, eager with L1 statistics; and the ratios. On CUDA
it also counts the host synchronisations of a dumped compiled step
(``torch.cuda.set_sync_debug_mode``): the statistics stay on the device until the dump's
flush, which fetches every graph's vector in one transfer. A measurement, not a test.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from models import TransformerBlock  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402


def make(layers, device):
    torch.manual_seed(0)
    return nn.Sequential(*[TransformerBlock(d=768, n_heads=12) for _ in range(layers)]).to(device)


def measure(args, compiled, dump):
    import torch._dynamo as dynamo
    dynamo.reset()
    model = make(args.layers, args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if compiled else model
    x = torch.randn(args.batch, args.seq, 768, device=args.device)
    tmp = tempfile.mkdtemp(prefix="probe_bench_compiled_")
    # dump "idle": the debugger exists (graphs compiled with their statistics) but never starts:
    # what the statistics cost inside the graph, without the eager parts' entries
    dbg = PrecisionDebugger(dump_path=tmp, task="statistics", level="L1") if dump else None
    idle = dump == "idle"
    times, syncs = [], 0

    def step():
        if dbg and not idle:
            dbg.start()
        opt.zero_grad()
        run(x).square().mean().backward()
        opt.step()
        if dbg and not idle:
            dbg.stop()
            dbg.step()
        if args.device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):   # compiles, then warm
        step()
    for i in range(args.steps):
        t = time.perf_counter()
        if args.device == "cuda" and i == 0:
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                step()
            torch.cuda.set_sync_debug_mode(0)
            syncs = sum("synchroniz" in str(w.message) for w in seen)
        else:
            step()
        times.append(time.perf_counter() - t)
    if dbg:
        dbg.close()
    dynamo.reset()
    return statistics.median(times) * 1e3, syncs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--layers", type=int, default=1)
    args = p.parse_args()
    rows = {}
    for name, compiled, dump in (("compiled", True, False), ("compiled+L1", True, True),
                                 ("compiled+idle", True, "idle"), ("eager", False, False),
                                 ("eager+L1", False, True)):
        rows[name] = measure(args, compiled, dump)
        ms, syncs = rows[name]
        extra = f"  host syncs in a dumped step: {syncs}" if args.device == "cuda" else ""
        print(f"{name:12s} {ms:9.2f} ms/step{extra}", flush=True)
    print(f"compiled: L1 statistics x{rows['compiled+L1'][0] / rows['compiled'][0]:.2f} "
          f"(the graphs' own statistics, debugger idle: x{rows['compiled+idle'][0] / rows['compiled'][0]:.2f}) "
          f"(target x1.3); eager: x{rows['eager+L1'][0] / rows['eager'][0]:.2f}; "
          f"torch {torch.__version__}, {args.device}, d=768, batch {args.batch}, seq {args.seq}, "
          f"{args.layers} block(s)")


if __name__ == "__main__":
    main()
