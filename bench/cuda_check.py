"""The CUDA paths, measured on a GPU (a lent machine; nothing in the suite needs one).

    python bench/cuda_check.py [--steps 10] [--d 768 2048] [--skip-eager] [--skip-monitor] [--skip-compiled]

1. eager L1 statistics dump of a 2-block GPT-2-style model at each width of ``--d``: step ms
   off and on, for each reduction path (``VARIANTS``: before the step buffer, the buffer
   written by torch ops, the fused Triton kernel), entries per step, us per entry, and the
   host synchronisations of a dumped step (``torch.cuda.set_sync_debug_mode``): the
   statistics are reduced on the device and fetched at the dump's flushes, not per call;
2. the monitor (weights, gradients, activations, interval 10): host synchronisations on a
   step it does not log and on one it does (one transfer per logged interval);
3. a compiled block (inductor, Triton): training with the debugger is bitwise the run without
   it, and bench/compiled.py's figures on this GPU.
Prints what it measured; asserts nothing.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from models import TransformerBlock, make_gpt  # noqa: E402

from probe import Monitor, PrecisionDebugger  # noqa: E402


def syncs_of(fn):
    """How many synchronising CUDA calls ``fn`` makes (torch warns once per call in 'warn' mode)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in seen)


def block_model(d=768):
    torch.manual_seed(0)
    return nn.Sequential(*[TransformerBlock(d=d, n_heads=d // 64) for _ in range(2)]).cuda()


# How a dumped step's statistics are reduced on CUDA: "before" is the path before the step
# buffer (each tensor's own aminmax/sum/norm/stack vector, joined and fetched at the flush);
# "torch rows" writes those ops' results into the step buffer; "fused alone" is the Triton
# kernel, a launch or three per tensor; "fused" takes a foreach op's lists together (two
# launches a list); "no stats" reduces nothing (every call intercepted and recorded, no
# statistics): the floor that the reductions sit on.
VARIANTS = ("before", "torch rows", "fused alone", "fused", "no stats")


def _variant(name):
    """Patches that select one reduction path (step_stats' switches; restored by the caller)."""
    from probe.dump import step_stats
    saved = (step_stats.StepStats.wants, step_stats.StepStats.add, step_stats.fused_available,
             step_stats.StepStats.prefetch)
    if name == "before":
        step_stats.StepStats.wants = lambda self, t: False
    elif name == "torch rows":
        step_stats.fused_available = lambda t: False
    elif name == "fused alone":
        step_stats.StepStats.prefetch = lambda self, values: False
    elif name == "no stats":
        step_stats.StepStats.add = lambda self, t: None

    def restore():
        (step_stats.StepStats.wants, step_stats.StepStats.add, step_stats.fused_available,
         step_stats.StepStats.prefetch) = saved
    return restore


def eager_dump(args):
    """Step time off and on, for each reduction path and each width in ``--d``."""
    import glob
    import json
    for d in args.d:
        model = block_model(d)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(8, 128, d, device="cuda")
        off_ms = None
        for variant in (None,) + VARIANTS:
            tmp = tempfile.mkdtemp(prefix="probe_cuda_")
            restore = _variant(variant) if variant else None
            dbg = PrecisionDebugger(dump_path=tmp, task="statistics", level="L1") if variant else None

            def step():
                if dbg:
                    dbg.start()
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
                enqueued.append(time.perf_counter())
                if dbg:
                    dbg.stop()
                    dbg.step()
            enqueued: list = []
            for _ in range(3):
                step()
            times, host = [], []
            for _ in range(args.steps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                step()
                host.append(enqueued[-1] - t)   # host time to enqueue the step's work (before the flush waits)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            n_sync = syncs_of(step)
            entries = 0
            ms = statistics.median(times) * 1e3
            if dbg:
                dbg.close()
                path = sorted(glob.glob(os.path.join(tmp, "step*", "*", "dump.json")))[-1]
                with open(path) as fh:
                    entries = len(json.load(fh)["data"])
            else:
                off_ms = ms
            if restore:
                restore()
            label = variant or "off"
            ratio = f"x{ms / off_ms:5.2f}" if off_ms else ""
            per = f"{(ms - off_ms) * 1e3 / entries:6.1f} us/entry" if entries and off_ms else ""
            print(f"d={d} eager L1 {label:>10}: {ms:8.2f} ms/step {ratio} {per} (host {statistics.median(host) * 1e3:.2f} "
                  f"ms), {entries} entries/step, host syncs in a step: {n_sync}", flush=True)


def monitor(args):
    model = block_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 128, 768, device="cuda")
    mon = Monitor(output_dir=tempfile.mkdtemp(prefix="probe_mon_"), activations=True, interval=10)
    mon.set_monitor(model, optimizer=opt)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    counts = [syncs_of(step) for _ in range(21)]
    mon.close()
    print(f"monitor (interval 10): host syncs per step over 21 steps: {counts}", flush=True)


def compiled_bitwise():
    import torch._dynamo as dynamo

    def train(root):
        dynamo.reset()
        model, x, y = make_gpt(d=64, n_layers=2)
        model, x, y = model.cuda(), x.cuda(), y.cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = torch.compile(model)
        dbg = PrecisionDebugger(dump_path=root, task="statistics", level="L1") if root else None
        syncs = []
        for s in range(3):
            def step():
                if dbg:
                    dbg.start()
                opt.zero_grad()
                out = run(x)
                torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
                opt.step()
                if dbg:
                    dbg.stop()
                    dbg.step()
            if s == 2:
                syncs.append(syncs_of(step))
            else:
                step()
        if dbg:
            dbg.close()
        return [p.detach().cpu() for p in model.parameters()], syncs
    root = tempfile.mkdtemp(prefix="probe_cc_")
    with_probe, syncs = train(root)
    without, syncs_plain = train(None)
    same = all(torch.equal(a, b) for a, b in zip(with_probe, without))
    import glob
    import json
    with open(sorted(glob.glob(os.path.join(root, "step2", "*", "dump.json")))[0]) as fh:
        names = list(json.load(fh)["data"])
    inside = sorted({n.rsplit(".", 2)[0] for n in names if n.startswith(("Functional.linear", "Functional.gelu",
                                                                          "Functional.layer_norm"))})
    print(f"compiled (inductor/Triton) TinyGPT: training bitwise with and without the debugger: {same}; "
          f"host syncs in a dumped step: {syncs} (without the debugger: {syncs_plain}); APIs from inside the "
          f"graph in the dump: {inside}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--d", type=int, nargs="+", default=[768, 2048], help="model widths of the eager case")
    ap.add_argument("--skip-eager", action="store_true")
    ap.add_argument("--skip-monitor", action="store_true")
    ap.add_argument("--skip-compiled", action="store_true")
    args = ap.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    if not args.skip_eager:
        eager_dump(args)
    if not args.skip_monitor:
        monitor(args)
    if not args.skip_compiled:
        compiled_bitwise()
        subprocess.run([sys.executable, os.path.join(HERE, "compiled.py"), "--device", "cuda",
                        "--steps", str(args.steps), "--batch", "8", "--layers", "2"], check=False)


if __name__ == "__main__":
    main()
