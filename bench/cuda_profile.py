"""Where a dumped eager step's time goes on CUDA: cProfile of a few dumped steps of the
2-block d=768 transformer of bench/cuda_check.py (top functions by own time). A measurement."""
import cProfile
import os
import pstats
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_check import block_model  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402


def main():
    model = block_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 128, 768, device="cuda")
    dbg = PrecisionDebugger(dump_path=tempfile.mkdtemp(), task="statistics", level="L1")

    def step():
        dbg.start()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        dbg.stop()
        dbg.step()
        torch.cuda.synchronize()
    for _ in range(3):
        step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        step()
    prof.disable()
    dbg.close()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
