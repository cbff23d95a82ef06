"""Rerun captured API calls (OpCapture folders, autocompare's saved failures).

For each call: inputs rebuilt on ``device`` from the saved CPU tensors, the API run
(``times`` timed runs after one warm-up, fresh inputs each time so in-place APIs start from
the captured values), its outputs compared with the saved outputs and with a CPU golden
(float64 for accumulating APIs), and, unless forward-only, its input gradients for the
saved output gradients compared with the saved input gradients and with the golden's.
"""
import json
import os
import time

import torch

from probe import torch_compat
from probe.errors import ConfigError
from probe.toolbox import base
from probe.toolbox.autocompare import golden_dtype, golden_inputs
from probe.toolbox.capture import decode, flat_input_slots
from probe.toolbox.golden_check import compare
from probe.toolbox.options import Tolerances
from probe.untrusted import open_file


def find_calls(root):
    """Folders holding a meta.json under ``root``, by API name then call id."""
    found = []
    for dirpath, _, files in os.walk(root):
        if "meta.json" in files:
            found.append(dirpath)

    def key(p):
        head, tail = os.path.split(p)
        return (head, int(tail) if tail.isdigit() else tail)
    return sorted(found, key=key)


def _load(path):
    """A capture's saved tensors: a regular file, loaded only where weights_only=True is
    safe (torch >= 2.6, CVE-2025-32434); else one ConfigError line."""
    if not os.path.exists(path):
        return {}
    if not torch_compat.SAFE_WEIGHTS_ONLY:
        raise ConfigError(f"{path}: refused to load a .pt file with torch {torch.__version__}: "
                          "torch.load(weights_only=True) can run code from a crafted file before "
                          "torch 2.6 (CVE-2025-32434); upgrade torch to replay captures")
    with open_file(path) as fh:
        return torch.load(fh, map_location="cpu", weights_only=True)


def _timed(prepare, run, device, times):
    """Mean ms of ``times`` runs of ``run(prepare())`` after one untimed warm-up;
    ``prepare`` (fresh inputs) is outside the timed region."""
    run(prepare())
    total = 0.0
    for _ in range(times):
        x = prepare()
        base.synchronize(device)
        t0 = time.perf_counter()
        run(x)
        base.synchronize(device)
        total += time.perf_counter() - t0
    return total * 1e3 / max(times, 1)


class Replayer:
    def __init__(self, device="cpu", times=1, forward_only=False, check=True, timing=False,
                 yaml_path=None, tolerances=None):
        self.device = torch.device(device)
        self.times = max(1, int(times))
        self.forward_only = forward_only
        self.check = check
        self.timing = timing
        self.tolerances = tolerances or Tolerances()
        self.funcs = base.func_table(base.resolved_registry(yaml_path))

    def replay(self, folder):
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        name = meta["name"]
        res = {"folder": folder, "name": name, "call_id": meta.get("call_id"), "status": "pass",
               "checks": [], "forward_ms": None, "backward_ms": None, "note": ""}
        func = self.funcs.get(name)
        if func is None or not meta.get("replayable", True):
            res.update(status="skipped", note="API not in the registry" if func is None else "arguments not replayable")
            return res
        saved = _load(os.path.join(folder, "inputs.pt"))
        cpu_tensors = [saved[str(i)] for i in range(len(meta["tensors"]))]
        needs_grad = [m["requires_grad"] and cpu_tensors[i].is_floating_point()
                      for i, m in enumerate(meta["tensors"])]
        grads = _load(os.path.join(folder, "grads.pt"))
        do_bwd = not self.forward_only and any(k.startswith("out.") for k in grads) and any(needs_grad)

        def build(with_grad):
            ts = []
            for t, rg in zip(cpu_tensors, needs_grad):
                d = t.to(self.device, copy=True)
                ts.append(d.requires_grad_(True) if (with_grad and rg) else d)
            args = decode(meta["inputs"]["args"], ts)
            kwargs = decode(meta["inputs"]["kwargs"], ts)
            args, kwargs = base.swap_devices(tuple(args), kwargs, self.device)
            # leaves cannot be modified in place: the API gets clones, grads are taken on the leaves
            leaves = ts
            if with_grad:
                clones = {id(t): t.clone() if t.requires_grad else t for t in ts}
                args = base.map_tensors(lambda t: clones[id(t)], args)
                kwargs = base.map_tensors(lambda t: clones[id(t)], kwargs)
                leaves = {id(clones[id(t)]): t for t in ts}
            return args, kwargs, leaves

        args, kwargs, leaves = build(do_bwd)
        with torch.set_grad_enabled(do_bwd):
            out = func(*args, **kwargs)
        outs = base.flat_outputs(out)
        if self.timing:
            def fwd(prepared):
                with torch.no_grad():
                    func(*prepared[0], **prepared[1])
            res["forward_ms"] = _timed(lambda: build(False), fwd, self.device, self.times)
        if self.check:
            self._check_forward(res, meta, folder, name, out, outs, cpu_tensors)
        if do_bwd:
            flat = flat_input_slots(args, kwargs)
            self._backward(res, name, func, args, kwargs, flat, outs, grads, leaves, meta, cpu_tensors, build)
        if any(c["status"] == "fail" for c in res["checks"]):
            res["status"] = "fail"
        return res

    def _add(self, res, what, row):
        res["checks"].append(dict(row, what=what))

    def _check_forward(self, res, meta, folder, name, out, outs, cpu_tensors):
        saved_out = _load(os.path.join(folder, "outputs.pt"))
        if meta.get("outputs") is not None and saved_out:
            ref = base.flat_outputs(decode(meta["outputs"], [saved_out[str(i)] for i in range(len(saved_out))]))
            for j, (r, s) in enumerate(zip(outs, ref)):
                if r is not None and s is not None:
                    self._add(res, f"output.{j} vs saved", compare(r, s, *self.tolerances.get(name, s.dtype)))
        gd = golden_dtype(name)
        snap = (decode(meta["inputs"]["args"], cpu_tensors), decode(meta["inputs"]["kwargs"], cpu_tensors))
        (gargs, gkwargs), _ = golden_inputs(snap, gd, False)
        gargs, gkwargs = base.swap_devices(tuple(gargs), gkwargs, "cpu")
        try:
            with torch.no_grad():
                gouts = base.flat_outputs(self.funcs[name](*gargs, **gkwargs))
        except Exception as exc:
            self._add(res, "golden", {"status": "skipped", "note": f"golden failed: {exc}"})
            return
        for j, (r, g) in enumerate(zip(outs, gouts)):
            if r is not None and g is not None:
                self._add(res, f"output.{j} vs {str(gd)[6:]} golden", compare(r, g, *self.tolerances.get(name, r.dtype)))

    def _backward(self, res, name, func, args, kwargs, flat, outs, grads, leaves, meta, cpu_tensors, build):
        pairs = [(o, grads[f"out.{j}"].to(o.device, o.dtype)) for j, o in enumerate(outs)
                 if o is not None and o.requires_grad and f"out.{j}" in grads]
        slots = [i for i, t in enumerate(flat) if id(t) in leaves and leaves[id(t)].requires_grad]
        if not pairs or not slots:
            return
        uniq = list({id(leaves[id(flat[i])]): leaves[id(flat[i])] for i in slots}.values())
        got = torch.autograd.grad([p[0] for p in pairs], uniq, [p[1] for p in pairs],
                                  allow_unused=True, retain_graph=self.timing)
        by_leaf = {id(u): g for u, g in zip(uniq, got)}
        if self.timing:
            def bwd(_):
                torch.autograd.grad([p[0] for p in pairs], uniq, [p[1] for p in pairs],
                                    allow_unused=True, retain_graph=True)
            res["backward_ms"] = _timed(lambda: None, bwd, self.device, self.times)
        if not self.check:
            return
        for i in slots:
            g, s = by_leaf[id(leaves[id(flat[i])])], grads.get(f"in.{i}")
            if g is not None and s is not None:
                self._add(res, f"grad_input.{i} vs saved", compare(g, s, *self.tolerances.get(name, s.dtype)))
        self._check_backward_golden(res, name, meta, cpu_tensors, grads, slots,
                                    {i: by_leaf[id(leaves[id(flat[i])])] for i in slots})

    def _check_backward_golden(self, res, name, meta, cpu_tensors, grads, slots, replayed):
        """Input gradients against the CPU golden's for the same saved output gradients."""
        gd = golden_dtype(name)
        try:
            ts = [t.detach().clone().requires_grad_(m["requires_grad"] and t.is_floating_point())
                  for t, m in zip(cpu_tensors, meta["tensors"])]
            snap = (decode(meta["inputs"]["args"], ts), decode(meta["inputs"]["kwargs"], ts))
            (gargs, gkwargs), gleaves = golden_inputs(snap, gd, True)
            with torch.enable_grad():
                gouts = base.flat_outputs(self.funcs[name](*gargs, **gkwargs))
            pairs = [(o, grads[f"out.{j}"].to(o.dtype)) for j, o in enumerate(gouts)
                     if o is not None and o.requires_grad and f"out.{j}" in grads]
            want = [(i, gleaves[i]) for i in slots if i < len(gleaves) and gleaves[i] is not None]
            if not pairs or not want:
                return
            got = torch.autograd.grad([p[0] for p in pairs], [leaf for _, leaf in want],
                                      [p[1] for p in pairs], allow_unused=True)
        except Exception as exc:
            self._add(res, "golden backward", {"status": "skipped", "note": f"golden backward failed: {exc}"})
            return
        for (i, _), golden in zip(want, got):
            g = replayed.get(i)
            if g is not None and golden is not None:
                self._add(res, f"grad_input.{i} vs {str(gd)[6:]} golden",
                          compare(g, golden, *self.tolerances.get(name, g.dtype)))
