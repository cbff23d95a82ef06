"""``probe demo``: the whole workflow on one machine in a few seconds.

A small transformer block is trained for two steps twice with identical seeds: once as
the "NPU" run (forward under bf16 autocast, the precision an accelerator port often
changes) and once as the "bench" run (fp32). Into the "NPU" run one kernel fault is
injected, below the API level where a real kernel bug sits: a TorchDispatchMode scales the
output of the first ``aten.gelu`` by 1.05. Both runs are dumped at task ``tensor`` and
compared; bf16 rounding is within what the dtype explains, and the console, the workbook
and the HTML page name ``Functional.gelu.0.forward`` as the culprit.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class DemoBlock(nn.Module):
    """Embedding, one attention block with an MLP, a classifier head."""

    def __init__(self, vocab=64, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.norm2 = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        h = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.proj(h))
        x = self.norm2(x + self.fc2(F.gelu(self.fc1(x))))
        return self.head(x)


FAULT_OP = "aten.gelu.default"
FAULT_SCALE = 1.05
FAULT_CALL = "Functional.gelu.0.forward"        # the API call that runs the faulty kernel


class KernelFault:
    """A TorchDispatchMode (built lazily: the import is not free) that scales the output of
    the first ``FAULT_OP`` kernel by ``FAULT_SCALE``, as a wrong kernel would."""

    def __new__(cls):
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Fault(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.seen = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if str(func) == FAULT_OP:
                    self.seen += 1
                    if self.seen == 1:
                        return out * FAULT_SCALE
                return out
        return _Fault()


def _dump_run(dump_path, use_bf16, steps=2, fault=False):
    from probe import PrecisionDebugger, seed_all
    seed_all(1234)
    model = DemoBlock()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (4, 16), generator=g)
    target = torch.randint(0, 64, (4, 16), generator=g)
    debugger = PrecisionDebugger(dump_path=dump_path, task="tensor", level="L1")
    for _ in range(steps):
        debugger.start()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            if fault and _ == 0:
                with KernelFault():
                    logits = model(tokens)
            else:
                logits = model(tokens)
        loss = F.cross_entropy(logits.float().reshape(-1, 64), target.reshape(-1))
        loss.backward()
        opt.step()
        debugger.stop()
        debugger.step()
    debugger.close()
    return loss.item()


def run_demo(out_dir="demo_out"):
    """Dump both runs under ``out_dir`` and compare step 0; return the report paths."""
    from probe.compare import compare
    npu = os.path.join(out_dir, "npu_dump")
    bench = os.path.join(out_dir, "bench_dump")
    print(f"[probe demo] injecting one kernel fault into the NPU run: the first {FAULT_OP} of step 0 "
          f"returns its output x{FAULT_SCALE} (API call {FAULT_CALL}); the compare should name it",
          file=sys.stderr)
    npu_loss = _dump_run(npu, use_bf16=True, fault=True)
    bench_loss = _dump_run(bench, use_bf16=False)
    print(f"loss after 2 steps: NPU (bf16, faulty gelu) {npu_loss:.6f}, bench (fp32) {bench_loss:.6f}")
    params = {
        "npu_json_path": os.path.join(npu, "step0", "rank", "dump.json"),
        "bench_json_path": os.path.join(bench, "step0", "rank", "dump.json"),
        "stack_json_path": os.path.join(npu, "step0", "rank", "stack.json"),
        "is_print_compare_log": True,
    }
    return compare(params, os.path.join(out_dir, "compare"), stack_mode=True)


def run(args):
    """``probe demo`` (its options: ``probe.demo_cli``)."""
    for path in run_demo(args.output) or []:
        print(path)
    return 0
