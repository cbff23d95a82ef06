"""Monitor overhead: training-step time with the monitor off and on.

    python bench/monitor.py [--quick] [--tensorboard] [--floor]

For the GPT-2 block and the 4-block d=256 model of bench/overhead.py (trained with AdamW),
prints the median step time off and on and their ratio for: weights + gradients +
optimizer state every step; the same with activations every step; everything every 10
steps. Timing as bench/overhead.py: one model trained in alternating blocks of steps with
the monitor off and on (a new Monitor per "on" block, closed after it), one intra-op
thread, the first step of each block not timed, medians of steady-state steps (with
an interval, the median is a step that is not logged: the "mean ratio" column is what a
run pays on average, logged steps included, and noisier). Outputs:
CSV and alerts.jsonl (``--tensorboard`` adds a row with TensorBoard too). A measurement,
not a test: nothing asserts. Targets (issue 24): x1.05, x1.15, x1.02.
"""
import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import overhead  # noqa: E402
from overhead import train_step  # noqa: E402

from probe import Monitor  # noqa: E402

_CSV = ["csv", "alerts"]   # TensorBoard is the default where installed: timed on its own (--tensorboard)
CONFIGS = [
    ("weights+grads+optimizer, every step", dict(activations=False, formats=_CSV), 1.05),
    ("+ update ratio, every step", dict(activations=False, update_ratio=True, formats=_CSV), None),
    ("+ activations, every step", dict(activations=True, formats=_CSV), 1.15),
    ("all, every 10 steps", dict(activations=True, update_ratio=True, interval=10, formats=_CSV), 1.02),
]


def make(model_name, seed=1234):
    """bench/overhead.py's model, trained with AdamW (what the monitor's optimizer state needs)."""
    return overhead.make(model_name, seed, optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))


def time_monitor(model_name, options, blocks, block=21):
    """Median step times (s) off and on; ``blocks`` blocks per side of ``block`` steps.

    A block of 21 steps times 20: with interval=10, two of them are logged steps, the
    share a long run has."""
    torch.set_num_threads(1)
    model, opt, x, y = make(model_name)
    out_root = tempfile.mkdtemp(prefix="probe_monitor_bench_")
    times = ([], [])
    gc.collect()
    try:
        for b in range(2 * blocks):
            on = b % 2
            mon = None
            if on:
                mon = Monitor(output_dir=os.path.join(out_root, str(b)), **options)
                mon.set_monitor(model, optimizer=opt)
            for k in range(block):
                t0 = time.perf_counter()
                train_step(model, opt, x, y)
                if k:
                    times[on].append(time.perf_counter() - t0)
            if mon is not None:
                mon.close()
        off, on = (t[block - 1:] for t in times)   # the first block of each side is warm-up
        return statistics.median(off), statistics.median(on), statistics.mean(off), statistics.mean(on)
    finally:
        shutil.rmtree(out_root, ignore_errors=True)


def time_floor(model_name, blocks, block=21, activations=False, outputs=False):
    """The least any monitor of weights, gradients (before and after the reduction) and
    Adam's state must pay per step: one ``torch._foreach_norm`` over each of those five
    tensor lists and one host transfer of all the norms, nothing else (no names, hooks,
    files). With ``activations``: also the norm, max|x| and mean of every Linear's output
    (forward hooks). With ``outputs``: also what the issue asks of every logged step past
    the numbers, at its least: a robust spike test of each series (median and MAD over a
    20-step window, numpy) and one CSV line per parameter, flushed. Same timing as
    ``time_monitor``."""
    import csv

    import numpy as np
    torch.set_num_threads(1)
    model, opt, x, y = make(model_name)
    params = [p for p in model.parameters() if p.requires_grad]
    handles = []
    history = []
    sink = tempfile.TemporaryFile("w+", newline="")
    rows = csv.writer(sink)

    def extra_work():
        grads = [p.grad for p in params]
        state = [opt.state[p] for p in params]
        norms = [torch._foreach_norm(params), torch._foreach_norm(grads), torch._foreach_norm(grads),
                 torch._foreach_norm([st["exp_avg"] for st in state]),
                 torch._foreach_norm([st["exp_avg_sq"] for st in state])]
        acts = [t for h in handles for t in h.seen]
        values = torch.stack([n for ns in norms for n in ns] + acts).tolist()
        for h in handles:
            h.seen.clear()
        if outputs:
            history.append(values)
            del history[:-20]
            h = np.asarray(history)
            med = np.median(h, axis=0)
            mad = np.median(np.abs(h - med), axis=0)
            _ = np.abs(np.asarray(values) - med) > 10 * np.maximum(1.4826 * mad, 0.02 * np.abs(med))
            n = len(params)
            rows.writerows([len(history), 0, i] + values[i::n] for i in range(n))
            sink.flush()

    class Act:
        def __init__(self):
            self.seen = []

        def __call__(self, module, inputs, out):
            o = out.detach()
            self.seen.extend((torch.linalg.vector_norm(o), o.abs().amax(), o.mean()))

    times = ([], [])
    for b in range(2 * blocks):
        on = b % 2
        if on and activations:
            for m in model.modules():
                if isinstance(m, torch.nn.Linear):
                    h = Act()
                    h.handle = m.register_forward_hook(h)
                    handles.append(h)
        for k in range(block):
            t0 = time.perf_counter()
            train_step(model, opt, x, y)
            if on:
                extra_work()
            if k:
                times[on].append(time.perf_counter() - t0)
        for h in handles:
            h.handle.remove()
        handles.clear()
    sink.close()
    off, on = (t[block - 1:] for t in times)
    return statistics.median(off), statistics.median(on)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floor", action="store_true", help="time only the least work any such monitor does")
    ap.add_argument("--quick", action="store_true", help="fewer blocks")
    ap.add_argument("--tensorboard", action="store_true", help="also time the TensorBoard output")
    ap.add_argument("--blocks", type=int, default=None, help="blocks per side (default 6, --quick 3)")
    ap.add_argument("--only", default=None, help="run only the configurations whose label contains this")
    args = ap.parse_args()
    blocks = args.blocks or (3 if args.quick else 6)
    configs = list(CONFIGS)
    if args.tensorboard:
        configs.append(("+ activations + TensorBoard, every step",
                        dict(activations=True, formats=["csv", "alerts", "tensorboard"]), None))
    if args.only:
        configs = [c for c in configs if args.only in c[0]]
    if args.floor:
        print(f"{'model':<24}{'floor':<56}{'off ms':>9}{'on ms':>9}{'ratio':>7}")
        for model_name in ("gpt2 block d256 b4x64", "mid d256 4blk b64"):
            for acts in (False, True):
                for outs in (False, True):
                    off, on = time_floor(model_name, blocks, activations=acts, outputs=outs)
                    label = ("5 foreach norms + 1 transfer" + (" + Linear outputs" if acts else "")
                             + (" + spike test + CSV" if outs else ""))
                    print(f"{model_name:<24}{label:<56}{off * 1e3:>9.2f}{on * 1e3:>9.2f}{on / off:>7.3f}",
                          flush=True)
        return
    print(f"{'model':<24}{'monitor':<42}{'off ms':>9}{'on ms':>9}{'ratio':>7}{'target':>8}{'mean ratio':>11}")
    for model_name in ("gpt2 block d256 b4x64", "mid d256 4blk b64"):
        for label, options, target in configs:
            off, on, mean_off, mean_on = time_monitor(model_name, options, blocks)
            tgt = f"x{target:.2f}" if target else "-"
            print(f"{model_name:<24}{label:<42}{off * 1e3:>9.2f}{on * 1e3:>9.2f}{on / off:>7.3f}{tgt:>8}"
                  f"{mean_on / mean_off:>11.3f}", flush=True)


if __name__ == "__main__":
    main()
