"""A dump from someone else is untrusted input (issue 45): nothing probe writes from it (a
repro script, the report page, the workbook, the CSV) runs code from it, every output is
written whole or not at all, and a main sheet past Excel's row limit is split.

The dumps are real ones (a small net trained under the debugger, msprobe's fixtures) whose
names and values are then edited the way a hostile sender would.
"""
import ast
import csv
import glob
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile

import openpyxl
import pytest
import torch
from headless_browser import headless_chromium, open_page

from probe.cli import main as cli_main
from probe.debugger import PrecisionDebugger

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "msprobe")
MARKER = "PWNED"
# Python that makes the marker file, wrapped in every quote a generated string could use
CODE = f"__import__('pathlib').Path('{MARKER}').touch()"
PAYLOADS = [f'"""\n{CODE}\n"""', f"'''\n{CODE}\n'''", f'x"""; {CODE}; """', f"\\\"\"\"\r\n{CODE}  # \\",
            f'"\n{CODE}\n#"', "\ud800 lone surrogate"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(x))


def _tensor_dump(path):
    torch.manual_seed(0)
    model = Net()
    d = PrecisionDebugger(task="tensor", dump_path=str(path), level="L1")
    d.start()
    model(torch.randn(4, 8)).sum().backward()
    d.stop()
    d.step()
    (found,) = glob.glob(os.path.join(str(path), "step0", "*", "dump.json"))
    return found


def _run(script, cwd):
    return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=180, cwd=str(cwd),
                          env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})


# ---------------------------------------------------------------- repro scripts

def test_repro_script_keeps_hostile_values_as_text(tmp_path):
    dump_json = _tensor_dump(tmp_path / "dump")
    with open(dump_json, encoding="utf-8") as fh:
        doc = json.load(fh)
    entry = doc["data"]["Functional.gelu.0.forward"]
    x = entry["input_args"][0]
    # an argument the script cannot rebuild (its note quotes the value), an argument name,
    # a data_name the reader refuses (its note quotes the exception), a shape that is not
    # the file's (its note quotes the shape): each carries every payload
    for k, p in enumerate(PAYLOADS):
        entry["input_kwargs"][f"odd{k}"] = {"type": "complex", "value": p}
    entry["input_kwargs"][PAYLOADS[0]] = {"type": "int", "value": 1}
    out = entry["output"][0]
    out["shape"] = PAYLOADS[2]
    grad = dict(x, data_name="../" + PAYLOADS[0])
    doc["data"]["Functional.gelu.0.forward"]["input_kwargs"]["odd_tensor"] = grad
    with open(dump_json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)                       # ensure_ascii: the lone surrogate as \ud800
    script = tmp_path / "r.py"
    assert cli_main(["repro", str(tmp_path / "dump"), "--api", "Functional.gelu.0.forward", "-o", str(script)]) == 0
    text = script.read_text(encoding="utf-8")
    tree = ast.parse(text)                        # valid Python
    header = ast.get_docstring(tree, clean=False)
    # every payload is in the docstring, as text (its repr, one line); none made a statement
    for p in PAYLOADS:
        assert repr(p)[:50] in header, p
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "__import__"]
    assert calls == []
    proc = _run(str(script), tmp_path)
    assert not (tmp_path / MARKER).exists(), proc.stdout + proc.stderr
    # the script still runs the call (the odd arguments are None: gelu refuses them)
    assert "== Functional.gelu.0.forward on cpu" in proc.stdout, proc.stderr


def test_repro_refuses_an_entry_that_is_not_a_plain_api(tmp_path, capsys):
    """The script calls the entry's API by name: a name that is not identifiers between
    dots would be code in the script."""
    dump_json = _tensor_dump(tmp_path / "dump")
    with open(dump_json, encoding="utf-8") as fh:
        doc = json.load(fh)
    bad = {"Custom.x;__import__('os').system('touch PWNED');y.op.0.forward": "custom op",
           "Functional.gelu(__import__('os').system('touch PWNED')).0.forward": "not an API name"}
    for name in bad:
        doc["data"][name] = doc["data"]["Functional.gelu.0.forward"]
    with open(dump_json, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    for name, said in bad.items():
        assert cli_main(["repro", str(tmp_path / "dump"), "--api", name, "-o", str(tmp_path / "c.py")]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c.py").exists() and not glob.glob(str(tmp_path / "c.py.*"))


# ---------------------------------------------------------------- compare outputs

# Entry names as a hostile sender would write them: each breaks out of a context of the page
# (single-quoted attribute, script block) or starts a spreadsheet formula; one holds a lone
# surrogate. Both sides are renamed alike, so the calls still pair.
RENAME = {
    "Functional.linear.0.forward":
        "Functional.lin' tabindex='1' autofocus onfocus='window.PWNED=1;document.title=\"pwned\"' x='.0.forward",
    "Functional.relu.0.forward": "Functional.</script><script>window.PWNED=2</script><!--\u2028.0.forward",
    "Functional.linear.1.forward": "=HYPERLINK(\"http://evil\",\"x\").0.forward",
    "Tensor.__add__.0.forward": "@SUM(1+1).0.forward",
    "Functional.linear.2.forward": "+1+1.0.forward",
    "Functional.relu.1.forward": "-1+1.0.forward",
    "Functional.linear.3.forward": "\t=1+1.0.forward",
    "Functional.layer_norm.0.forward": "Functional.layer_norm\ud800.0.forward",
}
# the user's frame of the first calls, in stack.json: the page's tree shows file and function
FRAME, HOSTILE_FRAME = ("tiny_model.py, line 16, in forward",
                        "<img src=x onerror=window.PWNED=4>.py, line 16, in f' onmouseover='window.PWNED=3' x='")
FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _hostile_side(fixture, out):
    shutil.copytree(os.path.join(FIXTURES, fixture), out)
    (dump_json,) = glob.glob(os.path.join(str(out), "step0", "*", "dump.json"))
    with open(dump_json, encoding="utf-8") as fh:
        doc = json.load(fh)
    doc["data"] = {RENAME.get(k, k): v for k, v in doc["data"].items()}
    stack_json = os.path.join(os.path.dirname(dump_json), "stack.json")
    with open(stack_json, encoding="utf-8") as fh:
        stacks = json.load(fh)
    for names, frames in stacks.values():
        names[:] = [RENAME.get(n, n) for n in names]
        frames[:] = [f.replace(FRAME, HOSTILE_FRAME) for f in frames]
    for path, data in ((dump_json, doc), (stack_json, stacks)):
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)            # ensure_ascii: the lone surrogate as the escape \ud800
    return dump_json


def _hostile_pair(root):
    """msprobe's bf16 run against its fp32 run (158 rows), renamed as RENAME says."""
    return (_hostile_side("v26_L1_statistics_bf16", root / "npu"),
            _hostile_side("v26_L1_statistics_fp32", root / "bench"))


def _compare(npu, bench, out):
    from probe.compare import compare
    return compare({"npu_json_path": npu, "bench_json_path": bench, "is_print_compare_log": True}, str(out))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    npu, bench = _hostile_pair(root)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("probe").addHandler(handler)
    try:
        paths = _compare(npu, bench, root / "out")
    finally:
        logging.getLogger("probe").removeHandler(handler)
    return {"root": root, "npu": npu, "bench": bench, "paths": paths, "log": [r.getMessage() for r in records]}


def test_compare_writes_hostile_names_with_lone_surrogates_replaced(hostile):
    xlsx, csv_path, html, summary = hostile["paths"]
    said = [m for m in hostile["log"] if "lone surrogates" in m]
    assert len(said) == 1 and str(hostile["root"] / "out") in said[0], said       # once, naming the folder
    with open(summary, encoding="utf-8") as fh:
        text = fh.read()
    assert "\\ud800" not in text and "Functional.layer_norm\ufffd.0.forward" in json.dumps(
        json.loads(text), ensure_ascii=False)
    with open(csv_path, encoding="utf-8", newline="") as fh:
        names = {row[0] for row in csv.reader(fh)}
    assert "Functional.layer_norm\ufffd.0.forward.output.0" in names
    with open(html, encoding="utf-8") as fh:
        assert "Functional.layer_norm\ufffd.0.forward" in fh.read()
    # nothing but the outputs and the latest copies: no temporary file left
    assert sorted(os.listdir(os.path.dirname(xlsx))) == sorted(
        [os.path.basename(p) for p in hostile["paths"]] + ["compare_report.html", "compare_summary.json"])


def _number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def test_workbook_and_csv_neutralise_formulas(hostile):
    xlsx, csv_path = hostile["paths"][:2]
    wb = openpyxl.load_workbook(xlsx)
    texts, negatives = [], 0
    for ws in wb.worksheets:
        for row in ws.iter_rows():
            for cell in row:
                assert cell.data_type != "f", (ws.title, cell.coordinate, cell.value)
                if isinstance(cell.value, str):
                    texts.append(cell.value)
                elif isinstance(cell.value, (int, float)) and cell.value < 0:
                    negatives += 1
    assert negatives > 0                                      # numbers stay numbers, negative ones too
    assert not [t for t in texts if t.startswith(FORMULA)]
    for hostile_name in ("=HYPERLINK(", "@SUM(1+1)", "+1+1.", "-1+1.", "\t=1+1."):
        assert any(t.startswith("'" + hostile_name) for t in texts), hostile_name
    with open(csv_path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    fields = [f for row in rows[1:] for f in row]
    assert not [f for f in fields if f.startswith(FORMULA) and not _number(f)]
    assert any(f.startswith("-") and _number(f) for f in fields)
    assert {row[0] for row in rows[1:]} >= {"'=HYPERLINK(\"http://evil\",\"x\").0.forward.output.0",
                                           "'-1+1.0.forward.output.0"}


# ---------------------------------------------------------------- the page, in Chromium

@pytest.fixture(scope="module")
def browser():
    d = headless_chromium()
    yield d
    d.quit()


def _open(browser, path):
    open_page(browser, path)


def _untouched(browser, title):
    """No injected script ran: no global set, the title as the page wrote it."""
    assert browser.execute_script("return typeof window.PWNED") == "undefined"
    assert browser.title == title
    assert browser.execute_script("return document.querySelectorAll('img, [onfocus], [onmouseover], [autofocus]').length") == 0


def test_page_shows_hostile_names_as_text_and_runs_none(hostile, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    html = hostile["paths"][2]
    _open(browser, html)
    title = "probe compare: dump.json"
    time.sleep(0.3)                       # an autofocus would have fired by now
    _untouched(browser, title)
    # the names are in the rows as text, whole
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#spacer .tr')].map(r => r.children[1].textContent)")
    for name in list(RENAME.values())[:2]:
        assert any(r.startswith(name[:-len(".0.forward")]) for r in rows), name
    assert any(r.startswith("=HYPERLINK(") for r in rows)         # the page shows names as they are
    # the tree shows the hostile frame as text too: hover, focus and click everything
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#tree .lbl")]
    assert any("<img src=x onerror=window.PWNED=4>.py" in x for x in labels), labels
    browser.execute_script("const all = n => { toggle(n, true); n.kids.forEach(all); }; root.kids.forEach(all)")
    for k in range(len(browser.find_elements(By.CSS_SELECTOR, "#tree .nrow"))):
        node = browser.find_elements(By.CSS_SELECTOR, "#tree .nrow")[k]
        if node.is_displayed():
            ActionChains(browser).move_to_element(node).click(node).perform()
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#tree .lbl")]
    assert any("f' onmouseover='window.PWNED=3' x=' (line 16)" in x for x in labels), labels
    for k in range(12):                   # each click renders the rows again: found anew
        rows = browser.find_elements(By.CSS_SELECTOR, "#spacer .tr")
        if k < len(rows):
            ActionChains(browser).move_to_element(rows[k]).click(rows[k]).perform()
    browser.execute_script("document.querySelectorAll('#spacer .tr, #spacer .tr div').forEach(e => e.focus())")
    _untouched(browser, title)
    assert browser.execute_script("return document.body.dataset.selected")     # the clicks selected calls
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_run_page_links_stay_links(hostile, browser, tmp_path):
    from probe.compare.html_report import write_run_page
    name = RENAME["Functional.linear.0.forward"]
    folder = tmp_path / "javascript:window.PWNED=5;//"      # a folder name that reads as a URL scheme
    folder.mkdir()
    page = shutil.copy(hostile["paths"][2], folder / "p.html")
    run = {"schema": "probe.run_summary/1", "npu_root": "</title><script>window.PWNED=6</script>",
           "bench_root": "b", "steps": [0], "ranks": [0],
           "first_divergence": {"name": name, "step": 0, "rank": 0, "direction": "forward",
                                "kind": "introduced", "reason": "</script><script>window.PWNED=7</script>",
                                "report": None, "html": str(page)},
           "grid": [{"step": 0, "rank": 0, "verdict": "introduces", "first": name, "report": None,
                     "html": str(page)}],
           "notes": ["\ud800 <b>note</b>"]}
    out = write_run_page(run, str(tmp_path / "run.html"))
    _open(browser, out)
    from selenium.webdriver.common.by import By
    assert browser.find_element(By.ID, "culprit").text == name
    link = browser.find_element(By.ID, "nextlink")
    assert link.get_attribute("href").startswith("file://")
    link.click()                          # opens the pair's page, runs nothing
    _open(browser, str(page))
    _untouched(browser, "probe compare: dump.json")


# ---------------------------------------------------------------- written whole

def test_a_failed_compare_leaves_the_previous_outputs_as_they_were(hostile, tmp_path, monkeypatch):
    from probe.compare import summary_json
    out = tmp_path / "out"
    _compare(hostile["npu"], hostile["bench"], out)
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}

    def disk_full(path, summary):         # the last file of a compare: written half, then the disk is full
        with open(path, "w", encoding="utf-8") as fh:
            fh.write('{"schema": ')
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(summary_json, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _compare(hostile["npu"], hostile["bench"], out)
    after = {name: (out / name).read_bytes() for name in os.listdir(out)}
    assert after == before            # no new file, no temporary one, the latest page and summary kept


# ---------------------------------------------------------------- Excel's row limit

def test_rows_past_excels_limit_are_split_over_sheets(hostile, tmp_path, monkeypatch, caplog):
    from probe.compare.report import MAIN_SHEET
    from probe.compare.xlsx import sheets
    caplog.set_level(logging.INFO, logger="probe")
    monkeypatch.setattr(sheets, "EXCEL_MAX_ROWS", 51)           # 50 rows a sheet: 158 rows are 4 sheets
    xlsx, csv_path, _, summary = _compare(hostile["npu"], hostile["bench"], tmp_path / "out")
    with open(csv_path, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))
    assert len(rows) == 159                                       # the CSV holds them all
    wb = openpyxl.load_workbook(xlsx)
    parts = [MAIN_SHEET] + [f"{MAIN_SHEET} ({k})" for k in (2, 3, 4)]
    assert wb.sheetnames == parts + ["Summary", "Diagnosis"] and wb.active.title == "Summary"
    names = []
    for name in parts:
        ws = wb[name]
        assert [c.value for c in ws[1]] == rows[0] and ws.max_row <= 51
        names += [r[0].value for r in ws.iter_rows(min_row=2)]
    assert names == [r[0] for r in rows[1:]]                      # in order, none lost or repeated
    # every row's place, as the Summary's links give it
    for k in (0, 49, 50, 157):
        sheet, _, cell = sheets.row_link(MAIN_SHEET, k).rpartition("!")
        assert wb[sheet.strip("'")][cell].value == rows[k + 1][0], k
    # said in the Summary, the summary json and the console
    note = [r[1].value for r in wb["Summary"].iter_rows(min_row=2) if r[0].value == "note"]
    assert any("158 rows are past Excel's 51 rows a sheet" in n and "4 sheets" in n for n in note), note
    with open(summary, encoding="utf-8") as fh:
        assert any("4 sheets" in n for n in json.load(fh)["notes"])
    said = [r.getMessage() for r in caplog.records if "4 sheets" in r.getMessage()]
    assert any(m.startswith("[probe compare]") for m in said), said


def test_a_whole_run_writes_hostile_names_too(hostile, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from probe.compare import compare_run
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    with ThreadPoolExecutor(1) as pool:
        run = compare_run(str(hostile["root"] / "npu"), str(hostile["root"] / "bench"), str(tmp_path / "out"),
                          executor=pool)
    assert [o.error for o in run.outcomes] == [None]              # the pair was written, not lost
    table = pq.read_table(str(tmp_path / "out" / "diagnosis.parquet")).to_pydict()
    assert "Functional.layer_norm\ufffd.0.forward" in table["npu_entry"]
    assert any(p.endswith(".xlsx") and "compare_run_" in p for p in run.paths)


def test_both_joins_write_hostile_cells_alike(tmp_path, monkeypatch):
    """The C join and its Python twin give the same workbook and CSV for hostile texts
    (formula leads, a lone surrogate, quotes, NUL-free control characters)."""
    from probe.compare.xlsx import Sheet, cells, write_workbook
    try:
        from probe.compare.xlsx._cjoin import join_rows as c_join
    except ImportError:
        pytest.skip("the C join is not built")
    texts = list(RENAME.values()) + ["=1+1", "-", "+", "@x", "\r=x", "plain", "'=already", "a\u2028b"]
    n = len(texts) * 40
    cols = [[texts[k % len(texts)] + ("" if k % 3 else f".{k}") for k in range(n)],
            [float(-k) / 7 for k in range(n)], [texts[k % 5] for k in range(n)]]
    out = {}
    for label, join in (("c", c_join), ("py", cells.join_rows_py)):
        monkeypatch.setattr(cells, "join_rows", join)
        xlsx, csv_path = tmp_path / f"{label}.xlsx", tmp_path / f"{label}.csv"
        write_workbook(str(xlsx), [Sheet("rows", ["name", "x", "repeated"], cols, csv_path=str(csv_path))])
        with zipfile.ZipFile(xlsx) as z:
            out[label] = ([z.read(m) for m in sorted(z.namelist())], csv_path.read_bytes())
    assert out["c"] == out["py"]
    ws = openpyxl.load_workbook(str(tmp_path / "c.xlsx"))["rows"]
    values = [[c.value for c in row] for row in ws.iter_rows(min_row=2)]
    assert all(isinstance(v[1], float) for v in values) and values[1][1] < 0      # numbers stay numbers
    assert not [v for row in values for v in (row[0], row[2]) if v.startswith(FORMULA)]
    assert any("\ufffd" in row[0] for row in values)
    with open(tmp_path / "c.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))[1:]
    want = [("'" + t if t.startswith(FORMULA) else t).replace("\ud800", "\ufffd") for t in cols[0]]
    assert [r[0] for r in rows] == want
    assert [v[0] for v in values] == [t.replace("\r", "\n") for t in want]    # XML reads a CR as LF
