"""Random APIs judged by statistics: their values cannot match a golden element by element.

Each check yields (label, row) with ``status`` pass / fail / skipped. Bounds are 6 standard
deviations of the estimator (a false alarm about once in 10^8 calls), plus range checks
that are exact (rand in [0, 1), randint in [low, high), randperm a permutation).
"""
import math

import torch

from probe.toolbox.golden_check import compare


def _arg(args, kwargs, i, key, default):
    if key in kwargs:
        return kwargs[key]
    return args[i] if len(args) > i else default


def _row(ok, note, **extra):
    return dict(extra, status="pass" if ok else "fail", note=note)


def _mean_check(x, expect, std, what):
    n = x.numel()
    got = float(x.double().mean())
    bound = 6 * std / math.sqrt(max(n, 1)) + 1e-12
    return _row(abs(got - expect) <= bound, f"{what}: mean {got:.5g}, expected {expect:.5g} +- {bound:.3g} (n={n})",
                max_abs=abs(got - expect))


def check_random(short, snapshot, out, tolerances, name):
    args, kwargs = snapshot
    outs = out if isinstance(out, (tuple, list)) else [out]
    y = outs[0] if outs and isinstance(outs[0], torch.Tensor) else None
    if y is None:
        return [("output.0", {"status": "skipped", "note": "random API without a tensor output"})]
    y = y.detach().cpu()
    base = short.rstrip("_")
    if "dropout" in base and "alpha" not in base:
        return _dropout(base, args, kwargs, y, tolerances, name)
    if base in ("rand", "rand_like", "uniform"):
        lo = float(_arg(args, kwargs, 1, "from", 0.0)) if base == "uniform" else 0.0
        hi = float(_arg(args, kwargs, 2, "to", 1.0)) if base == "uniform" else 1.0
        v = y.double()
        inside = bool(((v >= lo) & (v <= hi)).all())
        rows = [("output.0 range", _row(inside, f"values in [{lo}, {hi}]" if inside else f"values outside [{lo}, {hi}]"))]
        if y.numel() >= 100:
            rows.append(("output.0 mean", _mean_check(v, (lo + hi) / 2, (hi - lo) / math.sqrt(12), "uniform")))
        return rows
    if base in ("randn", "randn_like", "normal"):
        mean = _arg(args, kwargs, 1 if short == "normal_" else 0, "mean", 0.0) if base == "normal" else 0.0
        std = _arg(args, kwargs, 2 if short == "normal_" else 1, "std", 1.0) if base == "normal" else 1.0
        mean = mean.double() if isinstance(mean, torch.Tensor) else float(mean)
        std = std.double() if isinstance(std, torch.Tensor) else float(std)
        z = ((y.double() - mean) / std).flatten()
        rows = []
        if z.numel() >= 100:
            rows.append(("output.0 mean", _mean_check(z, 0.0, 1.0, "standardised")))
            s = float(z.std())
            bound = 6 * math.sqrt(1 / (2 * z.numel())) * 1.5
            rows.append(("output.0 std", _row(abs(s - 1) <= bound, f"standardised std {s:.5g}, expected 1 +- {bound:.3g}")))
        return rows or [("output.0", {"status": "skipped", "note": "too few samples"})]
    if base == "bernoulli":
        if short == "bernoulli_" or "p" in kwargs or (len(args) > 1 and not isinstance(args[1], torch.Generator)):
            p = _arg(args, kwargs, 1, "p", 0.5)
            p = p.double() if isinstance(p, torch.Tensor) else float(p)
        else:
            p = args[0].double()
        binary = bool(((y == 0) | (y == 1)).all())
        rows = [("output.0 values", _row(binary, "values in {0, 1}" if binary else "values other than 0 and 1"))]
        pm = p if isinstance(p, float) else float(p.mean())
        var = pm * (1 - pm) if isinstance(p, float) else float((p * (1 - p)).mean())
        if y.numel() >= 100:
            rows.append(("output.0 mean", _mean_check(y, pm, math.sqrt(var), "bernoulli")))
        return rows
    if base == "randint":
        ints = [a for a in args if isinstance(a, int)]
        lo, hi = (0, ints[0]) if len(ints) == 1 else (ints[0], ints[1]) if len(ints) >= 2 else \
            (kwargs.get("low", 0), kwargs.get("high"))
        ok = hi is None or bool(((y >= lo) & (y < hi)).all())
        return [("output.0 range", _row(ok, f"values in [{lo}, {hi})"))]
    if base == "randperm":
        ok = bool((y.sort().values == torch.arange(y.numel(), dtype=y.dtype)).all())
        return [("output.0 permutation", _row(ok, "a permutation of 0..n-1" if ok else "not a permutation"))]
    if base == "multinomial":
        probs = args[0].double()
        n_samples = int(_arg(args, kwargs, 1, "num_samples", 1))
        replacement = bool(_arg(args, kwargs, 2, "replacement", False))
        p2 = probs.reshape(-1, probs.shape[-1])
        y2 = y.reshape(p2.shape[0], n_samples).long()
        in_range = bool(((y2 >= 0) & (y2 < p2.shape[1])).all())
        ok = in_range and bool((p2.gather(1, y2.clamp(0, p2.shape[1] - 1)) > 0).all())
        note = "samples only from categories with probability > 0" if ok else "sampled a zero-probability or invalid category"
        if ok and not replacement:
            uniq = all(len(set(r.tolist())) == n_samples for r in y2)
            ok, note = uniq, note if uniq else "repeated category without replacement"
        return [("output.0 support", _row(ok, note))]
    return [("output.0", {"status": "skipped", "note": f"random API {short}: no statistical check"})]


def _dropout(base, args, kwargs, y, tolerances, name):
    x = args[0]
    p = float(_arg(args, kwargs, 1, "p", 0.5))
    train = _arg(args, kwargs, 2, "training", None)
    if train is None:
        train = kwargs.get("train", True)
    atol, rtol = tolerances.get(name, y.dtype)
    if not train or p == 0.0:
        return [("output.0", compare(y, x, atol, rtol))]
    if p == 1.0:
        ok = bool((y == 0).all())
        return [("output.0", _row(ok, "all zero for p=1" if ok else "non-zero output for p=1"))]
    xd, yd = x.detach().double(), y.double()
    nz = xd != 0
    n = int(nz.sum())
    dropped = int(((yd == 0) & nz).sum())
    ratio = dropped / max(n, 1)
    feature = base not in ("dropout", "native_dropout")
    n_eff = max(n, 1)
    if feature and x.dim() >= 2:
        n_eff = max(1, x.shape[0] * x.shape[1] if x.dim() > 2 else x.shape[0])
    bound = 6 * math.sqrt(p * (1 - p) / n_eff) + 1e-3
    rows = [("output.0 zero ratio", _row(abs(ratio - p) <= bound,
             f"zero ratio {ratio:.4f} vs p={p} +- {bound:.3g} ({n} non-zero inputs)", max_abs=abs(ratio - p)))]
    kept = (yd != 0)
    if int(kept.sum()):
        row = compare(y[kept], (xd / (1 - p))[kept], atol, rtol)
        row["note"] = "kept values = input / (1 - p); " + row.get("note", "")
        rows.append(("output.0 kept values", row))
    return rows
