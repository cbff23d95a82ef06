"""Dumping inference as serving engines run it: under ``torch.inference_mode``, with kernels
called through ``torch.ops`` (vLLM's ``_C`` / ``vllm``, torch_npu's ``npu``) and attention
written into a ``torch.empty`` buffer.

The model is an HF Llama whose attention is a custom op writing its result into a buffer the
attention function allocates with ``torch.empty``, as vLLM's ``unified_attention_with_output``
does; the ops are defined here with ``torch.library`` in the namespace ``probetest``.
"""
import json
import os

import pytest
import torch
from custom_ops import define
from real_runs import llama

from probe import PrecisionDebugger
from probe.compare import compare

GARBAGE = {"zeros": 0.0, "huge": 1.5e32}


def _sdpa_into(q, k, v, output, scale):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, scale=scale)
    output.copy_(out.transpose(1, 2))


def _scale_rows(x, s):
    x.mul_(s)


def _rms_out(x, w, eps, out):
    out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


_HANDLES = {}   # handle -> weight, as vLLM's oneDNN handler holds the linear's weight in C++


def _mm_handle(c, a, handler_tensor):
    c.copy_(a @ _HANDLES[int(handler_tensor)])


sdpa_into = define("probetest", "sdpa_into(Tensor q, Tensor k, Tensor v, Tensor(a!) output, float scale) -> ()",
                   _sdpa_into)
scale_rows = define("probetest", "scale_rows(Tensor(a!) x, float s) -> ()", _scale_rows)
rms_out = define("probetest", "rms_out(Tensor x, Tensor w, float eps, *, Tensor(a!) out) -> ()", _rms_out)
mm_handle = define("probetest", "mm_handle(Tensor(a!) c, Tensor a, Tensor handler_tensor) -> ()", _mm_handle)


class _Garbage:
    """What the memory of a fresh buffer holds in this run (set per run)."""
    value = 0.0


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """An attention function as a serving engine's: the output is allocated empty, viewed,
    and filled in place by the kernel (a custom op); an in-place op, an ``out=`` op and a GEMM
    whose weight is behind a handle (vLLM's ``_C.onednn_mm``) follow."""
    b, h, s, d = query.shape
    output = torch.empty(b * s * h * d, dtype=query.dtype)
    output.numpy()[:] = _Garbage.value    # what the memory held: no API probe sees wrote it
    output = output.view(b, s, h, d)      # the allocation itself is dropped, as vLLM's is
    sdpa_into(query, key, value, output, float(scaling))
    scale_rows(output, 1.0)
    normed = torch.empty(b, s, h, d)
    normed.numpy()[:] = _Garbage.value
    rms_out(output, torch.ones(d), 1e-6, out=normed)
    handle = 1000 + len(_HANDLES)   # an address: another in every run
    _HANDLES[handle] = torch.eye(d)
    projected = torch.empty_like(normed)
    mm_handle(projected, normed, torch.tensor(handle))
    return projected, None


@pytest.fixture(scope="module", autouse=True)
def _registered():
    try:
        from transformers import AttentionInterface
    except ImportError:   # the torch-floor venv's transformers 4.40
        pytest.skip("transformers before 4.48 has no AttentionInterface to plug the attention in")
    AttentionInterface.register("probetest", _attention)


def _generate(root, garbage, task="statistics", level="L1"):
    _Garbage.value = garbage
    model = llama(seed=0, attn="probetest").eval()
    debugger = PrecisionDebugger(task=task, dump_path=str(root), level=level)
    prompt = torch.tensor([[5, 17, 33, 9, 60]])
    with torch.inference_mode():
        for _ in range(2):   # two steps: a prefill of the prompt, then it and its first token
            debugger.start(model)
            logits = model(prompt).logits
            debugger.stop()
            debugger.step()
            prompt = torch.cat([prompt, logits[:, -1:].argmax(-1)], 1)
    debugger.close()
    return prompt


def _data(root, step=0):
    with open(os.path.join(str(root), f"step{step}", "rank", "dump.json"), encoding="utf-8") as f:
        return json.load(f)["data"]


def test_inference_mode_is_dumped_with_custom_ops_at_l1(tmp_path):
    tokens = _generate(tmp_path / "run", GARBAGE["zeros"])
    _Garbage.value = 0.0
    with torch.inference_mode():   # the run's tokens are the undumped model's
        plain = llama(seed=0, attn="probetest").eval()(tokens[:, :-1]).logits[:, -1].argmax(-1)
    assert plain.item() == tokens[0, -1].item()
    for step in (0, 1):
        data = _data(tmp_path / "run", step)
        linears = [v for k, v in data.items() if k.startswith("Functional.linear.")]
        assert linears and all(v["output"][0]["Max"] is not None for v in linears)   # statistics under inference_mode
        names = {k.rsplit(".", 2)[0] for k in data}
        assert {"Custom.probetest.sdpa_into", "Custom.probetest.scale_rows", "Custom.probetest.rms_out",
                "Custom.probetest.mm_handle"} <= names
        n_layers = llama().config.num_hidden_layers
        assert sum(k.startswith("Custom.probetest.sdpa_into.") for k in data) == n_layers


def test_custom_ops_record_what_they_write(tmp_path):
    _generate(tmp_path / "run", GARBAGE["huge"])
    data = _data(tmp_path / "run")
    attn, scaled, normed = (data[f"Custom.probetest.{op}.0.forward"] for op in ("sdpa_into", "scale_rows", "rms_out"))
    # the buffer the kernel fills: no values as an input, the attention's result as its output
    buffer_in = attn["input_args"][3]
    assert buffer_in["uninitialized"] is True and buffer_in["Max"] is None
    assert attn["output"][0]["shape"] == buffer_in["shape"] and abs(attn["output"][0]["Max"]) < 1e3
    # the in-place op: its input is the data written, its output what it wrote
    assert scaled["input_args"][0]["Max"] == attn["output"][0]["Max"]
    assert scaled["output"][0]["Norm"] == pytest.approx(attn["output"][0]["Norm"])
    # the out= op: the buffer is no input data, its output is the result
    assert normed["input_kwargs"]["out"]["uninitialized"] is True and normed["input_kwargs"]["out"]["Max"] is None
    assert normed["output"][0]["Max"] is not None and abs(normed["output"][0]["Max"]) < 1e3
    # the handle is an address: no value
    handle = data["Custom.probetest.mm_handle.0.forward"]["input_args"][2]
    assert handle["opaque"] is True and handle["Max"] is None


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_garbage_in_empty_buffers_is_no_difference(tmp_path, task):
    _generate(tmp_path / "npu", GARBAGE["huge"], task)
    _generate(tmp_path / "bench", GARBAGE["zeros"], task)
    for step in (0, 1):
        paths = compare({"npu_json_path": os.path.join(str(tmp_path / "npu"), f"step{step}", "rank", "dump.json"),
                         "bench_json_path": os.path.join(str(tmp_path / "bench"), f"step{step}", "rank", "dump.json"),
                         "is_print_compare_log": False}, str(tmp_path / f"out{step}"))
        summary = [p for p in paths if os.path.basename(p).startswith("compare_summary")][-1]
        with open(summary, encoding="utf-8") as f:
            s = json.load(f)
        assert s["rows"]["error"] == 0 and s["rows"]["warning"] == 0, s["rows"]
        assert s["inputs_differ"] is None and not s["state"]["differ"], (s["inputs_differ"], s["state"])
        assert s["calls"]["introduces"] == 0 and s["calls"]["inherits"] == 0, s["calls"]
        assert s["verdict"].startswith("no API introduces error"), s["verdict"]


def test_custom_section_selects_namespaces_and_ops(tmp_path):
    from probe.hook_module.registry import DEFAULT_YAML
    with open(DEFAULT_YAML, encoding="utf-8") as f:
        text = f.read()
    head, _, _ = text.rpartition("custom:")
    cases = {"every": '  - "*"\n', "one_op": "  - probetest.scale_rows\n", "none": ""}
    seen = {}
    for case, section in cases.items():
        yaml_path = tmp_path / f"{case}.yaml"
        yaml_path.write_text(head + "custom:\n" + section, encoding="utf-8")
        model = llama(seed=0, attn="probetest").eval()
        debugger = PrecisionDebugger(task="statistics", dump_path=str(tmp_path / case), level="L1",
                                     wrap_ops_yaml=str(yaml_path))
        with torch.inference_mode():
            debugger.start(model)
            model(torch.tensor([[5, 17, 33]]))
            debugger.stop()
            debugger.step()
        debugger.close()
        seen[case] = {k.rsplit(".", 2)[0] for k in _data(tmp_path / case) if k.startswith("Custom.")}
    assert seen["every"] == {"Custom.probetest.sdpa_into", "Custom.probetest.scale_rows", "Custom.probetest.rms_out",
                             "Custom.probetest.mm_handle"}
    assert seen["one_op"] == {"Custom.probetest.scale_rows"}
    assert seen["none"] == set()
