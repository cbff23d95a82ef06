"""HF ``generate`` dumped with ``inference=True``: each forward is a step, with its token layout
and per-token statistics.

Real generation runs: a tiny Llama and GPT-2 built from configs (``real_runs``), greedy
``generate`` on prompts of different lengths, batched with left padding and one at a time,
several calls per dump. The expected layouts are derived from the prompts and from what
``generate`` returned, never from probe.
"""
import glob
import json
import logging
import math
import os

import numpy as np
import pytest
import torch
from conftest import LogCapture, load_dump
from real_runs import gpt2, llama

from probe import PrecisionDebugger
from probe.errors import ConfigError

pytestmark = pytest.mark.slow   # a dozen generate runs: minutes on a busy machine

PAD = 0
PROMPTS = [[5, 17, 9], [3, 44, 21, 8, 60, 7], [11, 92, 33, 4]]
MODELS = {"llama": llama, "gpt2": gpt2}


def _model(kind):
    model = MODELS[kind]().eval()
    model.generation_config.pad_token_id = PAD
    return model


def _left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _generate(model, prompts, new_tokens, **kwargs):
    """One greedy generate call on ``prompts`` (left-padded when several)."""
    ids, mask = _left_padded(prompts)
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=PAD, **kwargs)


def _run(model, calls, new_tokens=4, grad_mode=torch.no_grad, **kwargs):
    """``calls`` is a list of prompt lists, one generate call each; returns the outputs."""
    outs = []
    with grad_mode():
        for prompts in calls:
            outs.append(_generate(model, prompts, new_tokens, **kwargs))
    return outs


def _layouts(root):
    steps = sorted(int(os.path.basename(d)[4:]) for d in glob.glob(os.path.join(root, "step*")))
    out = {}
    for s in steps:
        with open(os.path.join(root, f"step{s}", "rank", "token_layout.json"), encoding="utf-8") as f:
            out[s] = json.load(f)
    return out


def _expected(calls, outs, eos=()):
    """The layouts the steps must have, from the prompts and generate's returned sequences."""
    steps = []
    for call, (prompts, out) in enumerate(zip(calls, outs)):
        width = max(len(p) for p in prompts)
        generated = out.shape[1] - width
        finished = [False] * len(prompts)
        for j in range(generated):
            rows, produced, prompt_of = [], {}, {}
            for b, p in enumerate(prompts):
                req = f"g{call}r{b}"
                if j == 0:
                    rows += [[req, -1, PAD, True]] * (width - len(p))
                    rows += [[req, i, tok, False] for i, tok in enumerate(p)]
                    prompt_of[req] = p
                else:
                    tok = int(out[b, width + j - 1])
                    rows.append([req, -1, tok, True] if finished[b] else [req, len(p) + j - 1, tok, False])
                if not finished[b]:
                    produced[req] = int(out[b, width + j])
                    finished[b] = produced[req] in eos
            shape = [len(prompts), width if j == 0 else 1]
            steps.append({"source": "hf", "token_shape": shape, "rows": rows, "produced": produced,
                          "prompts": prompt_of})
    return steps


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_layouts_batched_and_one_at_a_time(kind, dump_dir):
    """Batched (left padding) then each prompt alone: one step per forward, numbered on across
    the calls; rows, positions, padding, prompts and produced tokens as generate made them."""
    model = _model(kind)
    calls = [PROMPTS] + [[p] for p in PROMPTS]
    dbg = PrecisionDebugger(dump_path=dump_dir, task="statistics", level="L1", inference=True)
    dbg.start(model)
    outs = _run(model, calls)
    dbg.stop()
    dbg.close()
    expected = _expected(calls, outs)
    layouts = _layouts(dump_dir)
    assert sorted(layouts) == list(range(len(expected))) == list(range(4 * len(calls)))
    for step, want in enumerate(expected):
        assert layouts[step] == want, f"step {step}"
        assert load_dump(dump_dir, step), f"step {step} dumped nothing"
    # what each request produced, gathered over the steps, is what generate returned
    for call, (prompts, out) in enumerate(zip(calls, outs)):
        width = max(len(p) for p in prompts)
        for b in range(len(prompts)):
            got = [lay["produced"][f"g{call}r{b}"] for lay in layouts.values() if f"g{call}r{b}" in lay["produced"]]
            assert got == out[b, width:].tolist()


def test_finished_request_produces_nothing_further(dump_dir):
    """A row that generated the end-of-sequence id is padding from then on: generate feeds it
    the pad id, and its layout rows are marked padding with nothing produced."""
    model = _model("llama")
    with torch.no_grad():
        free = _generate(model, PROMPTS, 5)
    width = max(len(p) for p in PROMPTS)
    # generate's eos: an id a row makes first at its second token or later (before the last),
    # that some other row does not make by then: one row finishes early, one goes on
    gen = free[:, width:].tolist()
    row, j = next((b, j) for j in range(1, 4) for b in range(3)
                  if gen[b].index(gen[b][j]) == j and any(gen[b][j] not in r[:j + 1] for r in gen))
    eos = gen[row][j]
    dbg = PrecisionDebugger(dump_path=dump_dir, task="statistics", level="L1", inference=True)
    dbg.start(model)
    outs = _run(model, [PROMPTS], new_tokens=5, eos_token_id=eos)
    dbg.stop()
    dbg.close()
    assert outs[0][row, width + j + 1:].tolist() == [PAD] * (5 - j - 1)   # generate padded it
    layouts = _layouts(dump_dir)
    assert [layouts[s] for s in sorted(layouts)] == _expected([PROMPTS], outs, eos={eos})
    assert layouts[j]["produced"][f"g0r{row}"] == eos
    assert f"g0r{row}" not in layouts[j + 1]["produced"]
    assert layouts[j + 1]["rows"][row] == [f"g0r{row}", -1, eos, True]   # its input: the eos it made
    assert layouts[j + 2]["rows"][row] == [f"g0r{row}", -1, PAD, True]


def test_step_filter_and_prompts_of_a_batch_whose_prefill_is_not_dumped(dump_dir):
    """``step`` filters the forwards; a batch whose prefill is filtered out records its
    prompts in its first dumped step, and produced tokens still reach the dumped steps."""
    model = _model("llama")
    calls = [PROMPTS, PROMPTS[:2]]
    dbg = PrecisionDebugger(dump_path=dump_dir, task="statistics", level="L1", inference=True, step=[1, 2, 5])
    dbg.start(model)
    outs = _run(model, calls, new_tokens=3)
    dbg.stop()
    dbg.close()
    expected = _expected(calls, outs)
    layouts = _layouts(dump_dir)
    assert sorted(layouts) == [1, 2, 5]
    assert layouts[1]["prompts"] == {f"g0r{b}": p for b, p in enumerate(PROMPTS)}
    assert layouts[2] == expected[2]
    assert {k: v for k, v in layouts[1].items() if k != "prompts"} == \
        {k: v for k, v in expected[1].items() if k != "prompts"}
    assert layouts[5]["prompts"] == {"g1r0": PROMPTS[0], "g1r1": PROMPTS[1]}
    assert {k: v for k, v in layouts[5].items() if k != "prompts"} == \
        {k: v for k, v in expected[5].items() if k != "prompts"}


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_outputs_bitwise_and_dump_under_grad_modes(grad_mode, dump_dir):
    """Dumping at mix changes nothing generate returns (tokens and logits, bitwise), under
    ``no_grad`` and ``inference_mode``; the dump holds every forward's calls with statistics."""
    model = _model("llama")
    kwargs = {"return_dict_in_generate": True, "output_logits": True}
    plain = _run(model, [PROMPTS, PROMPTS[1:]], grad_mode=grad_mode, **kwargs)
    dbg = PrecisionDebugger(dump_path=dump_dir, task="statistics", level="mix", inference=True)
    dbg.start(model)
    dumped = _run(model, [PROMPTS, PROMPTS[1:]], grad_mode=grad_mode, **kwargs)
    dbg.stop()
    dbg.close()
    for a, b in zip(plain, dumped):
        assert torch.equal(a.sequences, b.sequences)
        assert all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))
    assert sorted(_layouts(dump_dir)) == list(range(8))
    for step in range(8):
        data = load_dump(dump_dir, step)
        linear = [v for k, v in data.items() if k.startswith("Functional.linear.")]
        assert len(linear) == 15, step     # 7 per layer and the lm_head
        assert all(isinstance(v["output"][0]["Max"], float) for v in linear)
        assert any(k.startswith("Module.model.layers.1.mlp.") for k in data)
    assert "generate" not in model.__dict__     # the wrapper went with stop()


def _tensor_rows(npy, token_shape):
    rows = np.load(npy).astype(np.float64).reshape(math.prod(token_shape), -1)
    return [[r.max(), r.min(), r.mean(), float(np.sqrt((r * r).sum()))] for r in rows]


def _tensor_records(value, key=""):
    """(path, summary) of every tensor summary in an entry's value."""
    if isinstance(value, dict) and value.get("type") == "torch.Tensor":
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensor_records(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _tensor_records(v, f"{key}.{i}")


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_token_stats_are_the_rows_of_the_tensor_dump(kind, tmp_path):
    """Each ``token_stats`` row is the statistics of that token's slice of the tensor, as a
    tensor-mode dump of the same run holds it; tensors of another leading shape have none,
    and the whole-tensor statistics are bitwise those of the tensor dump, which takes none."""
    roots = {}
    for task in ("statistics", "tensor"):
        roots[task] = str(tmp_path / task)
        model = _model(kind)
        dbg = PrecisionDebugger(dump_path=roots[task], task=task, level="L1", inference=True)
        dbg.start(model)
        _run(model, [PROMPTS, PROMPTS[:1]], new_tokens=3)
        dbg.stop()
        dbg.close()
    layouts = _layouts(roots["statistics"])
    checked = skipped = 0
    for step, layout in layouts.items():
        shape = layout["token_shape"]
        stats_data, tensor_data = load_dump(roots["statistics"], step), load_dump(roots["tensor"], step)
        assert stats_data.keys() == tensor_data.keys()
        for name, entry in stats_data.items():
            tensor_records = dict(_tensor_records(tensor_data[name]))
            for path, s in _tensor_records(entry):
                t = tensor_records[path]
                assert "token_stats" not in t            # tensor mode: the .npy rows say it
                for k in ("Max", "Min", "Mean", "Norm"):   # bitwise: the layout changes none
                    assert s[k] == t[k] or (s[k] != s[k] and t[k] != t[k]), (name, path, k)
                if s["shape"][:len(shape)] != shape or not s["dtype"].startswith("torch.float"):
                    assert "token_stats" not in s, (name, path)
                    skipped += 1
                    continue
                npy = os.path.join(roots["tensor"], f"step{step}", "rank", "dump_tensor_data", t["data_name"])
                want = _tensor_rows(npy, shape)
                assert len(s["token_stats"]) == len(layout["rows"]) == len(want)
                for got_row, want_row in zip(s["token_stats"], want):
                    assert got_row == pytest.approx(want_row, rel=1e-6, abs=1e-7), (name, path)
                checked += 1
    assert checked > 100 and skipped > 10


def _dump_files(root):
    """{relative path: bytes} of every file of a dump."""
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def test_inference_tensors_token_stats_in_one_compiled_call_are_bitwise_the_python_path(tmp_path, monkeypatch):
    """Under ``inference_mode`` every activation is an inference tensor: its summary and its
    token rows come from one compiled call (``SummaryCache.summary`` with the step's
    token_shape). The dump's every file is byte for byte what the path before it wrote
    (``token_stats.row_reductions`` after the whole-tensor summary), bf16 included."""
    from probe.dump import stats
    files = {}
    for path in ("compiled", "python"):
        if path == "python":
            monkeypatch.setattr(stats, "_with_rows", None)
        for amp in (False, True):
            root = str(tmp_path / f"{path}-{amp}")
            model = _model("llama")
            dbg = PrecisionDebugger(dump_path=root, task="statistics", level="L1", inference=True)
            dbg.start(model)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                _run(model, [PROMPTS, PROMPTS[:1]], new_tokens=3, grad_mode=torch.inference_mode)
            dbg.stop()
            dbg.close()
            files[path, amp] = _dump_files(root)
    for amp in (False, True):
        assert files["compiled", amp] == files["python", amp]
    text = b"".join(v for k, v in files["compiled", True].items() if k.endswith("dump.json"))
    assert text.count(b'"token_stats"') > 100 and b'"torch.bfloat16"' in text


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_token_stats_nan_and_inf_rows(grad_mode, dump_dir):
    """A request whose prompt holds a token with a NaN (another: an infinite) embedding: its
    rows' statistics are NaN (inf), written as dump.json writes them (``NaN``/``Infinity``),
    while the other requests' rows stay finite; under ``inference_mode`` (rows from the
    compiled summary) as under ``no_grad``."""
    model = _model("llama")
    with torch.no_grad():
        model.model.embed_tokens.weight[PROMPTS[0][1]] = float("nan")
        model.model.embed_tokens.weight[PROMPTS[2][0], 3] = float("inf")
    dbg = PrecisionDebugger(dump_path=dump_dir, task="statistics", level="L1", inference=True)
    dbg.start(model)
    _run(model, [PROMPTS], new_tokens=1, grad_mode=grad_mode)
    dbg.stop()
    dbg.close()
    with open(os.path.join(dump_dir, "step0", "rank", "dump.json"), encoding="utf-8") as f:
        text = f.read()
    assert "NaN" in text and "Infinity" in text
    entry = load_dump(dump_dir, 0)["Functional.embedding.0.forward"]
    rows = entry["output"][0]["token_stats"]
    layout = _layouts(dump_dir)[0]["rows"]
    for (request, position, token, _pad), row in zip(layout, rows):
        if token == PROMPTS[0][1]:
            assert all(math.isnan(x) for x in row)
        elif token == PROMPTS[2][0]:
            assert row[0] == math.inf and row[2] == math.inf and row[3] == math.inf and math.isfinite(row[1])
        else:
            assert all(math.isfinite(x) for x in row), (request, position)
    assert math.isnan(entry["output"][0]["Max"])


def test_config_key_misuse_and_training_unchanged(dump_dir, tmp_path):
    """``inference`` is a checked config key; start() without a model is refused; step() is
    said to do nothing. Without the key, a step is what start/stop/step make: no layout,
    no token_stats."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"dump_path": dump_dir, "inference": "yes"}))
    with pytest.raises(ConfigError, match=r"bad.json: inference: must be true or false"):
        PrecisionDebugger(config_path=str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"dump_path": dump_dir, "inference": True}))
    dbg = PrecisionDebugger(config_path=str(good))
    assert dbg.config.inference is True
    with pytest.raises(ConfigError, match="inference: true .* pass the model, start\\(model\\)"):
        dbg.start()
    model = _model("gpt2")
    dbg.start(model)
    with LogCapture("probe", logging.WARNING) as log:
        dbg.step()
    assert any("each forward of the model is a step" in m for m in log.messages)
    assert dbg.current_step == 0
    with torch.no_grad():
        _generate(model, PROMPTS[:1], 2)
    dbg.stop()
    assert dbg.current_step == 2
    dbg.close()
    training = str(tmp_path / "training")
    dbg = PrecisionDebugger(dump_path=training, task="statistics", level="L1")
    dbg.start(model)
    with torch.no_grad():
        _generate(model, PROMPTS, 2)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert sorted(os.listdir(training)) == ["step0"]
    with open(os.path.join(training, "step0", "rank", "dump.json"), encoding="utf-8") as f:
        assert "token_stats" not in f.read()
    assert not os.path.exists(os.path.join(training, "step0", "rank", "token_layout.json"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_rows_torch_path_agrees_with_the_compiled_one(dtype):
    """An accelerator's tensors take the torch path (reductions started on the device, fetched
    for all tensors at the flush); on the hidden states of a real forward (a NaN row, an
    infinite one, left padding) it gives what the CPU's compiled loop gives."""
    from probe.inference import token_stats
    model = _model("llama").to(dtype)
    with torch.no_grad():
        model.model.embed_tokens.weight[PROMPTS[0][1]] = float("nan")
        model.model.embed_tokens.weight[PROMPTS[2][0], 3] = float("inf")
        ids, mask = _left_padded(PROMPTS)
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    shape = tuple(ids.shape)
    rows = math.prod(shape)
    compiled = [token_stats.row_reductions(h, shape) for h in hidden]
    assert all(r.values is not None for r in compiled)       # the CPU's one-pass loop
    pending = [token_stats.device_row_reductions(h, rows) for h in hidden]
    assert all(p.values is None for p in pending)
    token_stats.fetch_all(pending + pending[:1])              # one transfer; a shared one resolved once
    nan_rows = inf_rows = 0
    for c, p in zip(compiled, pending):
        for a, b in zip(c.values, p.values):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6, nan_ok=True)
            nan_rows += math.isnan(a[0])
            inf_rows += a[0] == math.inf
    assert nan_rows and inf_rows


def test_hand_written_decode_loop_outside_generate(dump_dir):
    """Forwards outside ``generate``: one on an empty cache starts a batch (a call of its own),
    one continuing the cache continues it, so its input ids are what the previous step
    produced; the next empty-cache forward is a new batch."""
    model = _model("llama")
    ids, mask = _left_padded(PROMPTS[:2])
    dbg = PrecisionDebugger(dump_path=dump_dir, task="statistics", level="L1", inference=True)
    dbg.start(model)
    chosen = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        for _ in range(2):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            chosen.append(nxt[:, 0].tolist())
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
        model(input_ids=torch.tensor([PROMPTS[2]]))
    dbg.stop()
    dbg.close()
    layouts = _layouts(dump_dir)
    assert sorted(layouts) == [0, 1, 2, 3]
    assert layouts[0]["prompts"] == {"g0r0": PROMPTS[0], "g0r1": PROMPTS[1]}
    for step in (0, 1):
        assert layouts[step]["produced"] == {"g0r0": chosen[step][0], "g0r1": chosen[step][1]}
    assert layouts[1]["rows"] == [["g0r0", len(PROMPTS[0]), chosen[0][0], False],
                                  ["g0r1", len(PROMPTS[1]), chosen[0][1], False]]
    assert layouts[2]["produced"] == {}          # nothing showed what the last forward chose
    assert layouts[3]["prompts"] == {"g1r0": PROMPTS[2]} and layouts[3]["produced"] == {}
