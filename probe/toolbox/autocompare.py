"""OpAutoCompare: every chosen API runs normally, then again on the CPU, and is compared.

The golden run takes copies of the inputs made *before* the call (an in-place API has
overwritten the originals by then), in float64 for APIs that accumulate (matmul, linear,
conv, norms, softmax, reductions, losses: their error grows with the reduced length) and
float32 otherwise. So the error measured is this API's own: upstream error is in both.
Backward: grads w.r.t. the API's own inputs (caught by grad_capture, not the last autograd
node's) are compared with ``torch.autograd.grad`` of the golden call on the same output grads.
Random APIs are judged by statistics (dropout's zero ratio against p, rand's mean, ...).

It works on a CPU-only machine too: a bf16 model on the CPU is compared with its float64
golden, which finds precision loss without an accelerator.
"""
import logging
import os

import torch

from probe.hook_module import grad_capture
from probe.hook_module.interceptor import guard
from probe.toolbox import base, options
from probe.toolbox.capture import CallRecord, flat_input_slots, host_copy
from probe.toolbox.golden_check import compare

log = logging.getLogger(__name__)

_ACCUMULATING = ("matmul", "mm", "mv", "dot", "einsum", "tensordot", "linear", "conv", "norm",
                 "softmax", "softmin", "sum", "mean", "prod", "std", "var", "logsumexp", "loss",
                 "cross_entropy", "nll", "kl_div", "attention", "cdist", "pdist", "cosine_similarity",
                 "cumsum", "cumprod", "trace", "addcdiv", "addcmul", "lerp")
RANDOM = frozenset({"dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "feature_dropout",
                    "feature_dropout_", "native_dropout", "alpha_dropout", "alpha_dropout_",
                    "feature_alpha_dropout", "feature_alpha_dropout_", "rand", "rand_like", "randn",
                    "randn_like", "randint", "randint_like", "randperm", "bernoulli", "bernoulli_",
                    "multinomial", "normal", "normal_", "uniform_", "random_", "exponential_",
                    "geometric_", "cauchy_", "log_normal_", "poisson", "rrelu", "rrelu_",
                    "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d"})
COLUMNS = ["name", "call_id", "phase", "tensor", "status", "dtype", "shape", "golden_dtype",
           "max_abs", "max_rel", "cosine", "tol_ratio", "beyond", "atol", "rtol", "note"]


def api_short(name):
    return name.rsplit(".", 1)[-1]


def golden_dtype(name):
    short = api_short(name).lower()
    return torch.float64 if any(k in short for k in _ACCUMULATING) else torch.float32


def golden_inputs(snapshot, dtype, want_grad):
    """Snapshot (CPU copies) -> (args, kwargs) for the golden call, floats upcast to ``dtype``.

    Tensors that required grad become leaves, one per argument slot (grad_capture gives
    ``x * x`` each argument its own gradient), passed as clones so that in-place APIs may
    modify them. Returns (golden args tree, leaves aligned with the call's flat inputs).
    """
    converted = {}
    leaves = []

    def up(t):
        g = converted.get(id(t))
        if g is None:
            with torch.no_grad():
                if t.is_floating_point() and torch.finfo(t.dtype).bits < torch.finfo(dtype).bits:
                    g = t.to(dtype)
                else:
                    g = t.clone()  # the snapshot stays intact for saving and for random checks
            converted[id(t)] = g
        if want_grad and t.requires_grad and g.is_floating_point():
            leaf = g.detach().requires_grad_(True)
            leaves.append(leaf)
            with torch.enable_grad():
                return leaf.clone()
        leaves.append(None)
        return g

    tree = base.map_tensors(up, snapshot)
    return tree, leaves


class OpAutoCompare(base.ToolBase):
    """Compare chosen APIs with a CPU golden, forward and backward; rows to CSV and the log.

    Options (keyword arguments win over the environment variables):
    ``ops`` / ``disable_ops`` (``OP_AUTOCOMPARE_LIST`` / ``OP_AUTOCOMPARE_DISABLE_LIST``),
    ``tolerance`` (atol, rtol) for every dtype, ``tolerances`` {dtype: (atol, rtol)},
    ``op_tolerances`` {api: (atol, rtol) or {dtype: ...}} (env: ``AUTOCOMPARE_ERROR_TOLERANCE``,
    ``..._BFLOAT16`` etc. and ``LINEAR_AUTOCOMPARE_ERROR_TOLERANCE_BFLOAT16``),
    ``backward`` (default True), ``save_failed`` (default True: failing calls saved for
    ``probe replay`` under ``output_dir/failed``), ``verbose`` (log failing rows at INFO; "all":
    every row).
    """
    feature = "autocompare"
    env_list = "OP_AUTOCOMPARE_LIST"
    env_disable_list = "OP_AUTOCOMPARE_DISABLE_LIST"

    def __init__(self, ops=None, disable_ops=None, condition_func=None, output_dir=None,
                 tolerance=None, tolerances=None, op_tolerances=None, backward=True,
                 save_failed=True, yaml_path=None, verbose=None):
        super().__init__(ops, disable_ops, condition_func, yaml_path, output_dir, verbose)
        self.tolerances = options.Tolerances(tolerance, tolerances, op_tolerances)
        self.backward = backward
        self.save_failed = save_failed
        self.csv = base.CsvSink(os.path.join(self.output_dir, "autocompare.csv"), COLUMNS)
        self.failed_calls = set()   # (name, call_id)

    @property
    def rows(self):
        return self.csv.rows

    def failures(self):
        return [r for r in self.csv.rows if r["status"] == "fail"]

    # ---- the handler -------------------------------------------------------------
    def handle(self, name, call_id, func, args, kwargs):
        try:
            with guard():
                prep = self._before(name, args, kwargs)
        except Exception as exc:
            self.fail(name, exc)
            prep = None
        out = func(*args, **kwargs)
        if prep is not None:
            try:
                with guard():
                    self._after(name, call_id, func, args, kwargs, prep, out)
            except Exception as exc:
                self.fail(name, exc)
        return out

    def _before(self, name, args, kwargs):
        flat = flat_input_slots(args, kwargs)
        memo = {}

        def snap(t):
            c = memo.get(id(t))
            if c is None:
                c = memo[id(t)] = host_copy(t)
                c.requires_grad_(t.requires_grad and c.is_floating_point())
            return c

        snapshot = base.map_tensors(snap, (list(args), dict(kwargs)))
        versions = [t._version for t in flat]
        grad = None
        if self.backward and torch.is_grad_enabled() and any(t.requires_grad for t in flat):
            grad = grad_capture.edges_before(flat)
        return {"snapshot": snapshot, "flat": flat, "versions": versions, "grad": grad}

    def _after(self, name, call_id, func, args, kwargs, prep, out):
        short = api_short(name)
        real_outs = base.flat_outputs(out)
        if short in RANDOM:
            from probe.toolbox.random_checks import check_random
            for label, row in check_random(short, prep["snapshot"], out, self.tolerances, name):
                self._emit(name, call_id, "forward", label, row, prep)
            return
        gdtype = golden_dtype(name)
        want_grad = prep["grad"] is not None
        (gargs, gkwargs), leaves = golden_inputs(prep["snapshot"], gdtype, want_grad)
        gargs, gkwargs = base.swap_devices(tuple(gargs), gkwargs, "cpu")
        gflat = base.flat_tensors((list(gargs), gkwargs))
        try:
            with torch.set_grad_enabled(want_grad):
                gout = func(*gargs, **gkwargs)
        except Exception as exc:
            self._emit(name, call_id, "forward", "-", {"status": "skipped",
                       "note": f"golden failed on CPU: {type(exc).__name__}: {str(exc)[:200]}"}, prep)
            return
        gouts = base.flat_outputs(gout)
        if len(gouts) != len(real_outs):
            self._emit(name, call_id, "forward", "-", {"status": "skipped",
                       "note": f"{len(real_outs)} outputs vs {len(gouts)} in the golden"}, prep)
            return
        gd = str(gdtype).replace("torch.", "")
        for j, (r, g) in enumerate(zip(real_outs, gouts)):
            if r is None or g is None:
                continue
            row = compare(r, g, *self.tolerances.get(name, r.dtype))
            row["golden_dtype"] = gd
            self._emit(name, call_id, "forward", f"output.{j}", row, prep)
        # in-place APIs that return something else (x[i] = v returns None): compare what changed
        out_ids = {id(r) for r in real_outs if r is not None}
        for i, (t, v0) in enumerate(zip(prep["flat"], prep["versions"])):
            if t._version != v0 and id(t) not in out_ids and i < len(gflat):
                row = compare(t, gflat[i], *self.tolerances.get(name, t.dtype))
                row["golden_dtype"] = gd
                self._emit(name, call_id, "forward", f"input.{i} (updated)", row, prep)
        if want_grad:
            grad_capture.hook_call(prep["grad"], real_outs, len(prep["flat"]), _grad_copy,
                                   self._backward_fn(name, call_id, gouts, leaves, prep))

    def _backward_fn(self, name, call_id, gouts, leaves, prep):
        def on_done(out_grads, in_grads):
            try:
                with guard():
                    self._compare_backward(name, call_id, gouts, leaves, out_grads, in_grads, prep)
            except Exception as exc:
                self.fail(name + " backward", exc)
        return on_done

    def _compare_backward(self, name, call_id, gouts, leaves, out_grads, in_grads, prep):
        outs, grads = [], []
        for g_out, dg in zip(gouts, out_grads):
            if dg is not None and g_out is not None and g_out.requires_grad:
                outs.append(g_out)
                grads.append(dg.to(g_out.dtype))
        idx = [i for i, leaf in enumerate(leaves) if leaf is not None]
        if not outs or not idx:
            return
        uniq = list({id(leaves[i]): leaves[i] for i in idx}.values())
        with torch.enable_grad():
            gg = torch.autograd.grad(outs, uniq, grads, allow_unused=True)
        by_leaf = {id(leaf): g for leaf, g in zip(uniq, gg)}
        for i in idx:
            real, gold = in_grads[i], by_leaf[id(leaves[i])]
            if real is None and gold is None:
                continue
            if real is None or gold is None:
                nonzero = (gold if real is None else real).abs().max().item() > 0
                if nonzero:
                    self._emit(name, call_id, "backward", f"grad_input.{i}", {
                        "status": "fail", "note": "no gradient reached the input on the "
                        + ("device" if real is None else "golden")}, prep)
                continue
            row = compare(real, gold, *self.tolerances.get(name, real.dtype))
            row["golden_dtype"] = str(gold.dtype).replace("torch.", "")
            self._emit(name, call_id, "backward", f"grad_input.{i}", row, prep)

    # ---- reporting -----------------------------------------------------------------
    def _emit(self, name, call_id, phase, label, row, prep):
        row = dict(row, name=name, call_id=call_id, phase=phase, tensor=label)
        self.csv.add(row)
        if row["status"] == "fail":
            if self.verbose:
                log.info("probe autocompare: FAIL %s.%s %s %s dtype=%s max_abs=%s max_rel=%s %s",
                         name, call_id, phase, label, row.get("dtype"), _fmt(row.get("max_abs")),
                         _fmt(row.get("max_rel")), row.get("note", ""))
            key = (name, call_id)
            if self.save_failed and key not in self.failed_calls:
                self.failed_calls.add(key)
                self._save(name, call_id, prep)
        elif self.verbose == "all":
            log.info("probe autocompare: %s %s.%s %s %s", row["status"], name, call_id, phase, label)

    def _save(self, name, call_id, prep):
        """A failing call's inputs (as they were before the call) for ``probe replay``."""
        try:
            args, kwargs = prep["snapshot"]
            rec = CallRecord(os.path.join(self.output_dir, "failed", name, str(call_id)), name, call_id,
                             args, kwargs)
            rec.save_forward(None, note="saved by autocompare: outputs not kept, replay compares "
                                        "with the fp64 golden")
        except Exception as exc:
            self.fail(name + " save", exc)

    def on_stop(self):
        if not self.verbose:
            return
        n = len(self.csv.rows)
        bad = self.failures()
        apis = sorted({r["name"] for r in bad})
        log.info("probe autocompare: %d comparisons, %d failed%s%s", n, len(bad),
                 f" ({', '.join(apis[:10])}{' ...' if len(apis) > 10 else ''})" if apis else "",
                 f"; report {self.csv.path}" if n else "")


def _fmt(x):
    return "-" if x is None else f"{x:.3g}"


def _grad_copy(g):
    with guard():
        return host_copy(g)
