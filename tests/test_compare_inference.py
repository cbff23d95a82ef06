"""Inference runs compared by request and token, on real greedy generations of a tiny Llama.

Each run dumps every forward as a step with its token layout (tests/inference_runs.py: an
explicit greedy loop with a KV cache, or HF ``generate`` under ``inference=True``). The
batched runs left-pad four prompts of different lengths; the single runs serve them one at a
time, in another order. Faults are below the API (``real_runs.KernelFault``): one layer's
attention output projection (the 11th linear of a forward: layer 1's o_proj) scaled by 1.05
at one step.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch
from headless_browser import headless_chromium

from inference_runs import PROMPTS, generate, hf_generate, llama
from real_runs import KernelFault

from probe.cli import main
from probe.compare import compare_distributed
from probe.errors import ConfigError

O_PROJ_1 = 7 + 3          # a Llama layer's linears: q, k, v, o, gate, up, down; layer 1's o_proj
CULPRIT = f"Functional.linear.{O_PROJ_1}.forward"
SINGLE_ORDER = [2, 0, 3, 1]

pytestmark = pytest.mark.slow   # a dozen generation runs and per-request compares: minutes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tensor dumps: {name: (root, generated tokens per prompt)}."""
    root = tmp_path_factory.mktemp("inference")
    out = {}

    def run(name, **kw):
        out[name] = (str(root / name), generate(root / name, **kw))
    run("batched")
    run("single", batched=False, order=SINGLE_ORDER)
    run("decode_fault", fault=KernelFault("mm.default", O_PROJ_1, 2, "scale", 1.05))
    run("prefill_fault", fault=KernelFault("mm.default", O_PROJ_1, 0, "scale", 1.05))
    return out


def _compare(npu, bench, out):
    compare_distributed(npu, bench, str(out), verbose=False)
    with open(os.path.join(out, "compare_summary.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _arrival(prompt):
    return PROMPTS.index(prompt)


def test_clean_batched_vs_single(runs, tmp_path):
    """Batched step 1 decodes four requests, single step 1 decodes one: compared by request,
    every request is compared (calls compared, no 'missing'), and nothing is named."""
    (npu, toks_b), (bench, toks_s) = runs["batched"], runs["single"]
    assert toks_b == toks_s
    s = _compare(npu, bench, tmp_path / "out")
    assert s["first_divergence"] is None
    assert [e["request"] for e in s["requests"]] == [0, 1, 2, 3]    # the NPU run's order of arrival
    for e in s["requests"]:
        assert e["verdict"] == "clean" and e["calls_compared"] > 50, e
        assert e["first_differing_token"] is None and e["generated"]["npu"] == toks_b[e["request"]]
        # the bench served the prompts in another order: matched by prompt, not by id or step
        assert e["bench_id"] == f"r{SINGLE_ORDER.index(e['request'])}"
        assert os.path.isfile(e["html"]) and os.path.isfile(e["report"])
    assert s["unmatched_requests"] == {"npu": [], "bench": []}
    inv = s["batch_invariance"]      # fp32 GEMMs of another M may round otherwise: named, not blamed
    if inv is not None:
        assert inv["request"] in range(4) and inv["name"].endswith(".forward")
        assert any("not batch-invariant" in n for n in s["notes"])
    page = open(os.path.join(tmp_path / "out", "compare_run.html"), encoding="utf-8").read()
    assert '"requests":[' in page


def test_batch_invariance_names_the_kernel(tmp_path):
    """A kernel whose result depends on the batch by about one rounding (the first linear's
    result scaled by 1 + 2^-23 in the batched prefill only; fp32 GEMMs of another batch size
    may round otherwise by themselves on a CPU): no culprit, and the batch-invariance check
    names it with a request, at the prefill."""
    npu = str(tmp_path / "npu")
    f = KernelFault("mm.default", 0, 0, "scale", 1 + 2 ** -23)
    generate(npu, fault=f)
    assert f.applied
    bench = str(tmp_path / "bench")
    generate(bench, batched=False)
    s = _compare(npu, bench, tmp_path / "out")
    assert s["first_divergence"] is None
    assert all(e["verdict"] == "clean" for e in s["requests"])
    inv = s["batch_invariance"]
    assert inv is not None and inv["name"] == "Functional.linear.0.forward", inv
    assert inv["step"] == 0 and inv["request"] in range(4)
    assert 0 <= inv["position"] < len(PROMPTS[inv["request"]])
    assert any("not batch-invariant" in n for n in s["notes"])


def test_bf16_vs_fp32_flip_said_not_blamed(tmp_path):
    """bf16 batched against fp32 single: a greedy flip at a near tie is said with the bench's
    margin (measured again here from the model) and nothing is blamed."""
    npu, bench = str(tmp_path / "bf16"), str(tmp_path / "fp32")
    a = generate(npu, bf16=True, seed=1)
    b = generate(bench, batched=False, seed=1)
    flips = {i: next(k for k, (x, y) in enumerate(zip(p, q)) if x != y)
             for i, (p, q) in enumerate(zip(a, b)) if p != q}
    assert flips, "seed 1 no longer flips a token: pick a seed that does"
    s = _compare(npu, bench, tmp_path / "out")
    assert s["first_divergence"] is None
    model = llama(1)
    for e in s["requests"]:
        i = e["request"]
        assert e["first_differing_token"] == flips.get(i)
        if i not in flips:
            assert e["verdict"] == "clean"
            continue
        k = flips[i]
        assert e["verdict"] == "flip" and e["tokens"] == [a[i][k], b[i][k]]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([PROMPTS[i] + b[i][:k]])).logits[0, -1].double()
        top = torch.topk(logits, 2).values
        assert e["bench_margin"] == pytest.approx(float(top[0] - top[1]), rel=1e-3, abs=1e-6)
        assert f"request {i}, token {k}: {a[i][k]} vs {b[i][k]}, bench margin" in e["reason"]
        assert "bfloat16 rounding" in e["reason"]
        assert e["judged_positions"] == len(PROMPTS[i]) + k     # the rows after the flip are not judged


@pytest.mark.parametrize("run, step", [("decode_fault", 2), ("prefill_fault", 0)])
def test_fault_named_with_request_position_step(runs, tmp_path, run, step):
    """The o_proj fault at a decode (or the prefill) step of the batched run is named in every
    request, at the step it was injected, with a position of that step's rows."""
    npu, _ = runs[run]
    bench, _ = runs["single"]
    s = _compare(npu, bench, tmp_path / "out")
    fd = s["first_divergence"]
    assert fd is not None and fd["name"] == CULPRIT and fd["step"] == step, fd
    for e in s["requests"]:
        assert e["verdict"] == "introduces" and e["first"] == CULPRIT and e["step"] == step, e
        plen = len(PROMPTS[e["request"]])
        if step == 0:
            assert 0 <= e["position"] < plen
        else:
            assert e["position"] == plen + step - 1
    assert fd["request"] in range(4) and f"position {fd['position']}" in fd["reason"]


def test_statistics_mode_hf_generate(tmp_path):
    """HF generate under inference=True, statistics dumps (per-token statistics): the decode
    fault is named at its step; batched against single, clean."""
    f = KernelFault("mm.default", O_PROJ_1, 2, "scale", 1.05)
    npu = str(tmp_path / "fault")
    hf_generate(npu, fault=f)
    assert f.applied
    bench = str(tmp_path / "single")
    hf_generate(bench, batched=False)
    s = _compare(npu, bench, tmp_path / "out")
    fd = s["first_divergence"]
    assert fd is not None and fd["name"] == CULPRIT and fd["step"] == 2, fd
    assert fd["position"] == len(PROMPTS[fd["request"]]) + 1
    clean = str(tmp_path / "clean")
    hf_generate(clean)
    s = _compare(clean, bench, tmp_path / "out2")
    assert s["first_divergence"] is None
    assert all(e["verdict"] == "clean" and e["calls_compared"] > 20 for e in s["requests"]), s["requests"]


def test_statistics_flip_margin_unknown(tmp_path):
    """bf16 against fp32 in statistics dumps: the flip is said, its margin null (no logits)."""
    npu, bench = str(tmp_path / "bf16"), str(tmp_path / "fp32")
    a = hf_generate(npu, bf16=True, seed=1)
    b = hf_generate(bench, batched=False, seed=1)
    assert a != b
    s = _compare(npu, bench, tmp_path / "out")
    assert s["first_divergence"] is None
    flipped = [e for e in s["requests"] if e["first_differing_token"] is not None]
    assert flipped and all(e["verdict"] == "flip" and e["bench_margin"] is None for e in flipped)
    # a layer mapping that names no module of these runs: the tokens still differ, but no
    # call was compared before them: never said as a flip "no call introduces error before"
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("nowhere.*.mlp: nowhere.*.mlp\n", encoding="utf-8")
    from probe.compare.run import compare_run
    s = compare_run(npu, bench, str(tmp_path / "out_unmapped"), layer_mapping=str(mapping)).summary
    assert s["first_divergence"] is None
    for e in s["requests"]:
        assert e["calls_compared"] == 0 and e["verdict"] == "not compared", e
    assert any(e["first_differing_token"] is not None and "not judged" in e["reason"] for e in s["requests"])


def _rewrite_ids(root, rename):
    for step in os.listdir(root):
        path = os.path.join(root, step, "rank", "token_layout.json")
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        doc["rows"] = [[rename(r[0])] + r[1:] for r in doc["rows"]]
        doc["produced"] = {rename(k): v for k, v in doc["produced"].items()}
        doc["prompts"] = {rename(k): v for k, v in doc["prompts"].items()}
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)


def test_unmatched_requests_and_page_text(runs, tmp_path, capsys):
    """A request whose prompt the other run never served is reported, not compared; request
    ids from the dump reach the page as text only; the CLI routes roots to the request compare."""
    npu = str(tmp_path / "npu")
    shutil.copytree(runs["batched"][0], npu)
    hostile = "</script><img src=x onerror=alert(1)>"
    _rewrite_ids(npu, lambda rid: hostile + rid)
    bench = str(tmp_path / "bench")
    generate(bench, prompts=PROMPTS[:3], batched=False)
    out = tmp_path / "out"
    assert main(["compare", "--npu", npu, "--bench", bench, "-o", str(out)]) == 0
    s = json.load(open(out / "compare_summary.json", encoding="utf-8"))
    assert [e["request"] for e in s["requests"]] == [0, 1, 2]
    lone = s["unmatched_requests"]["npu"]
    assert [(u["request"], u["id"]) for u in lone] == [(3, hostile + "r3")]
    assert any("has no request with its prompt" in n for n in s["notes"])
    page = open(out / "compare_run.html", encoding="utf-8").read()
    data = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
    assert data["unmatched_requests"]["npu"][0]["id"] == hostile + "r3"    # data, escaped in the page
    assert hostile not in page
    assert "innerHTML" not in page


def test_bad_layout_is_one_clear_error(runs, tmp_path):
    """A token_layout.json that is not the contract's: a ConfigError naming the file."""
    npu = str(tmp_path / "npu")
    shutil.copytree(runs["batched"][0], npu)
    path = os.path.join(npu, "step1", "rank", "token_layout.json")
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["rows"][0] = ["r0", "x", 1, False]
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    with pytest.raises(ConfigError, match=r"token_layout\.json: rows\[0\]"):
        compare_distributed(npu, runs["single"][0], str(tmp_path / "out"), verbose=False)


def test_requests_gathered_rows_are_the_requests(runs):
    """The gathered rows of a request are its rows of each step: the embedding's output rows
    of the batched and the single run agree bit for bit, position by position."""
    from probe.compare import tokens
    from probe.compare.request_dump import gather
    a, b = tokens.read_sides(runs["batched"][0])[0], tokens.read_sides(runs["single"][0])[0]
    pairs, lone_a, lone_b = tokens.match(a.requests, b.requests)
    assert len(pairs) == 4 and not lone_a and not lone_b
    p = pairs[2]
    ga = gather(a, p.npu, p.judged(), os.path.join(os.path.dirname(runs["batched"][0]), "g_npu"))
    gb = gather(b, p.bench, p.judged(), os.path.join(os.path.dirname(runs["batched"][0]), "g_bench"))
    key = "Functional.embedding.0.forward.output.0"
    assert ga.positions[key] == gb.positions[key] == list(range(p.judged()))   # every position fed
    assert np.array_equal(ga.rows_of(key), gb.rows_of(key))


def test_chunked_prefill_lines_up_by_position(runs, tmp_path):
    """The NPU run feeds each prefill 3 tokens a step (request 0's six prompt tokens over steps
    0 and 1), the bench whole in one batched step: rows line up by (request, position). Clean
    compares clean; the o_proj fault in request 0's second chunk is named there."""
    bench, toks = runs["batched"]
    npu = str(tmp_path / "chunked")
    assert generate(npu, prompts=PROMPTS[:3], batched=False, chunk=3) == toks[:3]
    s = _compare(npu, bench, tmp_path / "out")
    assert s["first_divergence"] is None
    assert [e["verdict"] for e in s["requests"]] == ["clean"] * 3, s["requests"]
    assert all(e["calls_compared"] > 50 for e in s["requests"])
    assert [u["prompt"] for u in s["unmatched_requests"]["bench"]] == [PROMPTS[3]]
    faulty = str(tmp_path / "chunked_fault")
    generate(faulty, prompts=PROMPTS[:3], batched=False, chunk=3,
             fault=KernelFault("mm.default", O_PROJ_1, 1, "scale", 1.05))
    s = _compare(faulty, bench, tmp_path / "out2")
    fd = s["first_divergence"]
    assert fd is not None and fd["name"] == CULPRIT, fd
    assert (fd["request"], fd["step"]) == (0, 1) and 3 <= fd["position"] < 6, fd


def test_page_marks_tokens_and_keeps_names_text(runs, tmp_path):
    """In a browser: requests x tokens, the token whose row the culprit first made differ
    marked (step 2 chose token 2), each request linking to its call table; request ids from the
    dump shown as text (no element made from them)."""
    npu = str(tmp_path / "npu")
    shutil.copytree(runs["decode_fault"][0], npu)
    hostile = '"><img id=pwned src=x onerror="document.title=1">'
    _rewrite_ids(npu, lambda rid: hostile + rid)
    first = os.path.join(npu, "step0", "rank", "token_layout.json")
    with open(first, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["prompts"][hostile + "r3"] = [1, 2, 3]       # no such prompt in the bench: said in a note
    with open(first, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    s = _compare(npu, runs["single"][0], tmp_path / "out")
    browser = headless_chromium()
    from selenium.webdriver.common.by import By
    try:
        browser.get("file://" + os.path.abspath(tmp_path / "out" / "compare_run.html"))
        assert browser.execute_script("return document.body.dataset.ready") == "1"
        assert browser.find_element(By.ID, "culprit").text == CULPRIT
        rows = browser.find_elements(By.CSS_SELECTOR, "#grid tr[data-request]")
        assert len(rows) == len(s["requests"]) == 3
        for row in rows:
            cells = row.find_elements(By.TAG_NAME, "td")
            marked = [k for k, c in enumerate(cells[1:]) if "culprit" in c.get_attribute("class")]
            assert marked == [2], marked
            href = row.find_element(By.TAG_NAME, "a").get_attribute("href")
            assert "compare_report_request" in href
        assert browser.find_elements(By.ID, "pwned") == [] and browser.title != "1"
        notes = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#notes li")]
        assert any(hostile + "r3" in n for n in notes), notes
    finally:
        browser.quit()


MODULE_MAPPING = """\
model.layers.*.self_attn.o_proj: model.layers.*.self_attn.o_proj
model.layers.*.mlp: model.layers.*.mlp
model.layers.*.post_attention_layernorm.input.0: model.layers.*.post_attention_layernorm.input.0
model.layers.*.post_attention_layernorm.output.0: model.layers.*.post_attention_layernorm.output.0
"""


def test_layer_mapping_compares_the_mapped_module_rows_per_token(tmp_path):
    """HF generate at mix level, the o_proj kernel fault at decode step 2: with a layer
    mapping only the mapped module rows are compared, under the bench's module names, and
    the faulty o_proj (its input agrees, its output differs) is named with the request and
    the position. The bench generated a token more: only positions both runs fed are judged."""
    f = KernelFault("mm.default", O_PROJ_1, 2, "scale", 1.05)
    npu, bench = str(tmp_path / "fault"), str(tmp_path / "clean")
    hf_generate(npu, fault=f, level="mix")
    hf_generate(bench, level="mix", new_tokens=5)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text(MODULE_MAPPING, encoding="utf-8")
    from probe.compare.run import compare_run
    s = compare_run(npu, bench, str(tmp_path / "out"), layer_mapping=str(mapping)).summary
    fd = s["first_divergence"]
    assert fd is not None and fd["name"] == "Module.model.layers.1.self_attn.o_proj.forward.0", fd
    assert fd["step"] == 2 and fd["position"] == len(PROMPTS[fd["request"]]) + 1
    assert "Module.model.layers.1.self_attn.o_proj.Linear.forward.0" in fd["reason"]   # as the NPU run named it
    assert not any("judged as if its inputs agreed" in n for n in s["notes"]), s["notes"]
    for e in s["requests"]:
        # 2 layers x (o_proj, mlp, post_attention_layernorm): nothing else was compared
        assert e["calls_compared"] == 6 and e["first_differing_token"] is None, e
        with open(e["report"], encoding="utf-8") as fh:
            calls = json.load(fh)["calls"]
        assert calls["unmatched"] == 0 and calls["total"] == 6
        assert e["judged_positions"] == len(PROMPTS[e["request"]]) + 3   # the NPU's 4 tokens: 3 of them fed
    mapping.write_text("model.layers.*.mlp.output.0: model.layers.*.mlp.output.0\n", encoding="utf-8")
    s = compare_run(npu, bench, str(tmp_path / "out2"), layer_mapping=str(mapping)).summary
    assert any("no input of Module.model.layers.0.mlp.forward.0, Module.model.layers.1.mlp.forward.0 is mapped" in n
               for n in s["notes"]), s["notes"]   # an output alone: said, as it is judged on it alone


def test_layer_mapping_bad_file_and_misuse(runs, tmp_path, capsys):
    """A mapping that is not one: one line naming the file and the key; --layer-mapping on
    dumps that are not two inference roots: refused, not ignored."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("model.layers.*.mlp.output.0: model.layers.mlp\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.yaml: 'model\.layers\.\*\.mlp\.output\.0'.*a row maps to a row"):
        compare_distributed(runs["batched"][0], runs["single"][0], str(tmp_path / "out"), verbose=False,
                            layer_mapping=str(bad))
    bad.write_text("model.layers.*.mlp: model.layers.0.mlp\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"as many \*"):
        compare_distributed(runs["batched"][0], runs["single"][0], str(tmp_path / "out"), verbose=False,
                            layer_mapping=str(bad))
    good = tmp_path / "good.yaml"
    good.write_text(MODULE_MAPPING, encoding="utf-8")
    one = os.path.join(runs["batched"][0], "step0", "rank", "dump.json")
    assert main(["compare", "--npu", one, "--bench", one, "-o", str(tmp_path / "o2"), "--layer-mapping", str(good)]) == 2
    assert "--layer-mapping" in capsys.readouterr().err
