"""Real training runs for the diagnosis tests: several optimizer steps, every step dumped.

A run builds a tiny HF GPT-2 / Llama from a config (dropout 0) or the conv net with
BatchNorm, and makes N optimizer steps on fresh batches, dumping each step with
``PrecisionDebugger``. The "NPU" side runs in bf16 CPU autocast or fp32; the bench in fp32.

Faults are injected *below* the API level by a ``TorchDispatchMode`` (``KernelFault``):
the n-th call of one aten op at one step has its result scaled, offset or one element
poked. The debugger's hooks see the API call, its inputs and its (faulty) outputs, as on
a device whose kernel is wrong; the call sequence is the same as a clean run's.

The culprit a test expects is derived from the fault alone: the faulted aten op is
chosen so that exactly one API reaches it (``API_OF``), its calls per step are counted by
the fault itself, and the API's n-th call is named as the dump numbers calls (forward:
the n-th call; backward: autograd runs the calls in reverse, so the n-th backward kernel
belongs to the (count - 1 - n)-th forward call). ``check_mapping`` verifies on the dump
that the API has exactly as many calls as the aten op ran.
"""
from __future__ import annotations

import glob
import json
import os
from collections import Counter, defaultdict

import torch
import torch.nn.functional as F
from models import ConvNet
from torch.utils._python_dispatch import TorchDispatchMode

SEQ, BATCH, VOCAB, HIDDEN, LAYERS = 16, 2, 128, 64, 2

# aten op -> (the one API that runs it, the direction of the dump entry it belongs to)
API_OF = {
    "tanh.default": ("Torch.tanh", "forward"),                 # GPT-2's gelu_new
    "tanh_backward.default": ("Torch.tanh", "backward"),
    "silu.default": ("Functional.silu", "forward"),            # Llama's MLP act
    "silu_backward.default": ("Functional.silu", "backward"),
    "relu.default": ("Functional.relu", "forward"),            # conv net
    "threshold_backward.default": ("Functional.relu", "backward"),
    "native_layer_norm.default": ("Functional.layer_norm", "forward"),
    "addcdiv_.default": ("Tensor.addcdiv_", "forward"),        # for-loop AdamW: one per parameter
    "_foreach_addcdiv_.ScalarList": ("Torch._foreach_addcdiv_", "forward"),  # foreach AdamW
    "_fused_adamw_.default": ("Torch._fused_adamw_", "forward"),  # fused AdamW: one call a step
    "native_batch_norm.default": ("Functional.batch_norm", "forward"),
    "addmm.default": ("Torch.addmm", "forward"),               # GPT-2's Conv1D projections
    "bmm.default": ("Torch.matmul", "forward"),                # GPT-2's eager attention scores
    # fused attention (HF's "sdpa"): one API call runs the whole kernel
    "_scaled_dot_product_flash_attention_for_cpu.default": ("Functional.scaled_dot_product_attention", "forward"),
    "_scaled_dot_product_flash_attention_for_cpu_backward.default":
        ("Functional.scaled_dot_product_attention", "backward"),
}
# the forward kernel whose calls number a backward kernel's API calls
FORWARD_OF = {"tanh_backward.default": "tanh.default", "silu_backward.default": "silu.default",
              "threshold_backward.default": "relu.default",
              "_scaled_dot_product_flash_attention_for_cpu_backward.default":
                  "_scaled_dot_product_flash_attention_for_cpu.default"}


def gpt2(seed=0, dropout=0.0, attn="eager"):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=4,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    cfg._attn_implementation = attn
    return GPT2LMHeadModel(cfg)


def llama(seed=0, dropout=0.0, attn="eager"):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=SEQ, attention_dropout=dropout)
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg)


def convnet(seed=0, dropout=0.0, attn=None):
    torch.manual_seed(seed)
    return ConvNet()


MODELS = {"gpt2": gpt2, "llama": llama, "conv": convnet}


def _op_name(func) -> str:
    return f"{func.overloadpacket.__name__}.{func._overloadname}"


class KernelFault(TorchDispatchMode):
    """Make the ``nth`` call (0-based, counted per step) of aten ``op`` at ``step`` wrong.

    how: "scale" multiplies the result by ``factor``; "offset" adds ``factor`` x its standard
    deviation; "poke" adds ``factor`` x its largest magnitude to one element. In-place ops
    are faulted in their first argument (for a foreach op, its ``index``-th tensor).
    Every aten op's calls are counted per step (``counts``) so that the API call that
    contained the faulted kernel can be named (``expected``).
    """

    def __init__(self, op, nth, step, how="scale", factor=1.02, index=0):
        super().__init__()
        self.op, self.nth, self.step, self.how, self.factor, self.index = op, nth, step, how, factor, index
        self.cur_step = -1
        self.counts: dict[int, Counter] = defaultdict(Counter)
        self.applied = False

    def new_step(self, s):
        self.cur_step = s

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = _op_name(func)
        counts = self.counts[self.cur_step]
        k = counts[name]
        counts[name] += 1
        if self.cur_step == self.step and name == self.op and k == self.nth:
            self._hit(out if out is not None else args[0])
        return out

    def _hit(self, out):
        t = out[self.index] if isinstance(out, (tuple, list)) else out
        with torch.no_grad():
            if self.how == "scale":
                t.mul_(self.factor)
            elif self.how == "offset":
                t.add_(self.factor * t.float().std().to(t.dtype))
            elif self.how == "poke":
                t.view(-1)[3] += self.factor * t.float().abs().max().to(t.dtype)
            else:
                raise ValueError(f"KernelFault how={self.how!r}: scale, offset or poke")
        self.applied = True

    def expected(self) -> str:
        """The dump entry of the API call that ran the faulted kernel."""
        api, direction = API_OF[self.op]
        n = self.nth
        if direction == "backward":
            n = self.counts[self.step][FORWARD_OF[self.op]] - 1 - self.nth
        return f"{api}.{n}.{direction}"

    def check_mapping(self, npu_root) -> None:
        """The API named in API_OF has as many calls in the dump as the aten op ran, and the
        n-th of them in the dump's (execution) order is the one ``expected`` names."""
        api, direction = API_OF[self.op]
        data = load_data(npu_root, self.step)
        dumped = [e for e in data if e.startswith(api + ".") and e.endswith("." + direction)]
        ran = self.counts[self.step][self.op]
        assert len(dumped) == ran, f"{api} {direction}: {len(dumped)} dumped calls, {ran} {self.op} kernels"
        assert dumped[self.nth] == self.expected(), (dumped, self.nth, self.expected())


def _batch(kind, g):
    if kind == "conv":
        return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, x


OPTIMIZERS = {    # the for-loop implementations are CPU's default; foreach / fused are CUDA's
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=False),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=False),
}


def run(kind, root, task="tensor", steps=3, bf16=False, fault=None, opt="adamw", device=None,
        dropout=0.0, attn="eager", **debugger_kw):
    """N dumped optimizer steps of model ``kind`` under ``fault`` (a KernelFault or None), on
    ``device`` (a ``second_device.Device``, or None: the CPU itself)."""
    import contextlib

    from probe import PrecisionDebugger
    model = MODELS[kind](dropout=dropout, attn=attn)
    g = torch.Generator().manual_seed(1)
    o = OPTIMIZERS[opt](model.parameters())
    dbg = PrecisionDebugger(dump_path=str(root), task=task, level="L1", **debugger_kw)
    fm = fault or KernelFault("none", 0, -1)
    try:
        with device or contextlib.nullcontext(), fm:
            for s in range(steps):
                fm.new_step(s)
                x, y = _batch(kind, g)
                dbg.start()
                o.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = F.cross_entropy(model(x), y) if kind == "conv" else \
                        model(input_ids=x, labels=y).loss
                loss.backward()
                o.step()
                dbg.stop()
                dbg.step()
    finally:
        dbg.close()
    return str(root)


def dump_json(root, step) -> str:
    found = glob.glob(os.path.join(str(root), f"step{step}", "*", "dump.json"))
    assert len(found) == 1, f"step{step} of {root}: {found}"
    return found[0]


def load_data(root, step) -> dict:
    with open(dump_json(root, step), encoding="utf-8") as fh:
        return json.load(fh)["data"]


def compare_steps(npu_root, bench_root, out, steps=3):
    """Compare step by step (``steps``: a count or the step numbers); per step the output
    paths and the parsed compare_summary.json."""
    from probe.compare import compare
    res = []
    for s in (range(steps) if isinstance(steps, int) else steps):
        paths = compare({"npu_json_path": dump_json(npu_root, s), "bench_json_path": dump_json(bench_root, s),
                         "is_print_compare_log": False}, os.path.join(str(out), f"step{s}"))
        summary = [p for p in paths if os.path.basename(p).startswith("compare_summary")]
        with open(summary[-1], encoding="utf-8") as fh:
            res.append((paths, json.load(fh)))
    return res
