"""Real training runs for the diagnosis tests: several optimizer steps, every step dumped.

A run builds a tiny HF GPT-2 / Llama from a config (dropout 0), the conv net with
BatchNorm or a top-2 MoE, and makes N optimizer steps on fresh batches, dumping each step
with ``PrecisionDebugger``. The "NPU" side runs in bf16 (or fp16) CPU autocast or fp32;
the bench in fp32. ``recipe`` adds training features (a GradScaler, gradient
accumulation, activation checkpointing, gradient clipping, an LR schedule).

Faults are injected *below* the API level by a ``TorchDispatchMode`` (``KernelFault``):
the n-th call of one aten op at one step has its result scaled, offset, one element
poked, replaced by a stale output or recomputed as a faulty kernel would (a bf16
accumulator, a softmax without max subtraction in fp16). The debugger's hooks see the API
call, its inputs and its (faulty) outputs, as on a device whose kernel is wrong; the call
sequence is the same as a clean run's.

The culprit a test expects is derived from the fault alone: the faulted aten op is
chosen so that exactly one API reaches it (``API_OF``), its calls per step are counted by
the fault itself, and the API's n-th call is named as the dump numbers calls (forward:
the n-th call the program made, recomputes in backward apart; backward: autograd runs a
graph's calls in reverse, so a backward kernel belongs to the latest forward call not yet
given its backward). ``check_mapping`` verifies on the dump that the API has exactly as
many calls as the aten op ran, and that the named one is where the fault says.
"""
from __future__ import annotations

import glob
import json
import math
import os
from collections import Counter, defaultdict

import torch
import torch.nn.functional as F
from models import ConvNet, TinyMoE
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
    "_softmax.default": ("Functional.softmax", "forward"),     # eager attention's probabilities
    "mean.dim": ("Tensor.mean", "forward"),                    # Llama's RMSNorm variance
    "rsqrt.default": ("Functional.rms_norm", "forward"),       # llama_rms: F.rms_norm's 1/RMS (CPU decomposes it)
    "linalg_vector_norm.default": ("Torch.linalg.vector_norm", "forward"),  # clip_grad_norm_'s total
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


def llama_rms(seed=0, dropout=0.0, attn="eager"):
    """Llama whose RMSNorms are ``torch.nn.RMSNorm`` (one ``F.rms_norm`` API call each, as a
    fused kernel is on a device; HF's own is composed of pow, mean, rsqrt and mul)."""
    model = llama(seed, dropout, attn)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child).__name__ == "LlamaRMSNorm":
                norm = torch.nn.RMSNorm(child.weight.shape[0], eps=child.variance_epsilon)
                with torch.no_grad():
                    norm.weight.copy_(child.weight)
                setattr(module, name, norm)
    return model


def convnet(seed=0, dropout=0.0, attn=None):
    torch.manual_seed(seed)
    return ConvNet()


def moe(seed=0, dropout=0.0, attn=None):
    torch.manual_seed(seed)
    return TinyMoE(vocab=VOCAB, d=HIDDEN, n_layers=LAYERS, near_tie=1e-2)   # near-tie routes


MODELS = {"gpt2": gpt2, "llama": llama, "llama_rms": llama_rms, "conv": convnet, "moe": moe}


def _op_name(func) -> str:
    return f"{func.overloadpacket.__name__}.{func._overloadname}"


def _bf16_accumulated(op, args, kwargs, out):
    """``op`` (sum.dim_IntList, mean.dim, linalg_vector_norm.default with ord 2) of ``args``
    with the terms added one by one into a bf16 accumulator, shaped and typed as ``out``."""
    x = args[0].float()
    if op == "linalg_vector_norm.default":
        assert float(args[1] if len(args) > 1 else kwargs.get("ord", 2)) == 2.0, "a 2-norm only"
        x, dims = x * x, (args[2] if len(args) > 2 else kwargs.get("dim"))
    else:
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    dims = list(range(x.dim())) if not dims else [d % x.dim() for d in dims]
    kept = [d for d in range(x.dim()) if d not in dims]
    terms = x.permute(kept + dims).reshape(-1 if kept else 1, math.prod(x.shape[d] for d in dims))
    acc = torch.zeros(terms.shape[0], dtype=torch.bfloat16)
    for j in range(terms.shape[1]):
        acc = acc + terms[:, j].to(torch.bfloat16)     # each partial sum rounded to bf16
    r = acc.float()
    if op == "mean.dim":
        r = r / terms.shape[1]
    elif op == "linalg_vector_norm.default":
        r = r.sqrt()
    return r.reshape(out.shape).to(out.dtype)


class KernelFault(TorchDispatchMode):
    """Make the ``nth`` call (0-based, counted per step) of aten ``op`` at ``step`` wrong.

    how: "scale" multiplies the result by ``factor``; "offset" adds ``factor`` x its standard
    deviation; "poke" adds ``factor`` x its largest magnitude to one element; "stale" gives
    the output of the op's previous call of the same shape (zeros where there is none: a
    kernel that left its output buffer as it was); "bf16_acc" recomputes a reduction
    (sum, mean, a vector 2-norm) with a bf16 accumulator, adding term by term;
    "fp16_softmax" recomputes a softmax in fp16 without subtracting the row's max first
    (exp(x) / sum(exp(x))); "overflow" recomputes a softmax without max subtraction whose
    exponent is offset by ``factor`` (exp overflows to inf, inf / inf is NaN); "bf16_stats"
    recomputes a layer_norm whose mean and variance are taken in bf16. In-place ops are
    faulted in their first argument (for a foreach op, its ``index``-th tensor). Every aten op's calls are counted per step (``counts``) so
    that the API call that contained the faulted kernel can be named (``expected``).
    """

    def __init__(self, op, nth, step, how="scale", factor=1.02, index=0):
        super().__init__()
        self.op, self.nth, self.step, self.how, self.factor, self.index = op, nth, step, how, factor, index
        self.cur_step = -1
        self.counts: dict[int, Counter] = defaultdict(Counter)
        self.applied = False
        self.previous: dict = {}     # "stale": shape -> the op's last output of that shape
        # per step, the calls of the faulted op and of the forward op it belongs to, in order:
        # (op, whether autograd's engine ran it: a checkpoint's recompute in backward)
        self.events: dict[int, list] = defaultdict(list)

    def new_step(self, s):
        self.cur_step = s

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = _op_name(func)
        counts = self.counts[self.cur_step]
        k = counts[name]
        counts[name] += 1
        if name == self.op or name == FORWARD_OF.get(self.op):
            self.events[self.cur_step].append((name, torch._C._current_autograd_node() is not None))
        if self.cur_step == self.step and name == self.op and k == self.nth:
            self._hit(out if out is not None else args[0], args, kwargs or {})
        elif self.how == "stale" and name == self.op:
            t = out[self.index] if isinstance(out, (tuple, list)) else (out if out is not None else args[0])
            self.previous[tuple(t.shape)] = t.detach().clone()
        return out

    def _hit(self, out, args, kwargs):
        t = out[self.index] if isinstance(out, (tuple, list)) else out
        with torch.no_grad():
            if self.how == "scale":
                t.mul_(self.factor)
            elif self.how == "offset":
                t.add_(self.factor * t.float().std().to(t.dtype))
            elif self.how == "poke":
                t.view(-1)[3] += self.factor * t.float().abs().max().to(t.dtype)
            elif self.how == "stale":
                old = self.previous.get(tuple(t.shape))
                t.copy_(old if old is not None else torch.zeros_like(t))
            elif self.how == "bf16_acc":
                t.copy_(_bf16_accumulated(self.op, args, kwargs, t))
            elif self.how == "fp16_softmax":
                x, dim = args[0], args[1]
                e = torch.exp(x.to(torch.float16))
                t.copy_(e / e.sum(dim, keepdim=True))
            elif self.how == "overflow":
                x, dim = args[0], args[1]
                e = torch.exp(x.float() + self.factor)     # no max subtracted: exp overflows to inf
                t.copy_(e / e.sum(dim, keepdim=True))      # inf / inf: NaN
            elif self.how == "bf16_stats":
                x, shape, w, b = args[0], args[1], args[2], args[3]
                eps = args[4] if len(args) > 4 else 1e-5
                dims = tuple(range(x.dim() - len(shape), x.dim()))
                xb = x.to(torch.bfloat16)
                mean = xb.mean(dims, keepdim=True).float()
                var = ((xb - mean.to(torch.bfloat16)) ** 2).mean(dims, keepdim=True).float()
                y = (x.float() - mean) * torch.rsqrt(var + eps)
                if w is not None:
                    y = y * w.float()
                if b is not None:
                    y = y + b.float()
                t.copy_(y.to(t.dtype))
            else:
                raise ValueError(f"KernelFault how={self.how!r}: scale, offset, poke, stale, bf16_acc, "
                                 "fp16_softmax, overflow or bf16_stats")
        self.applied = True

    def expected(self) -> str:
        """The dump entry of the API call that ran the faulted kernel.

        Forward calls are numbered in the order the program makes them; a forward kernel
        that autograd's engine runs (a checkpointed block recomputed in backward) is the
        recompute of a call already made, and has no entry of its own. A backward kernel
        belongs to the latest forward call (of FORWARD_OF[op]) not yet given its backward:
        autograd runs a graph's calls in reverse, and each backward pass (a micro-batch's)
        takes those of its own forward."""
        api, direction = API_OF[self.op]
        events = self.events[self.step]
        if direction == "forward":
            mine = [by_engine for name, by_engine in events if name == self.op]
            assert not mine[self.nth], f"the faulted {self.op} call is a recompute in backward: no entry of its own"
            return f"{api}.{mine[:self.nth].count(False)}.{direction}"
        fwd_op, calls, pending, k = FORWARD_OF[self.op], 0, [], 0
        for name, by_engine in events:
            if name == fwd_op:
                if not by_engine:
                    pending.append(calls)
                    calls += 1
            elif k == self.nth:
                return f"{api}.{pending.pop()}.{direction}"
            else:
                pending.pop()
                k += 1
        raise AssertionError(f"{self.op} ran {k} times at step {self.step}: no call {self.nth}")

    def check_mapping(self, npu_root) -> None:
        """The API named in API_OF has as many calls in the dump as the aten op ran (in
        forward: as the program ran, not autograd's recomputes), and the n-th of them in
        the dump's (execution) order is the one ``expected`` names."""
        api, direction = API_OF[self.op]
        data = load_data(npu_root, self.step)
        dumped = [e for e in data if e.startswith(api + ".") and e.endswith("." + direction)]
        ran = [by_engine for name, by_engine in self.events[self.step] if name == self.op]
        if direction == "forward":
            ran = [b for b in ran if not b]
        assert len(dumped) == len(ran), f"{api} {direction}: {len(dumped)} dumped calls, {len(ran)} {self.op} kernels"
        expected = self.expected()
        nth = int(expected.split(".")[-2]) if direction == "forward" else self.nth
        assert dumped[nth] == expected, (dumped, self.nth, expected)


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


RECIPES = frozenset({"fp16", "scaler", "accum", "checkpoint", "clip", "schedule"})


def _loss(kind, model, x, y):
    if kind == "conv":
        return F.cross_entropy(model(x), y)
    if kind == "moe":
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    return model(input_ids=x, labels=y).loss


def _warmup_cosine(s):
    """LambdaLR's factor at step ``s``: one step of warmup at half the rate, then a cosine
    decay over 4 steps (the same at a step whatever the run's length)."""
    return 0.5 if s < 1 else 0.5 * (1 + math.cos(math.pi * min(s, 4) / 4))


def run(kind, root, task="tensor", steps=3, bf16=False, fault=None, opt="adamw", device=None,
        dropout=0.0, attn="eager", recipe=(), **debugger_kw):
    """N dumped optimizer steps of model ``kind`` under ``fault`` (a KernelFault or None), on
    ``device`` (a ``second_device.Device``, or None: the CPU itself).

    ``recipe``: training features, any of RECIPES (none: one forward, backward and
    optimizer step): "fp16" computes under fp16 autocast (instead of ``bf16``'s bf16);
    "scaler" scales the loss with a ``torch.amp.GradScaler`` (init scale 2**10) and steps
    through it; "accum" accumulates the gradients of 2 micro-batches (each loss halved)
    per optimizer step, one dumped step; "checkpoint" recomputes each transformer block in
    backward (HF's gradient checkpointing, non-reentrant); "clip" clips the gradients'
    total norm to 0.5 (unscaled first with "scaler"); "schedule" steps a LambdaLR
    (warmup, then cosine) after each optimizer step."""
    import contextlib

    from probe import PrecisionDebugger
    recipe = frozenset(recipe)
    assert recipe <= RECIPES, recipe - RECIPES
    model = MODELS[kind](dropout=dropout, attn=attn)
    if "checkpoint" in recipe:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    g = torch.Generator().manual_seed(1)
    o = OPTIMIZERS[opt](model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) if "scaler" in recipe else None
    sched = torch.optim.lr_scheduler.LambdaLR(o, _warmup_cosine) if "schedule" in recipe else None
    micro = 2 if "accum" in recipe else 1
    amp = torch.float16 if "fp16" in recipe else torch.bfloat16
    dbg = PrecisionDebugger(dump_path=str(root), task=task, level="L1", **debugger_kw)
    fm = fault or KernelFault("none", 0, -1)
    try:
        with device or contextlib.nullcontext(), fm:
            for s in range(steps):
                fm.new_step(s)
                batches = [_batch(kind, g) for _ in range(micro)]
                dbg.start()
                o.zero_grad()
                for x, y in batches:
                    with torch.autocast("cpu", dtype=amp, enabled=bf16 or "fp16" in recipe):
                        loss = _loss(kind, model, x, y)
                    if micro > 1:
                        loss = loss / micro
                    (scaler.scale(loss) if scaler else loss).backward()
                if scaler and "clip" in recipe:
                    scaler.unscale_(o)
                if "clip" in recipe:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                if scaler:
                    scaler.step(o)
                    scaler.update()
                else:
                    o.step()
                if sched:
                    sched.step()
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
