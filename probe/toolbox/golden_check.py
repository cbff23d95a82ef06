"""One tensor against its golden: the metrics and a pass/fail row (the toolbox's check).

OpAutoCompare's calls, its random APIs' range checks and the replay of captured calls all
judge a tensor with ``compare`` here.
"""
import math

import torch

from probe.compare.metrics import tensor_metrics


def compare(real, golden, atol, rtol):
    """Metrics of ``real`` against ``golden`` (any devices / dtypes) and a pass/fail status.

    An element passes when |real - golden| <= max(atol, rtol * max(|golden|, RMS(golden)));
    a tensor passes when every element does (allclose, with the scale floor for
    cancellation) and NaN/Inf sit at the same places. Ints and bools must be equal.
    """
    row = {"dtype": str(real.dtype).replace("torch.", ""), "shape": "x".join(map(str, real.shape)),
           "atol": atol, "rtol": rtol}
    if real.shape != golden.shape:
        row.update(status="fail", note=f"shape {tuple(real.shape)} vs golden {tuple(golden.shape)}")
        return row
    exact = not (real.is_floating_point() or real.is_complex())
    a = real.detach().to("cpu", torch.float64).numpy() if not real.is_complex() else \
        torch.view_as_real(real.detach().cpu()).double().numpy()
    b = golden.detach().to("cpu", torch.float64).numpy() if not golden.is_complex() else \
        torch.view_as_real(golden.detach().cpu()).double().numpy()
    m = tensor_metrics(a, b, rtol=max(rtol, 1e-300), floor=atol / max(rtol, 1e-300), exact=exact)
    row.update(max_abs=_num(m.max_abs), max_rel=_num(m.max_rel), cosine=_num(m.cosine),
               tol_ratio=_num(m.tol_ratio), beyond=_num(m.beyond))
    notes = list(m.notes)
    ok = True
    if m.nonfinite_mismatch:
        ok = False
        notes.append(f"{m.nonfinite_mismatch} NaN/Inf not in the golden")
    if exact and m.exact_mismatch:
        ok = False
        notes.append(f"{m.exact_mismatch} elements differ")
    elif not exact and not math.isnan(m.tol_ratio) and m.tol_ratio > 1.0:
        ok = False
        notes.append(f"{m.beyond:.2%} of elements beyond tolerance, worst {m.tol_ratio:.3g}x")
    row["status"] = "pass" if ok else "fail"
    row["note"] = "; ".join(notes)
    return row


def _num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
