"""Load dumped tensor files safely: never unpickle, never leave the dump folder."""
from __future__ import annotations

import os

import numpy as np

from probe.errors import ConfigError


def resolve(data_dir: str, data_name: str) -> str:
    """Path of ``data_name`` inside ``data_dir``; ValueError if it would escape it."""
    if not data_name or os.path.isabs(data_name) or "\x00" in data_name:
        raise ConfigError(f"refused data_name {data_name!r}: not a plain file name")
    root = os.path.realpath(data_dir)
    path = os.path.realpath(os.path.join(root, data_name))
    if os.path.dirname(path) != root and not path.startswith(root + os.sep):
        raise ConfigError(f"refused data_name {data_name!r}: escapes {data_dir}")
    return path


def load(path: str) -> np.ndarray:
    """A tensor file as a numpy array (bf16 widened to float32; no pickle allowed)."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    if path.endswith(".pt"):
        import torch
        t = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"{os.path.basename(path)} does not hold a tensor")
        t = t.detach()
        if t.dtype not in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                           torch.int64, torch.float16, torch.float32, torch.float64):
            t = t.float()   # bf16, fp8 ...: numpy has no such dtype
        return t.numpy()
    raise ConfigError(f"unknown tensor file type: {os.path.basename(path)}")
