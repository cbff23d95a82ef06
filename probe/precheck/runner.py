"""run_ut: replay every dumped API on a trusted device and judge the dumped outputs.

For each API call of a dump.json (forward, and backward from the saved output grads),
the inputs are rebuilt, the call is replayed as the bench (dumped dtypes) and as the
golden (float64), and each dumped output is judged by the accuracy standards
(probe.precheck.standards). Results are appended API by API to

* ``accuracy_checking_result_{ts}.csv``: one row per API (forward/backward status, message);
* ``accuracy_checking_details_{ts}.csv``: one row per output tensor with every metric,

so an interrupted run continues with ``resume=True``. Nothing about one API (a missing
kernel, an argument not recorded by value, a bad file) stops the run: it is SKIP with
the reason.
"""
from __future__ import annotations

import csv
import glob
import math
import os
import time
from dataclasses import dataclass, field

from probe.cli_options import require_device
from probe.compare.reader import DumpMeta, read_dump
from probe.compare.tensors import data_folder
from probe.errors import ConfigError
from probe.precheck.entries import DROPOUT_ARGS, ApiEntry, parse_name, resolve_api
from probe.precheck.inputs import Loader, Unrebuildable, flat_outputs, flat_tensors, is_tensor_desc, torch_dtype
from probe.precheck.judge import TensorResult, judge_dropout, judge_leaf
from probe.precheck.replay import Replayer

PASS, WARNING, ERROR, SKIP = "pass", "warning", "error", "SKIP"
RESULT_COLUMNS = ["API Name", "Forward Test Success", "Backward Test Success", "Message"]
DETAIL_COLUMNS = [
    "API Name", "Bench Dtype", "DEVICE Dtype", "Shape", "Inputs", "Bench Run", "Standard",
    "Cosine Similarity", "Max Abs Error", "Max Relative Error", "Mean Relative Error",
    "One Thousandth Err Ratio", "Five Thousandths Err Ratio", "EB", "RMSE",
    "Small Value Error Proportion", "Max ULP Error", "Mean ULP Error", "ULP Error Proportion",
    "Error Rate", "Bench Max Relative Error", "Bench Mean Relative Error", "Bench EB", "Bench RMSE",
    "Bench Small Value Error Proportion", "Bench ULP Error Proportion",
    "Max Rel Err Ratio", "Mean Rel Err Ratio", "RMSE Ratio", "EB Ratio", "Small Value Err Ratio",
    "Status", "Message"]
_ORDER = {"": -1, PASS: 0, SKIP: 0, WARNING: 1, ERROR: 2}


@dataclass
class ApiResult:
    name: str
    forward: str = ""
    backward: str = ""
    message: str = ""
    rows: list = field(default_factory=list)


@dataclass
class RunUtResult:
    result_csv: str
    details_csv: str
    apis: list                 # ApiResult of the APIs checked in this call
    counts: dict               # {"forward": {status: n}, "backward": {...}} over the whole CSV
    elapsed: float = 0.0
    problems: list = field(default_factory=list)

    def status(self, api_name: str) -> tuple[str, str]:
        for a in self.apis:
            if a.name == api_name:
                return a.forward, a.backward
        raise KeyError(api_name)

    def summary_table(self) -> str:
        lines = [f"{'':<10}{'pass':>8}{'warning':>9}{'error':>7}{'SKIP':>7}"]
        for phase in ("forward", "backward"):
            c = self.counts.get(phase, {})
            lines.append(f"{phase:<10}{c.get(PASS, 0):>8}{c.get(WARNING, 0):>9}{c.get(ERROR, 0):>7}"
                         f"{c.get(SKIP, 0):>7}")
        bad = [a for a in self.apis if ERROR in (a.forward, a.backward)]
        if bad:
            lines.append("errors:")
            lines += [f"  {a.name:<40} {a.message[:110]}" for a in bad[:20]]
            if len(bad) > 20:
                lines.append(f"  ... {len(bad) - 20} more in {os.path.basename(self.result_csv)}")
        lines.append(f"results: {self.result_csv}")
        lines.append(f"details: {self.details_csv}")
        return "\n".join(lines)


def _worst(statuses):
    out = ""
    for s in statuses:
        if _ORDER[s] > _ORDER[out]:
            out = s
    return out


def _fmt(x):
    if x is None:
        return ""
    if isinstance(x, float):
        return "N/A" if math.isnan(x) else f"{x:.8g}"
    return str(x)


def _detail_row(r: TensorResult):
    d, b, q = r.dev, r.bench, r.ratios
    g = (lambda m, k: getattr(m, k) if m is not None else None)  # noqa: E731
    return [r.name, r.bench_dtype, r.device_dtype, r.shape, r.inputs, r.bench_run, r.method,
            g(d, "cosine"), g(d, "max_abs"), g(d, "max_rel"), g(d, "mean_rel"), g(d, "one_thousandth"),
            g(d, "five_thousandths"), g(d, "eb"), g(d, "rmse"), g(d, "small_value_err"), g(d, "max_ulp"),
            g(d, "mean_ulp"), g(d, "ulp_proportion"), r.error_rate, g(b, "max_rel"), g(b, "mean_rel"),
            g(b, "eb"), g(b, "rmse"), g(b, "small_value_err"), g(b, "ulp_proportion"),
            q.get("max_rel_err"), q.get("mean_rel_err"), q.get("rmse"), q.get("eb"),
            q.get("small_value_err"), r.status, r.message]


def locate_dump(path: str) -> str:
    """dump.json itself, or the one inside a rank folder."""
    if os.path.isdir(path):
        candidate = os.path.join(path, "dump.json")
        if os.path.isfile(candidate):
            return candidate
        found = sorted(glob.glob(os.path.join(path, "step*", "*", "dump.json")))
        hint = f"; e.g. {found[0]}" if found else ""
        raise ConfigError(f"{path} holds no dump.json; give a dump.json or its rank folder{hint}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dump.json not found: {path}")
    return path


def _matches(api: ApiEntry, items) -> bool:
    return any(i in (api.api, api.leaf, api.qualified, api.base) for i in items)


class Checker:
    """Checks the calls of one dump."""

    def __init__(self, data_dir, device):
        self.loader = Loader(data_dir, device)
        self.replayer = Replayer(device)

    # ---- forward -----------------------------------------------------------------------
    def forward(self, api: ApiEntry, entry: dict) -> tuple[str, str, list]:
        try:
            func = resolve_api(api)
        except LookupError as exc:
            return SKIP, f"cannot replay: {exc}", []
        if "output" not in entry:
            return SKIP, "outputs not dumped (data_mode)", []
        self.loader.synthetic = False
        try:
            args = self.loader.build(entry.get("input_args", []), api.base + ".forward")
            kwargs = self.loader.build(entry.get("input_kwargs", {}), api.base + ".forward")
            if not isinstance(kwargs, dict):
                raise Unrebuildable("input_kwargs is not a mapping")
            descs = flat_outputs(entry.get("output") or [])
            devs, out_dtypes = [], []
            for d in descs:
                devs.append(self.loader.dumped(d))
                out_dtypes.append(torch_dtype(d["dtype"]) if is_tensor_desc(d) else None)
        except Unrebuildable as exc:
            return SKIP, f"cannot rebuild the call: {exc}", []
        synthetic = self.loader.synthetic
        if api.leaf in DROPOUT_ARGS:
            dropout = _dropout_args(api, args, kwargs)
            if dropout is not None and not synthetic and devs and devs[0] is not None and args:
                row = judge_dropout(f"{api.base}.forward.output.0", descs[0], devs[0], args[0],
                                    dropout, descs[0].get("dtype", ""))
                return row.status, row.message, [row]
            random = dropout is not None
        else:
            random = api.random
        exact = api.exact or (api.leaf in DROPOUT_ARGS and not random)
        bench, gold = self.replayer.forward(func, args, kwargs, out_dtypes, api,
                                            golden=not (exact or random))
        if bench.error:
            return SKIP, f"cannot run on {self.replayer.device}: {bench.error}", []
        outs = bench.outputs
        if len([d for d in descs if d is not None]) and len(outs) != len(descs):
            return ERROR, f"the dump has {len(descs)} outputs, the replay {len(outs)}", []
        rows = []
        for i, (d, dev) in enumerate(zip(descs, devs)):
            golden = gold.outputs[i] if gold is not None and gold.outputs and i < len(gold.outputs) else None
            r = judge_leaf(f"{api.base}.forward.output.{i}", d, dev, outs[i], golden, exact=exact,
                           random=random, ulp=api.ulp, synthetic=synthetic or dev is None and d is not None,
                           bench_note=bench.note, golden_note=gold.error if gold is not None else "")
            if r is not None:
                rows.append(r)
        if not rows:
            return SKIP, "the API returned nothing to compare", []
        return _rollup(rows)

    # ---- backward ----------------------------------------------------------------------
    def backward(self, api: ApiEntry, fwd: dict | None, bwd: dict) -> tuple[str, str, list]:
        if fwd is None or "input_args" not in fwd:
            return SKIP, "no forward entry with inputs to replay the backward from", []
        if "output" not in bwd or "input" not in bwd:
            return SKIP, "gradients not dumped (data_mode)", []
        try:
            func = resolve_api(api)
        except LookupError as exc:
            return SKIP, f"cannot replay: {exc}", []
        self.loader.synthetic = False
        try:
            args = self.loader.build(fwd.get("input_args", []), api.base + ".forward")
            kwargs = self.loader.build(fwd.get("input_kwargs", {}), api.base + ".forward")
            out_grads = [self.loader.tensor(d) if is_tensor_desc(d) else None for d in bwd["input"]]
            dumped = list(bwd["output"])
            devs = [self.loader.dumped(d) for d in dumped]
            out_dtypes = [torch_dtype(d["dtype"]) if is_tensor_desc(d) else None
                          for d in flat_outputs(fwd.get("output") or [])]
        except Unrebuildable as exc:
            return SKIP, f"cannot rebuild the call: {exc}", []
        synthetic = self.loader.synthetic
        slots = flat_tensors(args, kwargs)
        aligned = _align_grads(dumped, slots)
        if aligned is None:
            return SKIP, (f"the backward lists {len(dumped)} gradients that do not line up with the "
                          f"{len(slots)} inputs (msprobe dumps autograd-node order)"), []
        dumped, devs = aligned, _realign(devs, dumped, aligned)
        dropout = _dropout_args(api, args, kwargs) if api.leaf in DROPOUT_ARGS else None
        if dropout is not None:
            return self._dropout_backward(api, fwd, bwd, dropout, out_grads, devs)
        if api.random:
            return SKIP, "random API: its gradient depends on the draw", []
        wants = [is_tensor_desc(d) for d in dumped]
        exact = api.exact_backward
        bench, gold = self.replayer.backward(func, args, kwargs, wants, out_grads, out_dtypes, api,
                                             golden=not exact)
        if bench.error:
            return SKIP, f"cannot run the backward on {self.replayer.device}: {bench.error}", []
        rows = []
        for i, d in enumerate(dumped):
            if not is_tensor_desc(d):
                continue
            golden = gold.outputs[i] if gold is not None and gold.outputs else None
            r = judge_leaf(f"{api.base}.backward.output.{i}", d, devs[i], bench.outputs[i], golden,
                           exact=exact, random=False, ulp=False, synthetic=synthetic or devs[i] is None,
                           bench_note=bench.note, golden_note=gold.error if gold is not None else "")
            if r is not None:
                rows.append(r)
        if not rows:
            return SKIP, "no input gradient to compare", []
        return _rollup(rows)

    def _dropout_backward(self, api, fwd, bwd, p, out_grads, devs):
        """Dropout's gradient is the output grad through the forward's own mask, times 1/(1-p)."""
        fdesc = flat_outputs(fwd.get("output") or [])
        fout = self.loader.dumped(fdesc[0]) if fdesc else None
        if fout is None or not out_grads or out_grads[0] is None or devs[0] is None:
            return SKIP, "random API: dropout backward needs the dumped forward output and grads", []
        scale = 1.0 / (1.0 - p) if p < 1 else 0.0
        golden = out_grads[0].double() * (fout != 0) * scale
        bench = golden.to(devs[0].dtype)
        r = judge_leaf(f"{api.base}.backward.output.0", bwd["output"][0], devs[0], bench, golden,
                       exact=False, random=False, ulp=False, synthetic=False,
                       bench_note="output grad x forward mask / (1-p)", golden_note="")
        r.method = "dropout mask " + r.method
        return r.status, r.message, [r]


def _fits(d, s):
    return not is_tensor_desc(d) or (s is not None and list(s.shape) == list(d.get("shape", s.shape)))


def _align_grads(dumped, slots):
    """Dumped input grads laid out one per input slot, or None when they cannot be.

    probe writes one per slot (argument order); msprobe one per autograd edge, which for
    layer_norm or nll_loss is the float tensor inputs in order and is accepted when every
    shape fits; linear's (bias, input, weight^T) does not fit and is refused."""
    if len(dumped) == len(slots) and all(_fits(d, s) for d, s in zip(dumped, slots)):
        return list(dumped)
    floats = [i for i, s in enumerate(slots) if s is not None and s.dtype.is_floating_point]
    if len(dumped) == len(floats) and all(_fits(d, slots[i]) for d, i in zip(dumped, floats)):
        out = [None] * len(slots)
        for d, i in zip(dumped, floats):
            out[i] = d
        return out
    return None


def _realign(devs, dumped, aligned):
    """The loaded grads in the aligned layout (same objects, placed as ``aligned`` places them)."""
    by_id = {id(d): t for d, t in zip(dumped, devs)}
    return [by_id.get(id(d)) if d is not None else None for d in aligned]


def _dropout_args(api, args, kwargs):
    """p when the dropout call is random (training), else None (it is the identity)."""
    p_pos, t_pos, default_train = DROPOUT_ARGS[api.leaf]
    p = args[p_pos] if len(args) > p_pos else kwargs.get("p", 0.5)
    train = args[t_pos] if len(args) > t_pos else kwargs.get("training", kwargs.get("train", default_train))
    if not train or not p:
        return None
    return float(p)


def _rollup(rows):
    status = _worst(r.status for r in rows)
    msgs = [f"{r.name.rsplit('.', 2)[-2]}.{r.name.rsplit('.', 1)[-1]}: {r.message}"
            for r in rows if r.status == status and r.message and status != PASS]
    if status == PASS:
        notes = sorted({r.message for r in rows if r.message})
        msgs = notes[:1]
    return status, " | ".join(msgs)[:2000], rows


def _read_done(result_csv, details_csv):
    """APIs already in an interrupted run's result CSV; details of unfinished APIs dropped."""
    done = {}
    with open(result_csv, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            done[row["API Name"]] = row
    if os.path.isfile(details_csv):
        with open(details_csv, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        keep = [r for r in rows[1:] if r and r[0].rsplit(".", 3)[0] in done]
        with open(details_csv, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(DETAIL_COLUMNS)
            w.writerows(keep)
    return done


def run_ut(dump_json: str, out_dir: str = ".", device: str = "cpu", white_list=None, black_list=None,
           resume: bool = False, progress: bool | None = None, threads: int | None = 1) -> RunUtResult:
    """Pre-check every API call of ``dump_json`` (a dump.json or its rank folder).

    ``white_list``/``black_list``: API names (``linear``, ``Functional.linear`` or one call
    ``Functional.linear.0``). ``resume``: continue the newest result CSV in ``out_dir``.
    ``threads``: CPU threads for the replays (None: torch's setting). One call at a time on
    dumped-size tensors is dominated by waking worker threads: on a busy 2-core machine one
    thread made a 463-API run 3x faster.
    """
    import torch
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run_ut(dump_json, out_dir, device, white_list, black_list, resume, progress)
    finally:
        torch.set_num_threads(saved_threads)


def _run_ut(dump_json, out_dir, device, white_list, black_list, resume, progress):
    start = time.perf_counter()
    path = locate_dump(dump_json)
    require_device(device)   # npu: imports torch_npu, which registers the device
    os.makedirs(out_dir, exist_ok=True)
    meta = DumpMeta(path)
    calls: dict[str, dict] = {}
    for name, entry in read_dump(path, meta):
        api = parse_name(name)
        if api is None or not isinstance(entry, dict):
            continue
        if white_list and not _matches(api, white_list):
            continue
        if black_list and _matches(api, black_list):
            continue
        slot = calls.setdefault(api.base, {"api": api})
        slot[api.direction] = entry
    data_dir = data_folder(path, meta.dump_data_dir)     # inside the dump's folder (or None)

    done = {}
    if resume:
        previous = sorted(glob.glob(os.path.join(out_dir, "accuracy_checking_result_*.csv")))
        if previous:
            result_csv = previous[-1]
            details_csv = result_csv.replace("accuracy_checking_result_", "accuracy_checking_details_")
            done = _read_done(result_csv, details_csv)
    if not done:
        ts = time.strftime("%Y%m%d%H%M%S")
        result_csv = os.path.join(out_dir, f"accuracy_checking_result_{ts}.csv")
        details_csv = os.path.join(out_dir, f"accuracy_checking_details_{ts}.csv")
        for p, cols in ((result_csv, RESULT_COLUMNS), (details_csv, DETAIL_COLUMNS)):
            with open(p, "w", newline="", encoding="utf-8") as fh:
                csv.writer(fh).writerow(cols)

    todo = [(base, slot) for base, slot in calls.items() if base not in done]
    checker = Checker(data_dir, device)
    from tqdm import tqdm
    apis = []
    with open(result_csv, "a", newline="", encoding="utf-8") as rfh, \
            open(details_csv, "a", newline="", encoding="utf-8") as dfh:
        rw, dw = csv.writer(rfh), csv.writer(dfh)
        for _base, slot in tqdm(todo, desc="run_ut", unit="api", disable=progress is False if progress
                               is not None else None, leave=False):
            res = check_api(checker, slot)
            apis.append(res)
            dw.writerows([_fmt(x) for x in _detail_row(r)] for r in res.rows)
            dfh.flush()
            rw.writerow([res.name, res.forward, res.backward, res.message])
            rfh.flush()
    counts = {"forward": {}, "backward": {}}
    with open(result_csv, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            for phase, col in (("forward", "Forward Test Success"), ("backward", "Backward Test Success")):
                if row[col]:
                    counts[phase][row[col]] = counts[phase].get(row[col], 0) + 1
    return RunUtResult(result_csv, details_csv, apis, counts, time.perf_counter() - start,
                       list(meta.problems))


def check_api(checker: Checker, slot: dict) -> ApiResult:
    """Forward and backward of one call; nothing raised inside reaches the caller."""
    api = slot["api"]
    res = ApiResult(api.base)
    msgs = []
    for phase in ("forward", "backward"):
        entry = slot.get(phase)
        if entry is None:
            continue
        try:
            if phase == "forward":
                status, message, rows = checker.forward(api, entry)
            else:
                status, message, rows = checker.backward(api, slot.get("forward"), entry)
        except Exception as exc:  # noqa: BLE001 - one API never stops the run
            status, message, rows = SKIP, f"internal error: {type(exc).__name__}: {exc}"[:300], []
        setattr(res, phase, status)
        res.rows.extend(rows)
        if message:
            msgs.append(f"{phase}: {message}" if slot.get("backward") is not None else message)
    res.message = " || ".join(msgs)
    return res


__all__ = ["run_ut", "RunUtResult", "ApiResult"]
