"""Real greedy generation runs of a tiny HF Llama, dumped step by step with token layouts.

A small explicit greedy loop over the model's forward with a KV cache (``DynamicCache``): each
forward is one dumped step (``start()``, the forward, ``stop()``, the layout, ``step()``), as
the inference contract says (probe/inference/token_layout.py). Batched runs left-pad the
prompts and pass ``attention_mask`` and ``position_ids``, as HF ``generate`` does; single runs
generate one request at a time, the steps numbered on across requests. The next token is the
argmax of the last position's logits, outside the dumped forward (as in ``generate``).

``bf16`` runs the forward under CPU bf16 autocast; ``fault`` is a ``real_runs.KernelFault``
(below the API level) whose ``new_step`` is called with each step's number.
"""
from __future__ import annotations

import contextlib

import torch

from probe.inference.token_layout import StepLayout, TokenRow

VOCAB, HIDDEN, LAYERS, PAD = 256, 128, 2, 0

PROMPTS = ([5, 17, 42, 9, 77, 31], [12, 250, 3], [7, 7, 99, 120, 64, 18, 2, 201, 45], [33, 66, 71, 5, 8])


def llama(seed=0):
    """A tiny Llama (head_dim 32, two KV heads: grouped-query attention, fused SDPA)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=PAD)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    model.eval()
    return model


def _generate_batch(model, dbg, prompts, first_rid, new_tokens, step, amp, fault, chunk=None):
    """Greedy decoding of ``prompts`` as one left-padded batch; returns (tokens, next step).
    ``chunk``: the prefill fed ``chunk`` columns a step (chunked prefill, as a serving engine
    does); only its last chunk produces a token."""
    from transformers import DynamicCache
    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n, width), PAD, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    rids = [f"r{first_rid + b}" for b in range(n)]
    cache = DynamicCache()
    out: list = [[] for _ in prompts]
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    pieces = [(a, min(a + chunk, width)) for a in range(0, width, chunk)] if chunk else [(0, width)]
    x, m, p = ids, mask, pos
    for t in range(len(pieces) + new_tokens - 1):
        if t < len(pieces):
            a, b = pieces[t]
            x, m, p = ids[:, a:b], mask[:, :b], pos[:, a:b]
        if fault is not None:
            fault.new_step(step)
        dbg.start()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, attention_mask=m, position_ids=p,
                           past_key_values=cache, use_cache=True).logits
        dbg.stop()
        last = t >= len(pieces) - 1
        nxt = logits[:, -1, :].float().argmax(-1)
        mask_now = m[:, -x.shape[1]:]
        rows = [TokenRow(rids[b], int(p[b, j]) if mask_now[b, j] else -1, int(x[b, j]), not bool(mask_now[b, j]))
                for b in range(n) for j in range(x.shape[1])]
        dbg.set_step_layout(StepLayout("hf", tuple(x.shape), rows,
                                       produced={rids[b]: int(nxt[b]) for b in range(n)} if last else {},
                                       prompts={rids[b]: list(prompts[b]) for b in range(n)} if t == 0 else {}))
        dbg.step()
        step += 1
        if last:
            for b in range(n):
                out[b].append(int(nxt[b]))
            x, p = nxt[:, None], p[:, -1:] + 1
            m = torch.cat([m, torch.ones((n, 1), dtype=torch.long)], 1)
    return out, step


def generate(root, prompts=PROMPTS, batched=True, new_tokens=4, bf16=False, fault=None,
             task="tensor", seed=0, order=None, chunk=None):
    """Dump a greedy generation of ``prompts`` into ``root``; return each prompt's tokens.

    ``order``: the order in which a single run (``batched`` False) serves the prompts;
    ``chunk``: a single run's prefill fed ``chunk`` tokens a step."""
    from probe import PrecisionDebugger
    model = llama(seed)
    dbg = PrecisionDebugger(dump_path=str(root), task=task, level="L1")
    tokens: dict = {}
    try:
        with torch.no_grad(), fault if fault is not None else contextlib.nullcontext():
            if batched:
                out, _ = _generate_batch(model, dbg, list(prompts), 0, new_tokens, 0, bf16, fault)
                tokens = dict(enumerate(out))
            else:
                step = 0
                for k, i in enumerate(order if order is not None else range(len(prompts))):
                    out, step = _generate_batch(model, dbg, [prompts[i]], k, new_tokens, step, bf16, fault, chunk)
                    tokens[i] = out[0]
    finally:
        dbg.close()
    return [tokens[i] for i in range(len(prompts))]


def hf_generate(root, prompts=PROMPTS, batched=True, new_tokens=4, bf16=False, fault=None,
                task="statistics", seed=0, level="L1"):
    """The same generation through HF ``generate`` under ``PrecisionDebugger(...,
    inference=True)`` (probe.inference.hf: each forward one step, its layout and per-token
    statistics recorded by probe). ``fault.new_step`` is told each forward's step number by a
    forward pre-hook of the test's own. Returns each prompt's generated tokens."""
    from probe import PrecisionDebugger
    model = llama(seed)
    model.generation_config.pad_token_id = PAD
    steps = [0]
    if fault is not None:
        def count(module, args, kwargs):
            fault.new_step(steps[0])
            steps[0] += 1
        model.register_forward_pre_hook(count, with_kwargs=True)
    dbg = PrecisionDebugger(dump_path=str(root), task=task, level=level, inference=True)
    out: list = []
    groups = [list(prompts)] if batched else [[p] for p in prompts]
    try:
        dbg.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), \
                fault if fault is not None else contextlib.nullcontext():
            for g in groups:
                width = max(len(p) for p in g)
                ids = torch.tensor([[PAD] * (width - len(p)) + list(p) for p in g])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in g])
                gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                     do_sample=False)
                out += gen[:, width:].tolist()
        dbg.stop()
    finally:
        dbg.close()
    return out
