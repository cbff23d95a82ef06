"""The draws file of one step/rank folder: written by the NPU side, read by the bench.

``draws.safetensors`` next to ``dump.json`` (the same ``{dump_path}/step{N}/rank{R}/``),
in the safetensors layout: 8 bytes (little-endian length N), N bytes of JSON header, the
data. One uint8 tensor per random call, named by the call's forward entry in dump.json
(``Functional.dropout.3.forward``): a dropout's mask bit-packed (``numpy.packbits``, 1 bit
an element in row-major order, the first element in the high bit of byte 0); any other
random API's output values in row-major order, as bytes (bfloat16, which numpy lacks,
included). What each one is goes in the header's ``__metadata__``, a JSON text per entry
(safetensors allows only strings there)::

    {"__metadata__": {"format": "probe.draws/1",
                      "Functional.dropout.3.forward":
                          "{\"kind\":\"mask\",\"shape\":[2,4,16,16],\"dtype\":\"torch.float32\",\"p\":0.1}"},
     "Functional.dropout.3.forward": {"dtype": "U8", "shape": [256], "data_offsets": [0, 256]}}

``kind`` is ``mask`` or ``values``; ``shape``/``dtype`` are the call's input (mask) or
output (values); ``p`` is the dropout probability (masks only). ``safetensors.numpy``
reads the file; probe reads it without that package.

One file a step, written whole at ``step()`` with one create and one write: creating a
file costs 0.2-0.6 ms on the ext4 disk of this project's test machine, and an .npz (a zip
member per draw) or an index next to a data file cost twice that on the dropout GPT-2 of
bench/draws.py. Nothing in it is pickled or names another
file, so the bench can neither unpickle nor be led outside the dump; every offset is
checked against the file's size, and every defect is a one-line
:class:`~probe.errors.ConfigError` naming the file.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from probe.dump.stats import numpy_of
from probe.errors import ConfigError, DumpError
from probe.untrusted import inside, read_bytes
from probe.vocabulary import FORWARD, api_name

FORMAT = "probe.draws/1"
FILE = "draws.safetensors"
MASK = "mask"
VALUES = "values"
KINDS = (MASK, VALUES)
_MAX_HEADER = 100 << 20    # safetensors' own limit


def _draw_entry(entry) -> bool:
    """Whether ``entry`` may name a draw: an API call's forward entry, in plain ASCII."""
    n = api_name(entry) if isinstance(entry, str) else None
    return n is not None and n.direction == FORWARD and entry.isascii() and entry[0].isalpha() \
        and entry.replace(".", "").replace("_", "").isalnum()


@dataclass(frozen=True)
class DrawRecord:
    """What one random call drew (its bytes are the file's tensor of the same name)."""
    kind: str                  # MASK or VALUES
    shape: Tuple[int, ...]     # the input's shape (mask), the output's (values)
    dtype: str                 # "torch.float32": that tensor's dtype
    p: Optional[float] = None  # dropout probability (masks)

    def as_text(self) -> str:
        row: dict = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype}
        if self.p is not None:
            row["p"] = self.p
        return json.dumps(row, separators=(",", ":"))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def expected_nbytes(self) -> int:
        if self.kind == MASK:
            return (self.numel + 7) // 8
        return self.numel * torch.empty((), dtype=torch_dtype(self.dtype)).element_size()


# ---- arrays ------------------------------------------------------------------------
def pack_mask(mask: torch.Tensor) -> np.ndarray:
    """A bool tensor as numpy.packbits of its elements in row-major order (1 bit each).

    A CPU mask is packed by numpy; an accelerator's on the device, so that only the
    packed bytes cross to the host (8 elements a byte, the high bit first, as packbits)."""
    if mask.device.type == "cpu":
        return np.packbits(numpy_of(mask), axis=None)
    flat = mask.reshape(-1)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=flat.device)
    packed = (flat.view(-1, 8).to(torch.uint8) * weights).sum(1, dtype=torch.uint8)
    return packed.cpu().numpy()


def pack_nonzero(t: torch.Tensor) -> np.ndarray:
    """``pack_mask(t != 0)``, compared by numpy where it can read ``t`` (a CPU tensor of a
    dtype it has: ~2 us against ~6 for torch's comparison on a small tensor)."""
    if t.device.type == "cpu" and t.dtype not in _NOT_NUMPY:
        return np.packbits(numpy_of(t) != 0, axis=None)
    return pack_mask(t != 0)


def zero_free(t: torch.Tensor) -> bool:
    """No element of ``t`` is 0 (numpy counts a CPU tensor of a dtype it has)."""
    if t.device.type == "cpu" and t.dtype not in _NOT_NUMPY:
        return np.count_nonzero(numpy_of(t)) == t.numel()
    return int(t.count_nonzero()) == t.numel()


_NOT_NUMPY = frozenset(d for d in (torch.bfloat16, getattr(torch, "float8_e4m3fn", None),
                                   getattr(torch, "float8_e5m2", None)) if d is not None)


def unpack_mask(packed: np.ndarray, shape) -> torch.Tensor:
    """The bool CPU tensor ``pack_mask`` packed."""
    n = math.prod(shape)
    return torch.from_numpy(np.unpackbits(packed, count=n).astype(np.bool_)).reshape(tuple(shape))


def values_array(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t``'s values in row-major order, as a CPU uint8 array (a copy: an
    in-place draw's tensor may be written again later)."""
    t = t.detach()
    t = t.clone() if t.device.type == "cpu" else t.cpu()
    return t.reshape(-1).view(torch.uint8).numpy()


def values_tensor(raw: np.ndarray, rec: DrawRecord) -> torch.Tensor:
    """The CPU tensor of a values draw from its bytes."""
    return torch.from_numpy(raw.copy()).view(torch_dtype(rec.dtype)).reshape(rec.shape)


def torch_dtype(name: object) -> torch.dtype:
    """``"torch.float32"`` -> torch.float32; ValueError for anything else."""
    if isinstance(name, str) and name.startswith("torch."):
        value = getattr(torch, name[6:], None)
        if isinstance(value, torch.dtype):
            return value
    raise ValueError(f"not a torch dtype: {name!r}")


# ---- writing (NPU side) ----------------------------------------------------------------
def encode_step(draws: Dict[str, Tuple[DrawRecord, np.ndarray]]) -> list:
    """One step's draws (entry -> (record, array)) as the parts of its draws file: the
    header, then each draw's bytes (numpy arrays, written as they are)."""
    raws = []
    for entry, (_, arr) in draws.items():
        if not _draw_entry(entry):
            raise ValueError(f"draws: bad entry name {entry!r}")
        raws.append(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))   # an object array cannot be viewed so
    key = tuple((entry, rec, raw.size) for (entry, (rec, _)), raw in zip(draws.items(), raws))
    text = _headers.get(key)
    if text is None:   # a training loop draws the same calls every step: made once
        meta = {"format": FORMAT}
        header: dict = {"__metadata__": meta}
        offset = 0
        for entry, rec, size in key:
            meta[entry] = rec.as_text()
            header[entry] = {"dtype": "U8", "shape": [size], "data_offsets": [offset, offset + size]}
            offset += size
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        text = struct.pack("<Q", len(text)) + text
        if len(_headers) > 64:
            _headers.clear()
        _headers[key] = text
    return [text] + raws


_headers: Dict[tuple, bytes] = {}


def write_step(rank_dir: str, draws: Dict[str, Tuple[DrawRecord, np.ndarray]]) -> None:
    """Write one step's draws as ``rank_dir/draws.safetensors``: one create, one write."""
    parts = encode_step(draws)
    fd = os.open(os.path.join(rank_dir, FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        total = sum(memoryview(p).nbytes for p in parts)
        done = os.writev(fd, parts) if hasattr(os, "writev") else 0
        if done < total:   # a short write (or no writev): the rest from where it stopped
            view = memoryview(b"".join(bytes(memoryview(p)) for p in parts))[done:]
            while view:
                view = view[os.pwrite(fd, view, total - len(view)):]
    finally:
        os.close(fd)


# ---- reading (bench side) ----------------------------------------------------------------
class StepDraws:
    """The draws one NPU step/rank folder holds.

    ``records`` maps entry -> DrawRecord; ``mask(entry)`` / ``values(entry)`` give the
    draw as a CPU tensor. The whole file is read and checked here.
    """

    def __init__(self, rank_dir: str, missing_ok: bool = False):
        self.rank_dir = rank_dir
        self.path = os.path.join(rank_dir, FILE)
        self.records: Dict[str, DrawRecord] = {}
        self.missing = False   # no file: the step made no random call (or an older probe dumped it)
        try:
            # a regular file inside the folder: a FIFO named draws.safetensors would block the
            # training script's first random call for ever; a symlink out of it is not read
            blob = read_bytes(inside(rank_dir, FILE, "draws file"))
        except FileNotFoundError:
            if missing_ok:
                self.missing = True
                return
            raise ConfigError(f"random_from: {self.path} not found: that NPU step made no random call, or was "
                              f"dumped by a probe that does not record draws") from None
        except DumpError as exc:
            raise ConfigError(f"random_from: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"random_from: {self.path}: unreadable ({exc.strerror or exc})") from None
        if len(blob) < 8:
            raise self._bad("shorter than its 8-byte header length")
        (n,) = struct.unpack("<Q", blob[:8])
        if n > min(_MAX_HEADER, len(blob) - 8):
            raise self._bad(f"header length {n} is past the end of the file ({len(blob)} bytes)")
        try:
            header = json.loads(blob[8:8 + n])
        except ValueError as exc:       # (not UTF-8 either: UnicodeDecodeError is a ValueError)
            raise self._bad(f"header is not JSON ({str(exc).splitlines()[0]})") from None
        except RecursionError:
            raise self._bad("header is nested too deeply to read") from None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise self._bad(f"not a {FORMAT} file")
        self._data = np.frombuffer(blob, dtype=np.uint8, offset=8 + n)
        self._spans: Dict[str, Tuple[int, int]] = {}
        for entry, info in header.items():
            if entry == "__metadata__":
                continue
            rec = self.records[entry] = self._record(entry, meta.get(entry))
            self._spans[entry] = self._span(entry, info, rec)

    def _bad(self, what) -> ConfigError:
        return ConfigError(f"random_from: {self.path}: {what}")

    def _record(self, entry, text) -> DrawRecord:
        if not _draw_entry(entry):
            raise self._bad(f"bad entry name {entry!r}")
        try:
            row = json.loads(text) if isinstance(text, str) else None
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict) or row.get("kind") not in KINDS:
            raise self._bad(f"{entry}: its __metadata__ must be a JSON object with kind {' or '.join(KINDS)}")
        shape = row.get("shape")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise self._bad(f"{entry}: shape must be a list of ints >= 0, got {shape!r}")
        try:
            torch_dtype(row.get("dtype"))
        except ValueError as exc:
            raise self._bad(f"{entry}: {exc}") from None
        p = row.get("p")
        if row["kind"] == MASK and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1):
            raise self._bad(f"{entry}: a mask needs p in (0, 1), got {p!r}")
        return DrawRecord(row["kind"], tuple(shape), row["dtype"], None if p is None else float(p))

    def _span(self, entry, info, rec) -> Tuple[int, int]:
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not isinstance(info, dict) or info.get("dtype") != "U8" or not isinstance(offsets, list) \
                or len(offsets) != 2 or not all(type(o) is int for o in offsets):
            raise self._bad(f"{entry}: expected a U8 tensor with data_offsets [begin, end], "
                            f"got {type(info).__name__} {str(info)[:80]}")
        begin, end = offsets
        if not 0 <= begin <= end <= self._data.size:
            raise self._bad(f"{entry}: bytes {begin}-{end} are outside the data ({self._data.size} bytes)")
        if end - begin != rec.expected_nbytes():
            raise self._bad(f"{entry}: {list(rec.shape)} {rec.dtype} ({rec.kind}) is {rec.expected_nbytes()} "
                            f"bytes, the file holds {end - begin}")
        return begin, end

    def raw(self, entry: str) -> np.ndarray:
        begin, end = self._spans[entry]
        return self._data[begin:end]

    def mask(self, entry: str) -> torch.Tensor:
        """A mask draw as a bool CPU tensor of its shape."""
        return unpack_mask(self.raw(entry), self.records[entry].shape)

    def values(self, entry: str) -> torch.Tensor:
        """A values draw as a CPU tensor of its shape and dtype."""
        return values_tensor(self.raw(entry), self.records[entry])
