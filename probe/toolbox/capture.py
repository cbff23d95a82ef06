"""OpCapture: save chosen APIs' real inputs, outputs and gradients, for ``probe replay``.

One folder per call, ``DIR/<API name>/<call id>/``:

* ``meta.json``: the API name and the argument tree in JSON, tensors as ``{"T": i}``
  (dtype, shape, device, requires_grad listed under ``tensors``);
* ``inputs.pt`` / ``outputs.pt`` / ``grads.pt``: CPU tensors only, ``{"0": t, ...}``,
  loaded back with ``torch.load(weights_only=True)``: nothing but tensors is ever unpickled.

Inputs are copied *before* the call (an in-place API overwrites them); gradients w.r.t.
the call's outputs and its own inputs are observed with grad_capture (no tensor wrapped).
"""
import json
import logging
import os

import torch

from probe.dump.stats import torch_copy
from probe.hook_module import grad_capture
from probe.hook_module.interceptor import guard
from probe.toolbox import base

log = logging.getLogger(__name__)

_SPECIAL = (torch.memory_format, torch.layout)


host_copy = torch_copy   # a detached CPU copy that keeps dtype and (dense tensors) strides


def encode(value, tensors, metas, memo=None):
    """Argument tree -> JSON-able tree; tensors go to ``tensors`` (same object -> same index)."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        idx = memo.get(id(value))
        if idx is None:
            idx = memo[id(value)] = len(tensors)
            tensors.append(value)
            metas.append({"dtype": str(value.dtype).replace("torch.", ""), "shape": list(value.shape),
                          "device": str(value.device), "requires_grad": bool(value.requires_grad)})
        return {"T": idx}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode(v, tensors, metas, memo) for v in value]}
    if isinstance(value, list):
        return [encode(v, tensors, metas, memo) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v, tensors, metas, memo) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, _SPECIAL):
        return {"attr": str(value).replace("torch.", "")}
    if isinstance(value, slice):
        return {"slice": [encode(value.start, tensors, metas, memo), encode(value.stop, tensors, metas, memo),
                          encode(value.step, tensors, metas, memo)]}
    if value is Ellipsis:
        return {"ellipsis": 1}
    return {"unsupported": repr(value)[:200]}


def decode(node, tensors):
    """Inverse of :func:`encode`; ``tensors`` indexed as saved. Raises ValueError if unsupported."""
    if isinstance(node, list):
        return [decode(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if "T" in node:
        return tensors[node["T"]]
    if "tuple" in node:
        return tuple(decode(v, tensors) for v in node["tuple"])
    if "dict" in node:
        return {k: decode(v, tensors) for k, v in node["dict"].items()}
    if "size" in node:
        return torch.Size(node["size"])
    if "dtype" in node:
        return getattr(torch, node["dtype"])
    if "device" in node:
        return torch.device(node["device"])
    if "attr" in node:
        return getattr(torch, node["attr"])
    if "slice" in node:
        return slice(*(decode(v, tensors) for v in node["slice"]))
    if "ellipsis" in node:
        return Ellipsis
    raise ValueError(f"argument not replayable: {node.get('unsupported', node)}")


def _has_unsupported(node):
    if isinstance(node, list):
        return any(_has_unsupported(v) for v in node)
    if isinstance(node, dict):
        return "unsupported" in node or any(_has_unsupported(v) for v in node.values())
    return False


class CallRecord:
    """One call's files; inputs are encoded at construction (before the API runs)."""

    def __init__(self, folder, name, call_id, args, kwargs):
        self.folder = folder
        self.tensors, metas = [], []
        memo = {}
        tree = {"args": encode(list(args), self.tensors, metas, memo),
                "kwargs": encode(dict(kwargs), self.tensors, metas, memo)}
        self.tensors = [host_copy(t) for t in self.tensors]
        self.meta = {"name": name, "call_id": call_id, "inputs": tree, "tensors": metas,
                     "replayable": not _has_unsupported(tree)}

    def save_forward(self, out, note=None):
        os.makedirs(self.folder, exist_ok=True)
        outs, metas = [], []
        self.meta["outputs"] = encode(out, outs, metas)
        self.meta["output_tensors"] = metas
        if note:
            self.meta["note"] = note
        torch.save({str(i): t for i, t in enumerate(self.tensors)}, os.path.join(self.folder, "inputs.pt"))
        torch.save({str(i): host_copy(t) for i, t in enumerate(outs)}, os.path.join(self.folder, "outputs.pt"))
        self._write_meta()
        self.tensors = None

    def save_grads(self, out_grads, in_grads):
        """``out_grads`` per flat output, ``in_grads`` per flat input tensor (CPU copies or None)."""
        data = {f"out.{j}": g for j, g in enumerate(out_grads) if g is not None}
        data.update({f"in.{i}": g for i, g in enumerate(in_grads) if g is not None})
        torch.save(data, os.path.join(self.folder, "grads.pt"))
        self.meta["has_grads"] = True
        self._write_meta()

    def _write_meta(self):
        tmp = os.path.join(self.folder, "meta.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.meta, f, indent=1)
        os.replace(tmp, os.path.join(self.folder, "meta.json"))


def flat_input_slots(args, kwargs):
    """The flat input list grad_capture sees: every tensor in argument order, repeats included."""
    return base.flat_tensors((list(args), dict(kwargs)))


class OpCapture(base.ToolBase):
    """Save inputs, outputs and gradients of chosen APIs into ``output_dir``.

    ``max_calls``: at most this many calls per API (default unlimited);
    ``backward``: also save gradients (default True).
    """
    feature = "op_capture"
    env_list = "OP_CAPTURE_LIST"
    env_disable_list = "OP_CAPTURE_DISABLE_LIST"

    def __init__(self, ops=None, disable_ops=None, condition_func=None, output_dir=None,
                 max_calls=None, backward=True, yaml_path=None, verbose=None):
        super().__init__(ops, disable_ops, condition_func, yaml_path, output_dir, verbose)
        self.max_calls = max_calls
        self.backward = backward
        self.saved = []  # folders written

    def handle(self, name, call_id, func, args, kwargs):
        if self.max_calls is not None and call_id >= self.max_calls:
            return func(*args, **kwargs)
        rec = grad_state = None
        try:
            with guard():
                rec = CallRecord(os.path.join(self.output_dir, name, str(call_id)), name, call_id, args, kwargs)
                if self.backward and torch.is_grad_enabled():
                    flat = flat_input_slots(args, kwargs)
                    if any(t.requires_grad for t in flat):
                        grad_state = (grad_capture.edges_before(flat), len(flat))
        except Exception as exc:
            self.fail(name, exc)
            rec = None
        out = func(*args, **kwargs)
        if rec is not None:
            try:
                with guard():
                    rec.save_forward(out)
                    self.saved.append(rec.folder)
                    if self.verbose:
                        log.info("probe op_capture: %s.%s saved to %s", name, call_id, rec.folder)
                    if grad_state is not None:
                        before, n = grad_state
                        grad_capture.hook_call(before, base.flat_outputs(out), n, _grad_copy,
                                               self._grads_done(name, rec))
            except Exception as exc:
                self.fail(name, exc)
        return out

    def _grads_done(self, name, rec):
        def on_done(out_grads, in_grads):
            try:
                with guard():
                    rec.save_grads(out_grads, in_grads)
            except Exception as exc:
                self.fail(name, exc)
        return on_done


def _grad_copy(g):
    with guard():
        return host_copy(g)
