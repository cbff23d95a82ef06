"""The report a user looks at: the HTML page in a real browser, the workbook's Summary.

A tiny HF GPT-2 is trained for two steps twice, dumped at level mix (so construct.json
gives the module tree); in the "NPU" run one call is faulty: the second LayerNorm call
(block 0's ln_2) has its output scaled by 1.01 by a TorchFunctionMode entered below the
debugger (see test_diagnosis). The page must name that call, in its module, and the
workbook must open on a Summary that links to its row.

Browser tests drive Debian's chromium through chromium-driver and selenium; without them
they skip with a one-line reason (``.ci/run`` installs them).
"""
import glob
import inspect
import logging
import os
import re

import openpyxl
import pytest
import torch
import torch.nn.functional as F
from headless_browser import headless_chromium, open_page
from test_diagnosis import Fault, scale_output

from probe.compare import compare
from probe.compare.construct import load_modules
from probe.compare.html_report import write_run_page

CULPRIT = "Functional.layer_norm.1.forward"      # the 2nd layer_norm call: transformer.h.0.ln_2
CULPRIT_MODULE = "transformer.h.0.ln_2 (LayerNorm)"
STEPS = 2


def gpt2_run(dump_path, fault=None):
    """Two training steps of a tiny GPT-2 (from a config), dumped at level mix; the fault,
    if any, is active in step 0. Returns step 0's dump.json."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from probe import PrecisionDebugger
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 12), generator=g)
    dbg = PrecisionDebugger(dump_path=str(dump_path), task="statistics", level="mix")
    try:
        for step in range(STEPS):
            with (fault if fault is not None and step == 0 else Fault()):
                dbg.start(model=model)
                try:
                    loss = model(ids, labels=ids).loss
                    loss.backward()
                finally:
                    dbg.stop()
            opt.step()
            opt.zero_grad()
            dbg.step()
    finally:
        dbg.close()
    found = glob.glob(os.path.join(str(dump_path), "step0", "*", "dump.json"))
    assert found, "the debugger wrote no dump.json"
    return found[0]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    bench = gpt2_run(root / "bench")
    npu = gpt2_run(root / "npu", Fault(F.layer_norm, 1, scale_output(1.01)))
    paths = compare({"npu_json_path": npu, "bench_json_path": bench, "is_print_compare_log": False},
                    str(root / "out"))
    xlsx, csv, html, summary = paths
    return {"root": root, "npu": npu, "xlsx": xlsx, "html": html, "summary": summary}


# ---------------------------------------------------------------- the workbook

def test_workbook_opens_on_a_readable_summary_linked_to_the_culprit(report):
    wb = openpyxl.load_workbook(report["xlsx"])
    assert wb.sheetnames == ["compare_result", "Summary", "Diagnosis"]   # msprobe's first sheet kept
    assert wb.active.title == "Summary"
    ws = wb["Summary"]
    # label and value side by side: a narrow label column, a wide wrapped value column
    assert ws.column_dimensions["A"].width <= 40 <= ws.column_dimensions["B"].width
    lines = {r[0].value: r[1] for r in ws.iter_rows(min_row=2)}
    assert lines["first divergence (forward)"].value.startswith(CULPRIT)
    assert lines["first divergence (forward): module"].value == CULPRIT_MODULE
    stack = lines["first divergence (forward): stack"]
    assert stack.alignment.wrap_text and "\n" in stack.value
    assert ws.row_dimensions[stack.row].height > 15 * 3        # tall enough for several lines
    assert all(r[1].alignment.wrap_text for r in ws.iter_rows(min_row=2))
    # the culprit's row, one click away
    link = lines["culprit row (click)"].hyperlink
    m = re.fullmatch(r"'compare_result'!A(\d+)", link.location)
    assert m, link.location
    target = wb["compare_result"][f"A{m.group(1)}"].value
    assert target.startswith(CULPRIT + ".output")
    # the chart sits below the text, not over it
    anchor = ws._charts[0].anchor._from
    assert anchor.row >= ws.max_row


def test_no_html_skips_the_page(report, tmp_path, caplog):
    from probe.cli import main
    caplog.set_level(logging.INFO, logger="probe")   # compare's answer is logged at INFO
    fault_npu = report["npu"]
    bench = fault_npu.replace(os.sep + "npu" + os.sep, os.sep + "bench" + os.sep)
    assert main(["compare", "--npu", fault_npu, "--bench", bench, "-o", str(tmp_path), "--no-html"]) == 0
    assert not glob.glob(str(tmp_path / "*.html")) and glob.glob(str(tmp_path / "*.xlsx"))
    said = [r.getMessage() for r in caplog.records if r.name == "probe.compare.entry_points"]
    verdict = [line for line in said if "verdict:" in line]
    assert len(verdict) == 1 and CULPRIT in verdict[0] and CULPRIT_MODULE in verdict[0]


def test_page_is_one_file_with_no_network(report):
    with open(report["html"], encoding="utf-8") as fh:
        page = fh.read()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert '<script type="application/json" id="data">' in page and CULPRIT in page
    latest = os.path.join(os.path.dirname(report["html"]), "compare_report.html")
    with open(latest, encoding="utf-8") as fh:
        assert fh.read() == page            # the fixed name is the latest compare's page


# ---------------------------------------------------------------- the browser

@pytest.fixture(scope="module")
def browser():
    d = headless_chromium(console_log=True)
    yield d
    d.quit()


def _open(browser, path):
    open_page(browser, path)


def _errors(browser):
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _visible_rows(browser):
    return browser.execute_script(
        "return [...document.querySelectorAll('#spacer .tr')].map(r => r.children[1].textContent)")


def test_page_names_the_culprit_and_links_tree_chart_table(report, browser, tmp_path):
    _open(browser, report["html"])
    assert _errors(browser) == []
    from selenium.webdriver.common.by import By
    banner = browser.find_element(By.ID, "verdict").text
    assert CULPRIT in browser.find_element(By.ID, "culprit").text
    assert CULPRIT_MODULE in banner and "step / rank" in banner and "0 /" in banner
    # the chart marks the culprit
    mark = browser.find_element(By.ID, "culpritmark")
    assert mark.is_displayed() and CULPRIT in mark.text
    # on load the culprit is selected everywhere: its tree node, its rows
    assert browser.execute_script("return document.body.dataset.selected") == CULPRIT
    sel = browser.find_element(By.CSS_SELECTOR, ".nrow.sel").text
    assert sel.startswith("ln_2")
    assert any(r.startswith(CULPRIT) for r in _visible_rows(browser))
    total = browser.execute_script("return R.c.length")
    # a click on a tree node filters the table to that module's calls
    node = next(e for e in browser.find_elements(By.CSS_SELECTOR, "#tree .nrow")
                if e.find_element(By.CSS_SELECTOR, ".lbl").text.startswith("lm_head"))
    node.click()
    count = browser.find_element(By.ID, "count").text
    shown = int(count.split()[0])
    assert 0 < shown < total and f"of {total}" in count
    inside = {e for e, m in load_modules(report["npu"]).items() if m.startswith("lm_head")}
    rows = _visible_rows(browser)
    assert rows
    for name in rows:
        assert any(name.startswith(e + ".") for e in inside), name
    # a click on a table row selects its call everywhere
    browser.find_elements(By.CSS_SELECTOR, "#spacer .tr")[0].click()
    picked = browser.execute_script("return document.body.dataset.selected")
    assert picked and rows[0].startswith(picked)
    assert _errors(browser) == []
    shot = tmp_path / "report.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


_CUT_CELLS = """return [...document.querySelectorAll('#thead div, #spacer .tr div')]
    .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)"""


def test_page_table_shows_whole_names_and_numbers_in_a_tall_table(report, browser):
    _open(browser, report["html"])
    from selenium.webdriver.common.by import By
    # first line: what to open next (the culprit is selected below; the workbook beside the page)
    first = browser.find_element(By.ID, "next")
    assert browser.execute_script("return document.body.firstElementChild.id") == "next"
    assert CULPRIT in first.text and os.path.basename(report["xlsx"]) in first.text
    # no cell is cut, whatever row is in view: names (input.0 vs input.1 vs keywords) and metrics
    n = browser.execute_script("return state.view.length")
    box_h = browser.execute_script("return document.getElementById('tbl').clientHeight")
    for top in range(0, n * 22, max(22, box_h - 66)):
        browser.execute_script("document.getElementById('tbl').scrollTop = arguments[0]; renderRows(true)", top)
        assert browser.execute_script(_CUT_CELLS) == [], top
    browser.execute_script("document.getElementById('tbl').scrollTop = 0; renderRows(true)")
    names = browser.execute_script("return Array.from({length: NR}, (_, i) => rowName(i))")
    assert any(".input.1" in x for x in names) and max(map(len, names)) > 45
    # one scroller, the table, in the window: its scrollbars at its own edges (not two stacked
    # horizontal ones); scrolled to its end it shows the last metric column whole
    geo = browser.execute_script("""const t = document.getElementById('tbl'), b = document.getElementById('tbody');
        t.scrollLeft = t.scrollWidth;
        const last = document.querySelector('#thead div:last-child').getBoundingClientRect(), box = t.getBoundingClientRect();
        const r = [getComputedStyle(b).overflowX, getComputedStyle(b).overflowY, Math.round(last.right),
                   Math.round(box.left + t.clientLeft + t.clientWidth), Math.round(box.right), window.innerWidth];
        t.scrollLeft = 0;
        return r""")
    assert geo[:2] == ["visible", "visible"] and geo[2] <= geo[3] + 1 and geo[4] <= geo[5], geo
    # the header's columns sit over the body's
    lefts = browser.execute_script("""const left = e => Math.round(e.getBoundingClientRect().left);
        return [[...document.querySelectorAll('#thead div')].map(left),
                [...document.querySelector('#spacer .tr').children].map(left)]""")
    assert lefts[0] == lefts[1]
    # the table fills the window when scrolled to, with nothing below it
    geo = browser.execute_script("""const p = document.getElementById('rowspanel').getBoundingClientRect();
        return [document.getElementById('tbl').clientHeight, window.innerHeight,
                document.documentElement.scrollHeight - (p.bottom + window.scrollY)]""")
    assert geo[0] >= geo[1] - 200 and geo[2] < 40, geo
    # dtypes as dtypes: a Python scalar's is "int", not "<class 'int'>"
    dtypes = browser.execute_script("return H.dtypes")
    assert not any("<class" in str(d) for d in dtypes) and "int" in dtypes, dtypes
    # a number that rounds to 1 at 4 digits is not shown as 1
    assert browser.execute_script("return [fmt(0.99999), fmt(1), fmt(0.5)]") == ["0.99999", "1", "0.5"]
    assert _errors(browser) == []


def test_run_page_grid_links_each_pair(report, browser, tmp_path):
    run = {"schema": "probe.run_summary/1", "npu_root": "npu", "bench_root": "bench",
           "first_divergence": {"name": CULPRIT, "step": 0, "rank": 1, "direction": "forward",
                                "kind": "introduced", "reason": "output error jumps",
                                "report": report["summary"], "html": report["html"]},
           "steps": [0, 1], "ranks": [0, 1],
           "grid": [{"step": 0, "rank": 0, "verdict": "clean", "first": None, "report": None, "html": None},
                    {"step": 0, "rank": 1, "verdict": "introduces", "first": CULPRIT,
                     "report": report["summary"], "html": report["html"]},
                    {"step": 1, "rank": 0, "verdict": "inherits", "first": None, "report": None, "html": None}],
           "notes": ["rank 1 step 1 was not dumped"]}
    page = write_run_page(run, str(tmp_path / "run" / "run_report.html"))
    _open(browser, page)
    assert _errors(browser) == []
    from selenium.webdriver.common.by import By
    cells = browser.find_elements(By.CSS_SELECTOR, "#grid td")
    assert [c.get_attribute("class") for c in cells] == ["clean", "introduces first", "inherits", "missing"]
    href = cells[1].find_element(By.TAG_NAME, "a").get_attribute("href")
    assert href.startswith("file://") and os.path.samefile(href[len("file://"):], report["html"])
    assert CULPRIT in browser.find_element(By.ID, "culprit").text
    # first line: what to open next, the first divergence's pair page
    assert browser.execute_script("return document.body.firstElementChild.id") == "next"
    nxt = browser.find_element(By.ID, "nextlink").get_attribute("href")
    assert os.path.samefile(nxt[len("file://"):], report["html"])


def test_run_page_refuses_a_bad_summary(tmp_path):
    with pytest.raises(ValueError, match="schema"):
        write_run_page({"grid": []}, str(tmp_path / "x.html"))
    with pytest.raises(ValueError, match="verdict 'odd'"):
        write_run_page({"schema": "probe.run_summary/1", "grid": [{"step": 0, "rank": 0, "verdict": "odd"}]},
                       str(tmp_path / "x.html"))


def test_page_data_written_in_pieces_is_the_data_escaped_whole(tmp_path, monkeypatch):
    """A page's data is escaped and written a piece at a time (a big page's escaped copy was
    a tenth of a 100k-entry compare's peak memory): pieces of a few bytes, cut next to
    "</script>", U+2028/2029 and multi-byte characters, write the bytes the whole data
    escaped at once writes, and the page's data still holds no unsafe character."""
    from probe.compare import html_report
    hostile = "</script><!--é\u2028中\u2029&>😀-->" * 3
    run = {"schema": "probe.run_summary/1", "npu_root": hostile, "bench_root": "b",
           "first_divergence": None, "steps": [0], "ranks": [0], "notes": [hostile, hostile[5:]],
           "grid": [{"step": 0, "rank": 0, "verdict": "clean", "first": hostile, "report": None, "html": None}]}
    write_run_page(run, str(tmp_path / "whole.html"))
    whole = (tmp_path / "whole.html").read_bytes()
    for size in (1, 2, 3, 7):
        monkeypatch.setattr(html_report, "_PIECE", size)
        write_run_page(run, str(tmp_path / "p.html"))
        assert (tmp_path / "p.html").read_bytes() == whole, size
    data = whole.split(b'id="data">', 1)[1].split(b"</script>", 1)[0]
    assert b'"npu_root":"\\u003c/script\\u003e' in data            # the whole data, before the block ends
    for unsafe in (b"<", b">", b"&", "\u2028".encode(), "\u2029".encode()):
        assert unsafe not in data
    assert "中".encode() in data and "😀".encode() in data


def _line_of(func, text):
    """The line number of the first line of ``func``'s source that holds ``text``."""
    lines, start = inspect.getsourcelines(func)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_demo_injects_a_kernel_fault_and_names_it(tmp_path, capsys, caplog):
    import json

    from probe.demo import FAULT_CALL, DemoBlock, run_demo
    caplog.set_level(logging.INFO, logger="probe")
    paths = run_demo(str(tmp_path / "demo"))
    assert "injecting one kernel fault" in capsys.readouterr().err     # the demo script's own line
    said = [r.getMessage() for r in caplog.records if r.name == "probe.compare.entry_points"]   # compare's answer
    verdict = [line for line in said if "verdict:" in line]
    assert len(verdict) == 1 and FAULT_CALL in verdict[0]
    # the first line says what to open next: the page, and the workbook for every column
    assert said[0] == f"[probe compare] open {paths[2]} (the page; every column: {paths[0]})", said[0]
    # the culprit's line is the demo model's own F.gelu call, not the training loop's model(tokens)
    gelu_line = _line_of(DemoBlock.forward, "F.gelu(")
    assert f"demo.py:{gelu_line} in forward" in verdict[0], verdict[0]
    with open(paths[-1], encoding="utf-8") as fh:
        assert json.load(fh)["first_divergence"]["forward"]["npu_name"] == FAULT_CALL
    # stack.json keeps the model's frames (they live in probe/demo.py): the gelu call's innermost frame is forward's
    with open(tmp_path / "demo" / "npu_dump" / "step0" / "rank" / "stack.json", encoding="utf-8") as fh:
        stacks = json.load(fh)
    (frames,) = [frames for names, frames in stacks.values() if FAULT_CALL in names]
    assert frames[0].startswith(f"File {inspect.getsourcefile(DemoBlock)}, line {gelu_line}, in forward"), frames[0]
    # ...so calls on different lines of forward are no longer one stack
    (names,) = [names for names, _ in stacks.values() if FAULT_CALL in names]
    assert "Tensor.chunk.0.forward" not in names and "Functional.softmax.0.forward" not in names
    wb = openpyxl.load_workbook(paths[0])
    lines = {r[0].value: r[1].value for r in wb["Summary"].iter_rows(min_row=2)}
    assert lines["first divergence (forward)"].startswith(FAULT_CALL)
    with open(paths[2], encoding="utf-8") as fh:
        assert FAULT_CALL in fh.read()
