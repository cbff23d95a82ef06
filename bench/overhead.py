"""Dump overhead: training-step time with dumping off and on, for probe and msprobe.

    python bench/overhead.py [--quick] [--no-msprobe] [--rss-steps N]

Prints one row per (model, level, task, disk): entries per step, step ms off / on, the
ratio, the per-entry cost ((on - off) / entries) and, when mindstudio-probe is installed
in /opt/msref, msprobe's numbers for the same run and probe's overhead over msprobe's.
msprobe runs in a subprocess of its own venv (``/opt/msref/bin/python bench/overhead.py
--msprobe-child ...``); it is never imported here. Tensor-task rows are run on the normal
temp folder and on /dev/shm (when present) to separate disk cost from probe's own.
Finally, RSS at step 10 and at the last of many dumped steps of a small model (memory must
stay flat). Timings are medians of per-step times after warm-up steps, time.perf_counter.
This is a measurement, not a test: nothing here asserts.

Only torch is imported at module level, so the msprobe child can import this file.
"""
import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _msprobe_python():
    """An interpreter that has msprobe: $MSPROBE_PYTHON, the /opt/msref venv, or this one."""
    import importlib.util
    for candidate in (os.environ.get("MSPROBE_PYTHON"), "/opt/msref/bin/python"):
        if candidate and os.path.exists(candidate):
            return candidate
    return sys.executable if importlib.util.find_spec("msprobe") is not None else None


MSREF_PYTHON = _msprobe_python()
LEVELS = ("L1", "L0", "mix")  # rows are (model, level, task, disk)


# ---- models -----------------------------------------------------------------------
# The "mid model" is the msprobe fixtures' tiny_model (a copy lives in tests/fixtures/dump).
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "dump"))
from tiny_model import TinyNet  # noqa: E402


class GPT2Block(nn.Module):
    """GPT-2 block: LN, causal multi-head attention (qkv split, SDPA), residual, LN, GELU MLP."""

    def __init__(self, d=256, n_heads=4, n_cls=10):
        super().__init__()
        self.h = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.head = nn.Linear(d, n_cls)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return F.softmax(self.head(x.mean(dim=1)), dim=-1)


# name -> (builder, input shape); all end in softmax over 10 classes, loss as the fixtures' run
MODELS = {
    "mid d256 2blk b8": (lambda: TinyNet(d=256, n_blocks=2), (8, 256)),
    "mid d256 4blk b64": (lambda: TinyNet(d=256, n_blocks=4), (64, 256)),
    "gpt2 block d256 b4x64": (lambda: GPT2Block(256), (4, 64, 256)),
    "small d32 2blk b8": (lambda: TinyNet(d=32, n_blocks=2), (8, 32)),
}


def make(name, seed=1234, optimizer=None):
    """(model, optimizer, inputs, targets) of ``name``; ``optimizer(params)`` makes the
    optimizer (default: SGD, lr 0.01, as the fixtures' script)."""
    torch.manual_seed(seed)
    build, shape = MODELS[name]
    model = build()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(*shape, generator=g)
    y = torch.randint(0, 10, (shape[0],), generator=g)
    opt = optimizer(model.parameters()) if optimizer else torch.optim.SGD(model.parameters(), lr=0.01)
    return model, opt, x, y


def train_step(model, opt, x, y):
    """The fixtures' step: forward, NLL of log-probs, backward, SGD."""
    opt.zero_grad()
    probs = model(x)
    loss = F.nll_loss(torch.log(probs + 1e-9), y)
    loss.backward()
    opt.step()
    return loss


# ---- timing -----------------------------------------------------------------------
def time_steps(model_name, debugger_factory, warmup, steps, level="L1", block=10):
    """Median step times (s) off and on, of one model trained in blocks of ``block`` steps
    with dumping off and on in turn.

    Blocks in turn make load from other processes hit both sides alike, and each side is
    timed in its own steady state: steps interleaved one by one, or two model copies,
    would evict each other's data from the caches, and so would a ``gc.collect()``
    between steps (the step after one runs up to twice as slow on the mid model), hiding
    the dump's cost in a slower baseline. The first step of each block is not timed, and
    the garbage collector runs as it would in training. One intra-op thread (in both
    processes): on a shared CPU, thread hand-offs otherwise swamp the dump's own cost.
    Returns (off, on, debugger).
    """
    torch.set_num_threads(1)
    model, opt, x, y = make(model_name)
    dbg = debugger_factory()
    module = model if level in ("L0", "mix") else None
    times = ([], [])   # off, on
    gc.collect()
    per_side = -(-(warmup + steps) // (block - 1))
    for b in range(2 * per_side):
        on = b % 2
        for k in range(block):
            t0 = time.perf_counter()
            if on:
                dbg.start(module)
                train_step(model, opt, x, y)
                dbg.stop()
                dbg.step()
            else:
                train_step(model, opt, x, y)
            if k:
                times[on].append(time.perf_counter() - t0)
    off, on = (t[warmup:] for t in times)
    return statistics.median(off), statistics.median(on), dbg


def count_entries(dump_path):
    """Entries in dump.json of the last step folder (any rank/proc dir)."""
    steps = sorted((d for d in os.listdir(dump_path) if d.startswith("step")), key=lambda d: int(d[4:]))
    step_dir = os.path.join(dump_path, steps[-1])
    rank = [d for d in os.listdir(step_dir) if not d.startswith(".")][0]
    with open(os.path.join(step_dir, rank, "dump.json")) as f:
        return len(json.load(f)["data"])


def probe_row(model_name, level, task, root, warmup, steps):
    from probe import PrecisionDebugger
    dump_path = tempfile.mkdtemp(prefix="probe_bench_", dir=root)
    try:
        off, on, dbg = time_steps(model_name, lambda: PrecisionDebugger(dump_path=dump_path, task=task, level=level),
                                  warmup, steps, level)
        dbg.close()
        return off, on, count_entries(dump_path)
    finally:
        shutil.rmtree(dump_path, ignore_errors=True)


def msprobe_row(model_name, level, task, root, warmup, steps):
    """Run the same measurement under msprobe in its own venv; None when unavailable or failed."""
    if MSREF_PYTHON is None:
        return None
    dump_path = tempfile.mkdtemp(prefix="msprobe_bench_", dir=root)
    try:
        cmd = [MSREF_PYTHON, os.path.abspath(__file__), "--msprobe-child", "--model", model_name, "--level", level,
               "--task", task, "--dump-path", dump_path, "--warmup", str(warmup), "--steps", str(steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"  (msprobe run failed for {model_name}/{task}: {proc.stderr.strip().splitlines()[-1:]})")
            return None
        res = json.loads(lines[-1][len("RESULT "):])
        return res["off"], res["on"], res["entries"]
    finally:
        shutil.rmtree(dump_path, ignore_errors=True)


def msprobe_child(args):
    """Runs inside /opt/msref: time the same model off and under msprobe; print one RESULT line."""
    from msprobe.pytorch import PrecisionDebugger
    cfg = {"task": args.task, "dump_path": args.dump_path, "rank": [], "step": [], "level": args.level,
           "async_dump": False, args.task: {"scope": [], "list": [], "data_mode": ["all"]}}
    cfg_path = os.path.join(args.dump_path, "msprobe_config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    off, on, _ = time_steps(args.model, lambda: PrecisionDebugger(config_path=cfg_path), args.warmup, args.steps,
                            args.level)
    print("RESULT " + json.dumps({"off": off, "on": on, "entries": count_entries(args.dump_path)}), flush=True)


# ---- memory -------------------------------------------------------------------------
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def rss_run(n_steps, root):
    from probe import PrecisionDebugger
    dump_path = tempfile.mkdtemp(prefix="probe_rss_", dir=root)
    try:
        model, opt, x, y = make("small d32 2blk b8")
        dbg = PrecisionDebugger(dump_path=dump_path, task="statistics")
        marks = {}
        for i in range(1, n_steps + 1):
            dbg.start()
            train_step(model, opt, x, y)
            dbg.stop()
            dbg.step()
            if i in (10, n_steps // 2, n_steps):
                gc.collect()
                marks[i] = rss_mib()
        dbg.close()
        return marks
    finally:
        shutil.rmtree(dump_path, ignore_errors=True)


# ---- main ----------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps, one big model")
    ap.add_argument("--no-msprobe", action="store_true", help="skip msprobe even if installed")
    ap.add_argument("--rss-steps", type=int, default=None, help="dumped steps for the RSS check (default 1000)")
    ap.add_argument("--msprobe-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--level", default="L1", help=argparse.SUPPRESS)
    ap.add_argument("--task", default="statistics", help=argparse.SUPPRESS)
    ap.add_argument("--dump-path", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=10, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.msprobe_child:
        return msprobe_child(args)

    sys.path.insert(0, ROOT)
    warmup, steps = (2, 8) if args.quick else (3, 20)
    models = ["mid d256 2blk b8", "gpt2 block d256 b4x64"] if args.quick else \
        ["mid d256 2blk b8", "mid d256 4blk b64", "gpt2 block d256 b4x64"]
    disk = tempfile.gettempdir()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with_ms = not args.no_msprobe and MSREF_PYTHON is not None
    rows = []
    for model_name in models:
        for level in LEVELS:
            for task in ("statistics", "tensor"):
                roots = [("disk", disk)] + ([("shm", shm)] if task == "tensor" and shm else [])
                for where, root in roots:
                    off, on, n = probe_row(model_name, level, task, root, warmup, steps)
                    ms = msprobe_row(model_name, level, task, root, warmup, steps) if with_ms else None
                    rows.append((model_name, level, task, where, n, off, on, ms))
                    _print_row(rows[-1], header=len(rows) == 1)

    n_rss = args.rss_steps or (200 if args.quick else 1000)
    marks = rss_run(n_rss, shm or disk)
    print()
    print("RSS, small model, statistics, dumping every step: " +
          ", ".join(f"step {k}: {v:.1f} MiB" for k, v in sorted(marks.items())) +
          f"  (growth {marks[n_rss] - marks[10]:+.1f} MiB)")


def _print_row(row, header=False):
    model_name, level, task, where, n, off, on, ms = row
    if header:
        print(f"{'model':<24}{'lvl':<4}{'task':<11}{'disk':<5}{'entries':>8}{'off ms':>9}{'on ms':>9}{'ratio':>7}"
              f"{'us/entry':>9} | {'ms entries':>10}{'ms off':>8}{'ms on':>9}{'ratio':>7}{'us/entry':>9}{'probe/ms':>9}")
    per = (on - off) / n * 1e6 if n else float("nan")
    line = (f"{model_name:<24}{level:<4}{task:<11}{where:<5}{n:>8}{off * 1e3:>9.2f}{on * 1e3:>9.2f}"
            f"{on / off:>7.2f}{per:>9.1f} | ")
    if ms is not None:
        m_off, m_on, m_n = ms
        m_per = (m_on - m_off) / m_n * 1e6 if m_n else float("nan")
        rel = (on - off) / (m_on - m_off) if m_on > m_off else float("nan")
        line += f"{m_n:>10}{m_off * 1e3:>8.2f}{m_on * 1e3:>9.2f}{m_on / m_off:>7.2f}{m_per:>9.1f}{rel:>9.2f}"
    else:
        line += f"{'-':>10}"
    print(line, flush=True)


if __name__ == "__main__":
    main()
