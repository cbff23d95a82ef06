"""Crash dump: when a registered API raises, save that one call so it can be rerun alone.

Porting engineers rebuild a one-API case by hand from saved inputs when a kernel crashes
or writes out of bounds. While the debugger is active, an exception raised inside a
registered API (or a custom op) writes ``{dump_path}/exception/{entry}/``:

* ``dump.json`` + ``dump_tensor_data/*.pt`` — the call's inputs in dump format (so
  ``probe repro``, ``probe compare`` and msprobe habits work on it), CPU copies with
  their dtype, shape and stride;
* ``stack.json`` and ``exception.json`` — the user's stack, the module path, the
  exception and its traceback, and which inputs were changed in place by the call;
* ``repro_{entry}.py`` — a standalone script that reruns the call.

The exception is then re-raised: same object, same traceback.

Inputs "before the call": by default only references and version counters are kept
before the call, and tensors are copied after the failure; a version that moved means
the call changed that input in place, which ``exception.json`` says. With
``capture_inputs=True`` every call's inputs are copied before it runs (slow; for the
case where a failed kernel leaves the device unusable, e.g. a CUDA device-side assert).

    from probe.forensics import crash
    crash.enable(debugger)          # or CrashGuard(handler, lambda: dump_path)
"""
import os
import time
import traceback

import torch

from probe.forensics import hub as _hub
from probe.forensics.evidence import (
    cpu_copy,
    current_rank,
    describe_tensor,
    format_frames,
    log,
    module_path,
    summary,
    write_json,
)
from probe.tensor_tree import keyed_tensors

_inference_mode = torch.is_inference_mode_enabled


def _version(t):
    """``t._version``; None for an inference tensor, which has no version counter."""
    return None if t.is_inference() else t._version

MAX_DUMPS = 20          # per process: a loop that catches an API's error must not fill the disk


class CrashDump(_hub.Feature):
    """The crash-dump feature of a :class:`~probe.forensics.hub.ForensicsHandler`."""

    def __init__(self, dump_dir_fn, capture_inputs=False, write_repro=True, max_dumps=MAX_DUMPS):
        self.dump_dir_fn = dump_dir_fn
        self.capture_inputs = capture_inputs
        self.write_repro = write_repro
        self.max_dumps = max_dumps
        self.written = []          # folders written, in order
        self._seen = set()         # (api, exception type): one dump each

    @property
    def failure_only(self):
        return not self.capture_inputs

    def before(self, call):
        if self.capture_inputs:
            found = _tensors(call)
            return [(key, t, _version(t), cpu_copy(t)) for key, t in found] or None
        return self.before_fast(call.args)

    @staticmethod
    def before_fast(args):
        """Runs on every call: only the versions, to tell later whether the failing call
        modified a tensor before raising."""
        if not _inference_mode():
            try:
                return {id(a): a._version for a in args if isinstance(a, torch.Tensor)}
            except RuntimeError:   # an inference tensor used outside inference_mode
                pass
        # an inference tensor has no version counter: reading it raises, ~50 us a call
        return {id(a): a._version for a in args if isinstance(a, torch.Tensor) and not a.is_inference()}

    def failed(self, call, state, exc):
        if len(self.written) >= self.max_dumps:
            return
        key = (call.name, type(exc))
        if key in self._seen:
            return
        self._seen.add(key)
        if not isinstance(state, list):
            versions = state or {}
            state = [(k, t, versions[id(t)] if id(t) in versions else _version(t), None) for k, t in _tensors(call)]
        folder = self._save(call, state, exc)
        self.written.append(folder)
        log.warning("probe: %s raised %s; its inputs, stack and a repro script are in %s",
                    call.entry + ".forward", type(exc).__name__, folder)

    # ---- writing --------------------------------------------------------------
    def _save(self, call, tensors, exc):
        entry = call.entry + ".forward"
        root = os.path.join(self.dump_dir_fn(), "exception")
        folder = _claim(root, entry)
        data_dir = os.path.join(folder, "dump_tensor_data")
        os.makedirs(data_dir)
        notes = []
        saved = {}                       # key -> (data_name, summary)
        for key, t, version, copy in tensors:
            name = f"{entry}.{key}.pt"
            info = describe_tensor(t)
            info["requires_grad"] = bool(t.requires_grad)
            if copy is None:
                try:
                    copy = cpu_copy(t)
                    info["copied"] = "after the failure"
                    if version is not None and t._version != version:
                        info["modified_in_place"] = True
                        notes.append(f"{key} was modified in place by the failing call: "
                                     "the saved values are after the call")
                except Exception as err:   # a device left unusable by the failed kernel
                    info["copied"] = f"failed: {type(err).__name__}: {err}"
                    notes.append(f"{key} could not be copied after the failure ({err}); "
                                 "rerun with capture_inputs=True to copy inputs before each call")
            else:
                info["copied"] = "before the call"
            if copy is not None:
                torch.save(copy, os.path.join(data_dir, name))
                info.update(summary(copy))
                info["data_name"] = name
            saved[key] = info
        record = {"input_args": _describe(call.args, "input", saved, positional=True),
                  "input_kwargs": _describe(call.kwargs, "kwargs", saved, positional=False),
                  "output": []}
        write_json(os.path.join(folder, "dump.json"),
                   {"task": "tensor", "level": "L1", "framework": "pytorch",
                    "dump_data_dir": data_dir, "data": {entry: record}})
        frames, modules = call.site()
        stack = format_frames(frames)
        write_json(os.path.join(folder, "stack.json"), {"0": [[entry], stack]})
        devices = sorted({str(t.device) for _, t, _, _ in tensors})
        meta = {
            "entry": entry, "api": call.name,
            "exception": {"type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                          "message": str(exc)[:8000]},
            "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__)[-40:],
            "stack": stack, **module_path(modules),
            "inputs": saved, "notes": notes, "devices": devices,
            "rank": current_rank(), "pid": os.getpid(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "torch": torch.__version__,
        }
        if self.write_repro:
            try:
                from probe.forensics.repro import generate
                device = next((d.split(":")[0] for d in devices if not d.startswith("cpu")), "cpu")
                meta["repro"] = generate(folder, entry, device=device,
                                         output=os.path.join(folder, f"repro_{entry}.py"))
            except Exception as err:
                meta["repro"] = None
                meta["notes"].append(f"no repro script: {type(err).__name__}: {err}")
        write_json(os.path.join(folder, "exception.json"), meta)
        return folder


def _tensors(call):
    """The call's tensors keyed as dump files name them (``EntryBuilder.inputs``): positional
    ``input.0``, ``input.1.2``; keyword by name, ``dim``, ``k.0``."""
    found = [(".".join(["input", *map(str, keys)]), t) for keys, t in keyed_tensors(call.args)]
    found += [(".".join(map(str, keys)), t) for keys, t in keyed_tensors(call.kwargs)]
    return found


def _describe(value, prefix, saved, positional):
    """dump.json's form of the arguments, over the containers ``keyed_tensors`` walks
    (``torch.Size`` a value, as the dump records it), tensors keyed as ``_tensors`` does."""
    from probe.dump.records import describe_value, tensor_summary
    items = enumerate(value) if positional else value.items()

    def one(v, key):
        if type(v) is torch.Size:
            return describe_value(v)
        if isinstance(v, torch.Tensor):
            info = saved.get(key, {})
            d = tensor_summary(info.get("dtype", str(v.dtype)), info.get("shape", list(v.shape)),
                               bool(v.requires_grad), info)
            d["stride"], d["device"] = info.get("stride"), info.get("device")
            if "data_name" in info:
                d["data_name"] = info["data_name"]
            return d
        if isinstance(v, (list, tuple)):
            return [one(x, f"{key}.{i}") for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {k: one(x, f"{key}.{k}") for k, x in v.items()}
        return describe_value(v)

    if positional:
        return [one(v, f"{prefix}.{k}") for k, v in items]
    return {k: one(v, k) for k, v in items}


def _claim(root, entry):
    """Create a new folder for ``entry`` (another rank or step may hold the plain name)."""
    os.makedirs(root, exist_ok=True)
    for i in range(1000):
        folder = os.path.join(root, entry if i == 0 else f"{entry}.{i}")
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue
    raise OSError(f"too many crash dumps named {entry} under {root}")


class CrashGuard(_hub.ForensicsHandler):
    """A handler wrapper with crash dumps only: ``CrashGuard(handler, lambda: dump_path)``."""

    def __init__(self, handler, dump_dir_fn, namer=None, **options):
        super().__init__(handler, namer, [CrashDump(dump_dir_fn, **options)])


def enable(debugger, capture_inputs=False, write_repro=True):
    """Turn crash dumps on for a debugger (now, or at its first ``start()``)."""
    h = _hub.hub(debugger)
    feature = h.get(CrashDump)
    if feature is None:
        feature = h.add(CrashDump(lambda: debugger.config.dump_path, capture_inputs, write_repro))
    feature.capture_inputs = capture_inputs
    return feature


def disable(debugger):
    _hub.hub(debugger).remove(CrashDump)
