"""Load dumped tensor files safely: never unpickle, never leave the dump folder, never block.

A tensor file comes from someone else's dump: it is opened through ``probe.untrusted``
(inside its folder, a regular file, so a FIFO named like one cannot hang the compare) and
must hold one array of numbers. A ``.pt`` file is read with ``torch.load(weights_only=True)``
only on torch >= 2.6: before it that guard can be bypassed (CVE-2025-32434), so there the
file is refused with one line rather than unpickled.
"""
from __future__ import annotations

import os
import pickle
import zipfile

import numpy as np

from probe.errors import DumpError
from probe.untrusted import inside, is_inside, open_file

# numpy kinds a tensor's values can have: bool, signed/unsigned int, float, complex
_NUMBER_KINDS = "biufc"


def resolve(data_dir: str, data_name) -> str:
    """Path of ``data_name`` inside ``data_dir``; DumpError if it is not a plain name or
    would escape it."""
    return inside(data_dir, data_name, "data_name")


def data_folder(dump_json: str, dump_data_dir) -> str | None:
    """The folder of a dump's tensor files: ``dump_tensor_data`` beside dump.json, else
    dump.json's own ``dump_data_dir`` (msprobe's), a relative one read from dump.json's
    folder (not the working directory); None where there is neither. DumpError for a
    ``dump_data_dir`` outside dump.json's folder: a dump is read only inside its folder."""
    folder = os.path.dirname(os.path.abspath(dump_json))
    beside = os.path.join(folder, "dump_tensor_data")
    if os.path.isdir(beside):
        return beside
    if not isinstance(dump_data_dir, str) or not dump_data_dir:
        return None
    given = os.path.join(folder, dump_data_dir)       # (an absolute one stays as it is)
    if not os.path.isdir(given):
        return None
    if not is_inside(folder, given):
        raise DumpError(f"{dump_json}: refused dump_data_dir {dump_data_dir!r}: it is outside the dump's "
                        f"folder {folder}; probe reads tensor files only inside it (move them to "
                        f"{beside})")
    return given


def load(path: str) -> np.ndarray:
    """A tensor file as a numpy array (bf16 widened to float32; no pickle allowed);
    DumpError (one line naming the file) for anything else."""
    name = os.path.basename(path)
    if not path.endswith((".npy", ".pt")):
        raise DumpError(f"unknown tensor file type: {name} (.npy or .pt)")
    with open_file(path) as fh:
        if path.endswith(".npy"):
            try:
                arr = np.load(fh, allow_pickle=False)
            except (ValueError, EOFError, OSError) as exc:   # a pickle, a damaged header, cut off
                raise DumpError(f"{path}: not a numpy array file numpy can read without "
                                f"unpickling ({_first_line(exc)})") from None
            if not isinstance(arr, np.ndarray):
                raise DumpError(f"{path}: holds no single array")
        else:
            arr = load_pt(fh, path)
    if arr.dtype.kind not in _NUMBER_KINDS or arr.dtype.fields is not None:
        raise DumpError(f"{path}: holds dtype {arr.dtype}, not a tensor's numbers")
    return arr


def load_pt(fh, path: str):
    """The tensor of a ``.pt`` file (``torch.load(weights_only=True)``), as numpy;
    DumpError where the installed torch cannot load it safely or it holds no tensor."""
    from probe import torch_compat
    import torch
    if not torch_compat.SAFE_WEIGHTS_ONLY:
        raise DumpError(f"{path}: refused to load a .pt file with torch {torch.__version__}: "
                        "torch.load(weights_only=True) can run code from a crafted file before "
                        "torch 2.6 (CVE-2025-32434); upgrade torch or dump as .npy")
    try:
        t = torch.load(fh, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError,
            zipfile.BadZipFile) as exc:          # damaged, or a pickle of more than tensors
        # (torch's own text suggests weights_only=False: not advice for a file from elsewhere)
        raise DumpError(f"{path}: not a tensor file torch.load(weights_only=True) accepts: damaged, "
                        f"or a pickle of more than tensors ({type(exc).__name__}); refused") from None
    if not isinstance(t, torch.Tensor):
        raise DumpError(f"{path}: does not hold a tensor (holds a {type(t).__name__})")
    t = t.detach()
    if t.dtype not in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                       torch.int64, torch.float16, torch.float32, torch.float64):
        t = t.float()   # bf16, fp8 ...: numpy has no such dtype
    return t.numpy()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
