"""The compare report as one self-contained HTML page (``compare_report_*.html``), and the
page of a whole run (``write_run_page``).

One file that opens by double-click: no server, no network, no third-party script. The
page's CSS and JavaScript live in ``assets/`` (package data) and are inlined; the data is
inlined as compact columnar JSON in a ``<script type="application/json">`` block: per call
(name, direction, verdict, input and output error, module or stack group) and per row
(its call, the rest of its name, result, dtype, shape, a few metrics at 4 significant
digits), with repeated texts as indices into small tables. The 100k-entry pair's page is
about 20 MB and the table only ever puts the visible rows into the DOM.
"""
from __future__ import annotations

import base64
import os
import re
from importlib import resources
from itertools import chain, repeat
from operator import getitem
from urllib.parse import quote

import numpy as np
import orjson

from .call_fields import CallFields
from .codes import codes
from .summary_json import StackLookup
from .xlsx.cells import code_array, tail_code_array
from probe import lone_surrogates
from probe.errors import ConfigError
from probe.written_whole import replaced_when_written
from probe.vocabulary import PAGE_METRICS, PAGE_STATUSES, RUN_VERDICTS

STATUS = list(PAGE_STATUSES)
_FRAME = re.compile(r'File "?(?P<file>[^",]+)"?, line (?P<line>\d+), in (?P<func>[^,\n]+)')
_LIBRARY = re.compile(r"[/\\](torch|torch_npu|msprobe)[/\\]|<frozen ")
# probe's own files by its folder, not by a path holding "probe" (a clone named probe holds
# the user's scripts too); its demo model is user code. stack.json leaves probe's frames out
# already: this is for stacks written by older versions.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DEMO = _PACKAGE + "demo.py"
_STEP = re.compile(r"(?:^|[/\\])step(\d+)(?:[/\\]|$)")
_RANK = re.compile(r"(?:^|[/\\])(?:rank|proc)(\d*)(?:[/\\]|$)")


def user_frame(stack: str | None) -> str | None:
    """The innermost frame of ``stack`` outside torch and probe (and msprobe, torch_npu):
    the line of the model's code that made the call ("modeling_gpt2.py:42 in forward")."""
    if not stack:
        return None
    frames = [m for m in _FRAME.finditer(stack)]
    for m in frames:                         # msprobe's stacks list the innermost first
        file = m.group("file")
        if not _LIBRARY.search(file) and (not file.startswith(_PACKAGE) or file == _DEMO):
            return f"{m.group('file')}:{m.group('line')} in {m.group('func').strip()}"
    return None


def step_rank(path: str | None) -> tuple:
    """(step, rank) from a dump path's step*/rank* folders, None where absent."""
    if not path:
        return None, None
    s, r = _STEP.findall(path), _RANK.findall(path)
    step = int(s[-1]) if s else None
    rank = (int(r[-1]) if r[-1] else 0) if r else None
    return step, rank


def _b64(values, dtype: str) -> dict:
    """A column as a typed array for the page: little-endian bytes in base64 (f8, f4, i4,
    u2, u1), decoded by the page into a Float64Array etc. Numbers cost 4-8 bytes and no
    formatting; NaN, None and infinities survive (None as NaN)."""
    if dtype[0] == "f":
        try:
            arr = np.array(values, dtype=np.float64)
        except (TypeError, ValueError):              # a text among the numbers
            arr = np.array([v if isinstance(v, (int, float)) and v is not None else np.nan
                            for v in values], dtype=np.float64)
    else:
        arr = np.asarray(values)
    arr = arr.astype("<" + dtype)
    return {"t": dtype, "b": base64.b64encode(arr.tobytes()).decode("ascii")}


def _small(arr) -> dict:
    """Non-negative integer codes in the narrowest typed array that holds them."""
    top = int(arr.max()) if len(arr) else 0
    return _b64(arr, "u1" if top < 256 else "u2" if top < 65536 else "i4")


def _module_path(label: str) -> list:
    """``transformer.h.0.attn.c_attn (Conv1D)`` -> [transformer, h.0, attn, c_attn (Conv1D)]."""
    path, _, cls = label.partition(" (")
    parts: list = []
    for p in path.split("."):
        if p.isdigit() and parts:
            parts[-1] += "." + p
        else:
            parts.append(p)
    if cls:
        parts[-1] += " (" + cls
    return parts


def _groups(result, fields: CallFields) -> tuple:
    """Per call a group id, the groups' paths and what they are: modules (construct.json
    of an L0/mix dump) or, for L1, the user's file and function from stack.json."""
    calls, modules = fields.calls, fields("module")
    if any(modules):
        paths, ids = codes((tuple(_module_path(m)) if m else ("(outside any module)",) for m in modules),
                           len(calls))
        return ids, [list(p) for p in paths], "module"
    stack = StackLookup(result.stack_path)
    if not stack.stacks:        # no stack.json: one group, as each call's frame() would say
        return np.zeros(len(calls), np.uint8), [["(no stack)"]] if calls else [], "stack file"
    frames: dict = {}

    def frame(text) -> tuple:        # (file, function (line)) of a call's user frame
        key = frames.get(text)
        if key is None:
            f = user_frame(text)
            if f is None:
                key = ("(no stack)",) if not text else ("(library code)",)
            else:
                where, _, func = f.partition(" in ")
                file, _, line = where.rpartition(":")
                key = (os.path.basename(file), f"{func} (line {line})")
            frames[text] = key
        return key
    paths, ids = code_array(frame(stack(a) or stack(b)) for a, b in zip(fields("npu_entry"), fields("bench_entry")))
    return ids, [list(p) for p in paths], "stack file"


def _verdict(result, digest, fields: CallFields) -> dict | None:
    if not digest:
        return None
    fd = digest["first_divergence"]
    rec = fd["forward"] or fd["backward"]
    if rec is None:
        return None
    out = {k: rec.get(k) for k in ("npu_name", "bench_name", "direction", "kind", "module",
                                   "input_error", "output_error", "threshold", "position")}
    out["frame"] = user_frame(rec.get("stack"))
    w = rec.get("worst_output") or {}
    out["worst_row"] = w.get("npu_row") or w.get("bench_row")
    out["metrics"] = {k: v for k, v in (w.get("metrics") or {}).items() if v is not None}
    out["reason"] = rec.get("reason") or _reason(rec)
    out["call"] = _position(fields("index"), rec["position"])
    other = fd["backward"] if rec is fd["forward"] else None
    if other:
        out["backward"] = {"name": other["npu_name"] or other["bench_name"], "kind": other["kind"],
                           "call": _position(fields("index"), other["position"])}
    return out


def _position(indices: list, position) -> int | None:
    """Where the call at ``position`` of the aligned sequence is among the calls, or None."""
    try:
        return indices.index(position)
    except ValueError:
        return None


def _fmt(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _reason(rec) -> str:
    i, o, t = rec.get("input_error"), rec.get("output_error"), rec.get("threshold")
    if rec.get("kind") == "introduced":
        if isinstance(i, float) and i > 0 and isinstance(o, float):
            return (f"its output error {_fmt(o)} is {o / i:.3g}x its input error {_fmt(i)} and above "
                    f"the {_fmt(t)} its dtype explains: this call made the error.")
        return (f"its inputs match but its output error {_fmt(o)} is above the {_fmt(t)} its dtype "
                f"explains: this call made the error.")
    return (f"its inputs already differ (input error {_fmt(i)}) though no compared call before it "
            "introduced error: look at unmatched calls before it, the weights or the input data.")


_PY_TYPE = re.compile(r"^<class '(?:builtins\.)?([\w.]+)'>$")


def _dtype_label(dtype) -> str | None:
    """A dtype as the page shows it: ``<class 'int'>`` (msprobe's dtype of a Python
    scalar, kept in the xlsx) as ``int``, ``torch.bfloat16`` as ``bfloat16``."""
    if dtype is None:
        return None
    text = str(dtype)
    m = _PY_TYPE.match(text)
    if m:
        return m.group(1)
    return text[len("torch."):] if text.startswith("torch.") else text


def page_data(result, diag, digest, files: dict | None = None) -> bytes:
    """The page's data as UTF-8 JSON (safe inside a <script> block: ``script_json``).
    ``files``: the names of the pair's other outputs in the page's folder ({"xlsx": ...,
    "json": ...})."""
    return script_json(_data(result, diag, digest, files))[0]


# Characters that JSON may hold as they are but a <script> block may not: "</script>",
# "<!--" and "-->" end or change the block, "&" could start an entity in an older
# parser's eyes, U+2028/2029 end a line in older JavaScript. Outside strings JSON has none
# of them, so each is replaced by its \u escape wherever it is.
_SCRIPT_UNSAFE = [(b"<", b"\\u003c"), (b">", b"\\u003e"), (b"&", b"\\u0026"),
                  ("\u2028".encode(), b"\\u2028"), ("\u2029".encode(), b"\\u2029")]


def script_json(data, option: int = 0) -> tuple:
    """(``data`` as UTF-8 JSON that is only data inside a <script> block, whether texts
    had lone surrogates replaced to encode them). ``option``: orjson's options."""
    raw, replaced = _json(data, option)
    return _script_safe(raw), replaced


def _json(data, option: int) -> tuple:
    """(``data`` as UTF-8 JSON, whether lone surrogates were replaced to encode it)."""
    try:
        return orjson.dumps(data, default=_plain, option=option), False
    except orjson.JSONEncodeError as exc:
        if "surrogates" not in str(exc):
            raise
        return orjson.dumps(lone_surrogates.replace_in(data), default=_plain, option=option), True


def _script_safe(raw: bytes) -> bytes:
    """``raw`` JSON with ``_SCRIPT_UNSAFE``'s characters escaped."""
    wide = b"\xe2" in raw               # the lead byte of U+2028/2029: their (slower) search only then
    for unsafe, escaped in _SCRIPT_UNSAFE:
        if (len(unsafe) == 1 or wide) and unsafe in raw:
            raw = raw.replace(unsafe, escaped)
    return raw


_PIECE = 1 << 20


def _script_safe_pieces(raw: bytes):
    """``_script_safe(raw)`` in pieces of about a MB, each cut before a byte that starts a
    character (a U+2028 is never split): the escaped copies of a 20 MB page's data were a
    tenth of the 100k-entry compare's peak memory."""
    view, start = memoryview(raw), 0
    while start < len(raw):
        stop = min(start + _PIECE, len(raw))
        while stop < len(raw) and 0x80 <= raw[stop] < 0xC0:     # a continuation byte
            stop += 1
        yield _script_safe(bytes(view[start:stop]))
        start = stop


def _data(result, diag, digest, files: dict | None, fields: CallFields | None = None) -> dict:
    """The page's data, before it is JSON (``page_data``). ``fields``: the calls'
    ``CallFields`` where the report shares them (the Diagnosis sheet reads them too)."""
    cols = result.columns
    calls = diag.calls if diag is not None else []
    if fields is None or fields.calls is not calls:
        fields = CallFields(calls)
    n = result.n_rows
    row_call = np.full(n, -1, dtype=np.int32)
    rows = fields("rows")
    sizes = list(map(len, rows))
    row_call[np.fromiter(chain.from_iterable(rows), np.int64, sum(sizes))] = \
        np.repeat(np.arange(len(calls), dtype=np.int32), sizes)
    names, benches = cols["NPU Name"], cols["Bench Name"]
    npu_entry = fields("npu_entry") + [None]          # [-1]: a row of no call
    bench_entry = fields("bench_entry") + [None]

    def suffixes():         # each row's name after its call's entry name (".input.0")
        for name, bench, c in zip(names, benches, row_call.tolist()):
            if name is None:
                name, base = bench or "", bench_entry[c]
            else:
                base = npu_entry[c]
            yield name[len(base):] if base and name.startswith(base) else name
    suffix, x = _suffix_codes(names, npu_entry, row_call) or codes(suffixes(), n)   # a few hundred texts
    side = np.fromiter((name is None for name in names), np.uint8, n) if None in names else np.zeros(n, np.uint8)
    dtypes, dt = _coalesced(cols["NPU Dtype"], cols["Bench Dtype"])
    dtypes = [_dtype_label(d) for d in dtypes]     # a few kinds: labelled once each
    shapes, sh = _coalesced(cols["NPU Tensor Shape"], cols["Bench Tensor Shape"], str)
    results, res = code_array(cols["Result"])
    dirs, rd = _labelled(code_array(cols["Direction"]), _direction) or code_array(list(map(_direction, cols["Direction"])))
    metrics = [m for m in PAGE_METRICS.get(result.mode, []) if m in cols]
    gids, gpaths, gkind = _groups(result, fields)
    status = {s: k for k, s in enumerate(STATUS)}
    step, rank = step_rank(result.npu.json_path if result.npu else None)
    data = {
        "head": {
            "mode": result.mode, "matching": result.matching,
            "npu": result.npu.json_path if result.npu else None,
            "bench": result.bench.json_path if result.bench else None,
            "step": step, "rank": rank, "notes": list(result.notes),
            "error_measure": digest["error_measure"] if digest else None,
            "counts": {"rows": digest["rows"] if digest else None,
                       "calls": digest["calls"] if digest else None},
            "diagnosed": diag is not None,
            "verdict": _verdict(result, digest, fields),
            "not_judged": ((digest or {}).get("judged") or {}).get("not_compared") or [],
            "status": STATUS, "results": results, "dirs": dirs, "suffix": suffix,
            "dtypes": dtypes, "shapes": shapes, "metrics": metrics,
            "groups": gpaths, "group_kind": gkind, "files": files or {}},
        "calls": {
            "n": [a or b or "" for a, b in zip(npu_entry[:-1], bench_entry[:-1])],
            "b": [b if b and b != a else 0 for a, b in zip(npu_entry[:-1], bench_entry[:-1])],
            "d": _b64([d == "backward" for d in fields("direction")], "u1"),
            "s": _b64([status.get(s, 0) for s in fields("status")], "u1"),
            "i": _b64(fields("input_error"), "f8"),
            "o": _b64(fields("output_error"), "f8"),
            "t": _b64(fields.judged_thresholds(), "f8"),
            "g": _small(gids)},
        "rows": {
            "c": _b64(row_call, "i4"), "x": _small(x), "k": _b64(side, "u1"), "r": _small(res),
            "dir": _small(rd), "dt": _small(dt), "sh": _small(sh),
            "m": [[None if v is None else str(v) for v in cols[m]] if result.mode == "md5"
                  else _b64(cols[m], "f8" if m == "Cosine" else "f4") for m in metrics]},   # f4 rounds 1 - 3e-8 to 1
    }
    # orjson (script_json): the 100k-call page's 20 MB without the str copies json.dumps made
    return data


def _suffix_codes(names: list, npu_entry: list, row_call: np.ndarray) -> tuple[list, np.ndarray] | None:
    """``codes`` of ``_data``'s suffixes where every row has an NPU name that starts with
    its call's NPU entry name (a compare of calls both sides made): the suffixes cut and
    coded in C (``tail_code_array``, one pass, no str made per row: it was half the page's
    data on the 350k rows of the 100k-entry pairs), not a Python step per row; None
    otherwise."""
    return tail_code_array(names, npu_entry, row_call)


def _direction(value) -> str:
    return value or "other"


def _labelled(found: tuple, label) -> tuple[list, np.ndarray] | None:
    """``found`` (``code_array``'s distinct values and codes) with each distinct value
    as ``label`` gives it; None where two values get one label (coded again then)."""
    distinct, ids = found
    labels = list(map(label, distinct))
    return (labels, ids) if len(set(labels)) == len(labels) else None


def _coalesced(npu: list, bench: list, label=None) -> tuple[list, np.ndarray]:
    """``codes`` of each row's NPU value, else its bench value (each as ``label`` gives
    it): the NPU column coded as it is (in C, values in runs of one object found without
    a lookup) where every row has its NPU value (a compare of calls both sides made)."""
    if None not in npu:
        coded = code_array(npu)
        found = coded if label is None else _labelled(coded, label)
        if found is not None:
            return found
    values = [a if a is not None else b for a, b in zip(npu, bench)]
    return code_array(values if label is None else list(map(label, values)))


def _plain(value):
    """A numpy scalar as the Python number it holds (json.dumps took float64 as a float)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def _frame(template: str, title: str) -> tuple:
    """The page's text before and after its data."""
    head, _, rest = template.partition("__DATA__")
    title = lone_surrogates.replace(title)         # a path's undecodable bytes
    return head.replace("__TITLE__", title.replace("&", "&amp;").replace("<", "&lt;")), rest


def _write(path: str, template: str, title: str, data, option: int = 0) -> bool:
    """Write a page: ``template`` with its title and ``data`` (as ``script_json``), whole
    or not at all; whether texts had lone surrogates replaced."""
    head, rest = _frame(template, title)
    raw, replaced = _json(data, option)
    with replaced_when_written(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(head.encode("utf-8"))
            for piece in _script_safe_pieces(raw):
                fh.write(piece)
            fh.write(rest.encode("utf-8"))
    if replaced:
        lone_surrogates.say_replaced(os.path.dirname(os.path.abspath(path)))
    return replaced


def write_page(result, diag, digest, path: str, files: dict | None = None,
               fields: CallFields | None = None) -> str:
    """Write the compare page of one pair to ``path``; return the path. ``files``: the
    pair's other outputs ({"xlsx": path, "json": path}), named on the page's first line;
    ``fields``: the calls' ``CallFields`` where the report has read them already."""
    title = "probe compare: " + os.path.basename(result.npu.json_path if result.npu else "")
    names = {k: os.path.basename(v) for k, v in (files or {}).items() if v}
    _write(path, _asset("compare_page.html"), title, _data(result, diag, digest, names, fields))
    return path


RUN_SCHEMA = "probe.run_summary/1"


def write_run_page(run_summary: dict, out_path: str) -> str:
    """Write the page of a whole run (schema ``probe.run_summary/1``): the first divergence
    and the steps x ranks grid, each cell linking to its pair's page by relative path."""
    if not isinstance(run_summary, dict) or run_summary.get("schema") != RUN_SCHEMA:
        raise ConfigError(f"write_run_page: run_summary must be a dict with schema {RUN_SCHEMA!r}")
    base = os.path.dirname(os.path.abspath(out_path))

    def rel(p):       # a URL path: quoted, so that no folder name reads as a scheme (javascript:)
        return quote(os.path.relpath(os.path.abspath(p), base).replace(os.sep, "/")) if p else None

    grid = []
    for cell in run_summary.get("grid", []):
        v = cell.get("verdict")
        if v not in RUN_VERDICTS:
            raise ConfigError(f"write_run_page: grid verdict {v!r} is not one of {', '.join(RUN_VERDICTS)}")
        grid.append(dict(cell, html=rel(cell.get("html")), report=rel(cell.get("report"))))
    fd = run_summary.get("first_divergence")
    if fd:
        fd = dict(fd, html=rel(fd.get("html")), report=rel(fd.get("report")))
    data = dict(run_summary, grid=grid, first_divergence=fd)
    os.makedirs(base, exist_ok=True)
    _write(out_path, _asset("run_page.html"), "probe run: " + str(run_summary.get("npu_root", "")), data,
           orjson.OPT_NON_STR_KEYS)
    return out_path


def write_requests_page(run_summary: dict, out_path: str) -> str:
    """Write the page of an inference run compared by request (``requests.py``): the first
    divergence, and requests x generated tokens, the first differing token of each request
    marked, each request linking to its compare page (the call table)."""
    if not isinstance(run_summary, dict) or not isinstance(run_summary.get("requests"), list):
        raise ConfigError("write_requests_page: run_summary must be a dict with a list of requests")
    base = os.path.dirname(os.path.abspath(out_path))

    def rel(p):       # a URL path: quoted, so that no folder name reads as a scheme (javascript:)
        return quote(os.path.relpath(os.path.abspath(p), base).replace(os.sep, "/")) if p else None

    requests = [dict(e, html=rel(e.get("html")), report=rel(e.get("report"))) for e in run_summary["requests"]]
    fd = run_summary.get("first_divergence")
    if fd:
        fd = dict(fd, html=rel(fd.get("html")), report=rel(fd.get("report")))
    data = dict(run_summary, requests=requests, first_divergence=fd)
    os.makedirs(base, exist_ok=True)
    _write(out_path, _asset("requests_page.html"), "probe inference run: " + str(run_summary.get("npu_root", "")),
           data, orjson.OPT_NON_STR_KEYS)
    return out_path
