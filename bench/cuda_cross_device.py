"""The diagnosis on two real devices: a CUDA run against a CPU run (a lent GPU).

    python bench/cuda_cross_device.py [--steps 3]

The tests' tiny GPT-2 (d=64, 2 layers, dropout off) trains on the GPU with TF32 matrix
units on and on the CPU in float32, from the same weights and data, both dumped at L1; a
third run on the GPU has the demo's kernel fault in its first step (the first gelu
kernel's output x1.05, ``probe.demo.KernelFault``: Functional.gelu.0.forward). Each
step pair is compared with its diagnosis, in statistics and in tensor mode; printed per
step: the seconds the compare took, the call it names first and its verdict. Asserts
nothing: what a user of two devices sees. Without CUDA it says so and stops.
"""
import argparse
import contextlib
import glob
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from models import make_gpt, train_step  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402
from probe.compare.pair_job import compare_pair  # noqa: E402
from probe.demo import KernelFault  # noqa: E402


def train(device: str, root: str, task: str, steps: int, fault: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = device == "cuda"
    model, x, y = make_gpt(d=64, n_layers=2, seq=16, batch=4)
    model, x, y = model.to(device), x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = PrecisionDebugger(dump_path=root, task=task, level="L1")
    try:
        for step in range(steps):
            with KernelFault() if fault and step == 0 else contextlib.nullcontext():
                dbg.start()
                train_step(model, opt, x, y)
                dbg.stop()
            dbg.step()
    finally:
        dbg.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for task in ("statistics", "tensor"):
        tmp = tempfile.mkdtemp(prefix="probe_xdev_")
        for name, device, fault in (("gpu", "cuda", False), ("cpu", "cpu", False), ("gpu_fault", "cuda", True)):
            train(device, os.path.join(tmp, name), task, args.steps, fault)
        for npu in ("gpu", "gpu_fault"):
            for step in range(args.steps):
                a, = glob.glob(os.path.join(tmp, npu, f"step{step}", "*", "dump.json"))
                b, = glob.glob(os.path.join(tmp, "cpu", f"step{step}", "*", "dump.json"))
                t = time.perf_counter()
                summary = compare_pair(a, b, os.path.join(tmp, f"out_{npu}_{step}")).summary
                print(f"{task:10s} {npu:9s} step {step}: {time.perf_counter() - t:5.2f} s, first "
                      f"{summary['first_divergence']['name']}: {summary['verdict'][:100]}", flush=True)


if __name__ == "__main__":
    main()
