"""The CUDA paths, measured on a GPU (a lent machine; nothing in the suite needs one).

    python bench/cuda_check.py [--steps 10] [--skip-compiled]

1. eager L1 statistics dump of a GPT-2-sized block: step ms off / on, entries per step, and
   the host synchronisations of a dumped step (``torch.cuda.set_sync_debug_mode``): the
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


def block_model():
    torch.manual_seed(0)
    return nn.Sequential(*[TransformerBlock(d=768, n_heads=12) for _ in range(2)]).cuda()


def eager_dump(args):
    model = block_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 128, 768, device="cuda")
    for on in (False, True):
        tmp = tempfile.mkdtemp(prefix="probe_cuda_")
        dbg = PrecisionDebugger(dump_path=tmp, task="statistics", level="L1") if on else None

        def step():
            if dbg:
                dbg.start()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            if dbg:
                dbg.stop()
                dbg.step()
        for _ in range(3):
            step()
        times = []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        n_sync = syncs_of(step)
        entries = 0
        if dbg:
            dbg.close()
            import glob
            import json
            path = sorted(glob.glob(os.path.join(tmp, "step*", "*", "dump.json")))[-1]
            with open(path) as fh:
                entries = len(json.load(fh)["data"])
        print(f"eager L1 {'on ' if on else 'off'}: {statistics.median(times) * 1e3:8.2f} ms/step, "
              f"{entries} entries/step, host syncs in a step: {n_sync}", flush=True)


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
    ap.add_argument("--skip-compiled", action="store_true")
    args = ap.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    eager_dump(args)
    monitor(args)
    if not args.skip_compiled:
        compiled_bitwise()
        subprocess.run([sys.executable, os.path.join(HERE, "compiled.py"), "--device", "cuda",
                        "--steps", str(args.steps), "--batch", "8", "--layers", "2"], check=False)


if __name__ == "__main__":
    main()
