"""run_ut speed on a ~500-API tensor dump of a real model (target: seconds on the CPU).

    python bench/run_ut.py [--blocks 20] [--keep DIR]

Dumps one training step of a small transformer (attention + MLP blocks, task tensor),
then times ``probe.precheck.run_ut`` over it in this process (torch already imported)
and ``probe run-ut`` end to end in a fresh one.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_dump(path, blocks):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(blocks)], torch.nn.Linear(32, 8))
    x, y = torch.randn(4, 16, 32), torch.randint(0, 8, (64,))
    dbg = PrecisionDebugger(task="tensor", dump_path=path)
    dbg.start()
    loss = F.cross_entropy(model(x).reshape(-1, 8), y)
    loss.backward()
    dbg.stop()
    dbg.step()
    return os.path.join(path, "step0", "rank", "dump.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--keep", help="dump and results go here instead of a temporary folder")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="probe_bench_run_ut_")
    dump = make_dump(os.path.join(tmp, "dump"), args.blocks)
    from probe.compare.reader import read_dump
    names = [n for n, _ in read_dump(dump)]
    n_fwd = sum(n.endswith(".forward") for n in names)
    print(f"dump: {n_fwd} API calls ({len(names)} entries, forward + backward)")

    from probe.precheck import run_ut
    t = time.perf_counter()
    res = run_ut(dump, out_dir=os.path.join(tmp, "out1"), progress=False)
    inproc = time.perf_counter() - t
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "probe", "run-ut", "-i", dump, "-o",
                           os.path.join(tmp, "out2")], cwd=ROOT, capture_output=True, text=True)
    cli = time.perf_counter() - t
    print(res.summary_table())
    print(f"run_ut in process: {inproc:6.2f} s  ({1000 * inproc / max(n_fwd, 1):.1f} ms per API call)")
    print(f"probe run-ut CLI : {cli:6.2f} s  (fresh process, torch import included; rc {proc.returncode})")
    if proc.returncode not in (0, 1):
        print(proc.stderr[-2000:])


if __name__ == "__main__":
    main()
