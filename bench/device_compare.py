"""Compare with replay on runs of two devices: seconds per step pair on the tiny GPT-2.

    python bench/device_compare.py [--steps 3]

The "NPU" run trains the tests' tiny GPT-2 (dropout 0.1) on the simulated second device of
``tests/second_device.py`` (its own random stream, TF32-like matrix units), the bench on
the CPU; both dump tensors at L1. Each step pair is compared (alignment, every differing
call re-run on its own inputs, the draws judged by their law, the device's precision
measured, every output written) and timed. Target (issue #30): ~2 s per step pair.
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    import torch
    from real_runs import compare_steps, run
    from second_device import Device
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        bench = run("gpt2", os.path.join(tmp, "bench"), "tensor", steps=args.steps, dropout=0.1)
        npu = run("gpt2", os.path.join(tmp, "npu"), "tensor", steps=args.steps, dropout=0.1,
                  device=Device(tf32=True, seed=7))
        for s in range(args.steps):
            t0 = time.perf_counter()
            _, summary = compare_steps(npu, bench, os.path.join(tmp, "out"), [s])[0]
            dt = time.perf_counter() - t0
            print(f"step {s}: {dt:.2f} s per step pair ({summary['replayed_calls']} calls re-run, "
                  f"{summary['rows']['total']} rows); {summary['verdict'][:90]}")


if __name__ == "__main__":
    main()
