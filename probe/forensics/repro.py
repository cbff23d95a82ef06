"""Single-API repro scripts: one dumped call, rerun alone on any machine with torch.

    generate("dump_path", "Functional.linear.3.forward", device="cuda", output="r.py")
    probe repro dump_path --api Functional.linear.3.backward --device npu -o r.py

writes ``r.py`` and ``r.pt`` next to it. The script imports only torch (and torch_npu
for ``--device npu``), loads the call's inputs from ``r.pt`` as CPU tensors
(``torch.load(map_location="cpu", weights_only=True)``: nothing is unpickled and
device-format tensors cannot sneak in), moves them to the device, runs the API forward
(and, for a backward entry, backward with the dumped gradients), and prints the result
against the dumped output and against a float64 CPU run, with the compare metrics
(cosine, max abs/rel error, one/five-thousandths ratios, Euclidean distance).

Works from probe's dumps (.npy), msprobe's (.pt) and crash dumps. From a statistics-only
dump there are no values: the script draws inputs with the recorded shape, dtype and
[min, max] range, and says so in its header and output.

The inputs are bundled next to the script rather than read from the dump, so the pair
of files can be copied to another machine as they are.
"""
import ast
import math
import os
import re

import numpy as np
import torch

from probe.compare.dump_tree import find_dumps
from probe.compare.reader import read_dump
from probe.compare.tensors import load as _load_data
from probe.compare.tensors import resolve as _resolve_data
from probe.errors import ConfigError
from probe.vocabulary import BACKWARD, FORWARD, MAX, MEAN, MIN, parse_entry_name
from probe.written_whole import replaced_when_written

_PREFIX_EXPR = {
    "Functional": "torch.nn.functional.{}",
    "Torch": "torch.{}",
    "Tensor": "torch.Tensor.{}",
    "VF": "torch._VF.{}",
    "NPU": "torch_npu.{}",
    "Aten": "torch.ops.aten.{}",
}
DEVICES = ("cpu", "cuda", "npu")
# The script's code holds an entry's API as a Python expression: only identifiers between
# dots go there; everything else from a dump goes through repr (``_lit``) or ``_show``.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z").match


def parse_entry(name):
    """'Functional.linear.3.backward' -> ('Functional.linear', 'Functional.linear.3', 'backward')."""
    n = parse_entry_name(name.strip())
    if n is not None and n.is_module:
        raise ConfigError(f"{name!r} is a module's entry; repro reruns one API call (e.g. Functional.linear.0.forward)")
    if n is None or n.io or n.index is None or n.direction not in ("", FORWARD, BACKWARD):
        raise ConfigError(f"bad API entry name {name!r}; expected e.g. Functional.linear.0.forward")
    return n.qualified, n.base, n.direction or FORWARD


def api_expr(api):
    """Python expression of the callable an entry names, for the script."""
    prefix, _, rest = api.partition(".")
    if prefix == "Distributed":
        raise ConfigError(f"{api}: a distributed API needs its process group; a one-process repro cannot rerun it")
    if prefix == "Custom":
        ns, _, op = rest.partition(".")
        if not (_IDENT(ns) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", op)):
            raise ConfigError(f"{api!r}: a custom op is named Custom.namespace.op[.overload] "
                              "(letters, digits, underscores)")
        return f"torch.ops.{ns}.{op}"
    fmt = _PREFIX_EXPR.get(prefix)
    if fmt is None:
        raise ConfigError(f"{api!r}: unknown API prefix {prefix!r} (known: {', '.join(_PREFIX_EXPR)}, Custom)")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", rest):
        raise ConfigError(f"{api!r}: not an API name (letters, digits and underscores between dots)")
    return fmt.format(rest)


def find_entry(dump_dir, entry_name):
    """(dump.json path, forward entry or None, backward entry or None) for an entry name."""
    _, base, _ = parse_entry(entry_name)
    fwd_name, bwd_name = base + ".forward", base + ".backward"
    dumps = find_dumps(dump_dir)
    for key in sorted(dumps):
        path = dumps[key]
        fwd = bwd = None
        for name, entry in read_dump(path):
            if name == fwd_name:
                fwd = entry
            elif name == bwd_name:
                bwd = entry
            if fwd is not None and bwd is not None:
                break
        if fwd is not None or bwd is not None:
            return path, fwd, bwd
    raise ConfigError(f"{base} is not in any dump.json under {dump_dir}")


def _torch_dtype(name):
    dt = getattr(torch, str(name).replace("torch.", ""), None)
    return dt if isinstance(dt, torch.dtype) else None


def load_tensor(data_dir, desc):
    """The dumped tensor of ``desc`` as a CPU tensor with its recorded dtype, or None.

    Read by ``probe.compare.tensors.load`` (no pickle, a regular file inside ``data_dir``,
    .pt only on torch >= 2.6); a data_name that would leave ``data_dir`` is refused.
    """
    name = desc.get("data_name")
    if not name:
        return None
    path = _resolve_data(data_dir, name)
    if not os.path.lexists(path):
        return None
    t = torch.from_numpy(np.array(_load_data(path)))      # a FIFO, a pickle, torch < 2.6's .pt: DumpError
    t = t.detach()
    dtype = _torch_dtype(desc.get("dtype"))
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)        # probe stores bf16 as float32 .npy: exact both ways
    return t.cpu()


# ---- reading an entry into a script plan ----------------------------------------------
class _Plan:
    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.tensors = {}      # key -> meta dict for the script
        self.data = {}         # key -> CPU tensor for the bundle
        self.notes = []
        self.slots = {}        # input key -> argument slot (probe's backward order)
        self.n_slots = 0

    def tensor(self, key, desc, source):
        meta = {"dtype": desc.get("dtype"), "shape": desc.get("shape"),
                "requires_grad": bool(desc.get("requires_grad")), "source": source}
        if desc.get("stride") is not None:
            meta["stride"] = desc["stride"]
        t = None
        try:
            t = load_tensor(self.data_dir, desc)
        except ValueError as exc:
            self.notes.append(f"{_show(key)}: {_show(str(exc))}; synthesised instead")
        if t is not None:
            if meta["shape"] is not None and list(t.shape) != list(meta["shape"]):
                self.notes.append(f"{_show(key)}: file shape {list(t.shape)} differs from dump.json's "
                                  f"{_short(meta['shape'])}")
                meta["shape"] = list(t.shape)
            self.data[key] = t
            meta["synthetic"] = False
        else:
            meta["synthetic"] = True
            meta["range"] = [desc.get(MIN), desc.get(MAX), desc.get(MEAN)]
        self.tensors[key] = meta

    def arg(self, desc, key, device_var="D"):
        """Python source rebuilding one dumped argument."""
        if desc is None:
            return "None"
        if isinstance(desc, list):
            return "[" + ", ".join(self.arg(d, f"{key}.{i}") for i, d in enumerate(desc)) + "]"
        if not isinstance(desc, dict):
            return _lit(desc)
        kind = desc.get("type")
        if kind is None:
            return "{" + ", ".join(f"{k!r}: {self.arg(v, f'{key}.{k}')}" for k, v in desc.items()) + "}"
        if kind == "torch.Tensor":
            self.tensor(key, desc, "input")
            return f"T({key!r})"
        value = desc.get("value")
        if kind in ("int", "float", "bool", "str"):
            return _lit(value)
        if kind == "slice" and isinstance(value, list) and len(value) == 3:
            return "slice(" + ", ".join(_lit(v) for v in value) + ")"
        if kind == "torch.Size":
            return f"torch.Size({_lit(value)})"
        if kind == "torch.dtype" and _torch_dtype(value) is not None and _IDENT(str(value).replace("torch.", "")):
            return "torch." + str(value).replace("torch.", "")
        if kind == "torch.device":
            return "'cpu'" if str(value).startswith("cpu") else device_var
        if kind == "torch.memory_format":
            fmt = desc.get("format") or str(value)
            fmt = str(fmt).replace("torch.", "")
            if _IDENT(fmt) and isinstance(getattr(torch, fmt, None), torch.memory_format):
                return f"torch.{fmt}"
        if kind == "ellipsis":
            return "..."
        self.notes.append(f"argument {_show(key)} ({_short(kind)}: {_short(value)}) cannot be rebuilt from "
                          "the dump; None is passed: edit the script")
        return "None"


def _flat_descs(descs, prefix, out):
    """Dumped outputs/grads flattened as the script flattens results: [(key, desc or None)]."""
    for i, d in enumerate(descs or []):
        key = f"{prefix}.{i}"
        if isinstance(d, list):
            _flat_descs(d, key, out)
        else:
            out.append((key, d if isinstance(d, dict) and d.get("type") == "torch.Tensor" else None))
    return out


def _show(text) -> str:
    """A text from the dump as the script's header shows it: as it is where it is plain
    (printable, no quote or backslash), else its repr; never more than one line."""
    text = str(text)
    if text.isprintable() and not any(c in text for c in "\"'\\"):
        return text
    return repr(text)


def _short(value, width: int = 60) -> str:
    """A value of the dump for a note: a plain text as it is, anything else as its repr
    (``_show``), cut to ``width`` characters."""
    text = _show(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted Python literal that reads back as exactly ``text``
    (checked): backslashes, quotes that could close it and unprintable characters (lone
    surrogates among them) escaped, line breaks kept so that the header stays readable.
    Whatever a dump's names and values hold, they stay inside the docstring."""
    out = []
    for k, c in enumerate(text):
        if c == "\\":
            out.append("\\\\")
        elif c == '"':
            out.append('\\"' if text[k + 1:k + 2] in ('"', "") else c)
        elif c == "\n" or c.isprintable():
            out.append(c)
        else:
            code = ord(c)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    literal = '"""' + "".join(out) + '"""'
    if ast.literal_eval(literal) != text:      # cannot happen: escaping above is complete
        raise AssertionError("docstring escaping failed")
    return literal


def _lit(v):
    """Python literal for JSON-ish values; NaN/Inf written so the script parses."""
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        return repr(v)
    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_lit(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_lit(str(k))}: {_lit(x)}" for k, x in v.items()) + "}"
    return repr(str(v))


def _slots(fwd):
    """Argument slot of each tensor input, as probe orders backward grads (collector's layout)."""
    slots, n = {}, 0
    for i, a in enumerate(fwd.get("input_args") or []):
        if isinstance(a, list):
            for j, _ in enumerate(a):
                slots[f"input.{i}.{j}"] = n
                n += 1
        else:
            slots[f"input.{i}"] = n
            n += 1
    for k, v in (fwd.get("input_kwargs") or {}).items():
        if isinstance(v, dict) and v.get("type") == "torch.Tensor":
            slots[f"kw.{k}"] = n
            n += 1
    return slots, n


def generate(dump_dir, api, device="cpu", output=None):
    """Write a standalone repro script for entry ``api`` of the dump under ``dump_dir``.

    ``api``: an entry name (``Functional.linear.0.forward`` / ``.backward``; without the
    suffix, forward). ``output``: the script path (default ``./repro_{entry}.py``); the
    inputs go to the same path with ``.pt``. Returns the script path.
    """
    if not re.fullmatch(rf"({'|'.join(DEVICES)})(:\d+)?", device):   # npu:1, as --device takes
        raise ConfigError(f"device must be one of {', '.join(DEVICES)} (:N for one of several), got {device!r}")
    api_name, base, kind = parse_entry(api)
    func_expr = api_expr(api_name)
    dump_json, fwd, bwd = find_entry(dump_dir, api)
    entry = f"{base}.{kind}"
    if fwd is None:
        raise ConfigError(f"{base}.forward is not in {dump_json}: its inputs are needed to rerun the call "
                         "(dump with data_mode forward or all)")
    if kind == "backward" and bwd is None:
        raise ConfigError(f"{base}.backward is not in {dump_json}")
    plan = _Plan(os.path.join(os.path.dirname(os.path.abspath(dump_json)), "dump_tensor_data"))
    args_src = [plan.arg(a, f"input.{i}") for i, a in enumerate(fwd.get("input_args") or [])]
    kwargs_src = [f"{k!r}: {plan.arg(v, f'kw.{k}')}" for k, v in (fwd.get("input_kwargs") or {}).items()]
    if not fwd.get("input_args") and not fwd.get("input_kwargs") and not plan.tensors:
        plan.notes.append("the dump records no inputs for this call (data_mode output?)")
    if api_name.endswith(("__getitem__", "__setitem__")) and len(args_src) > 1 and args_src[1].startswith("["):
        args_src[1] = "tuple(" + args_src[1] + ")"     # JSON turned the index tuple into a list
    outputs = _flat_descs(fwd.get("output"), "output", [])
    for key, desc in outputs:
        if desc is not None:
            plan.tensor(key, desc, "dumped output")
    grad_out, grad_in = [], []
    if kind == "backward":
        grad_out = _flat_descs(bwd.get("input"), "grad_output", [])
        grad_in = _flat_descs(bwd.get("output"), "grad_input", [])
        for key, desc in grad_out:
            if desc is not None:
                plan.tensor(key, desc, "dumped grad of the output")
        for key, desc in grad_in:
            if desc is not None:
                plan.tensor(key, desc, "dumped grad of the input")
        plan.slots, plan.n_slots = _slots(fwd)
    synthetic = sorted(k for k, m in plan.tensors.items() if m["synthetic"] and m["source"] == "input"
                       or m["synthetic"] and m["source"].startswith("dumped grad of the output"))
    if output is None:
        output = os.path.join(os.getcwd(), f"repro_{entry}.py")
    output = os.path.abspath(output)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    bundle = os.path.splitext(output)[0] + ".pt"
    with replaced_when_written(bundle) as tmp:
        torch.save({k: v.contiguous() if v.layout == torch.strided else v for k, v in plan.data.items()}, tmp)
    inplace = _is_inplace(api_name)
    doc = _HEADER.format(
        entry=_show(entry), api=_show(api_name), source=_show(os.path.abspath(dump_json)), device=device,
        header_inputs=_header_inputs(plan, synthetic),
        notes="".join(f"\n  - {n}" for n in plan.notes) or " none",
        what=("runs forward, then backward with the dumped gradients of its outputs,"
              if kind == "backward" else "runs it forward,"))
    text = _SCRIPT.format(
        doc=docstring_literal(doc), entry=entry, device=device,
        npu_import=("import torch_npu  # noqa: F401  (target device: npu)\n"
                    if device.startswith("npu") or api_name.startswith("NPU.") else ""),
        func=func_expr, bundle=os.path.basename(bundle),
        tensors=_lit_block(plan.tensors), synthetic=_lit(synthetic),
        args=",\n        ".join(args_src), kwargs=", ".join(kwargs_src),
        outputs=_lit([k if d is not None else None for k, d in outputs]),
        grad_outputs=_lit([k if d is not None else None for k, d in grad_out]),
        grad_inputs=_lit([k if d is not None else None for k, d in grad_in]),
        slots=_lit(plan.slots), backward=kind == "backward", inplace=inplace,
        metrics=SCRIPT_METRICS)
    compile(text, output, "exec")          # a script that does not parse is never written
    with replaced_when_written(output) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return output


def _is_inplace(api):
    name = api.rsplit(".", 1)[-1]
    if name.startswith("__i") and name.endswith("__"):
        return True
    return name.endswith("_") and not name.endswith("__")


def _header_inputs(plan, synthetic):
    inputs = [k for k, m in plan.tensors.items() if m["source"] == "input"]
    if not synthetic:
        return ("Inputs: the dumped values (bundled in the .pt file next to this script)."
                if inputs else "Inputs: no tensor inputs.")
    real = [_show(k) for k in inputs if k not in synthetic]
    return ("SYNTHETIC INPUTS: the dump holds statistics only for " + ", ".join(map(_show, synthetic)) + ".\n"
            "They are drawn at random with the recorded shape, dtype and [min, max] range (seed 0);\n"
            "the result cannot match the dumped values: compare its statistics, and the float64 run."
            + (f"\nDumped values are used for: {', '.join(real)}." if real else ""))


def _lit_block(tensors):
    lines = ["{"]
    for k, m in tensors.items():
        lines.append(f"    {_lit(k)}: {_lit(m)},")
    lines.append("}")
    return "\n".join(lines)


# The metrics of probe.compare.metrics.tensor_metrics, in torch only (the script must not
# need probe or numpy). Kept as source so tests can check it against the original.
SCRIPT_METRICS = '''
def metrics(actual, expected):
    """Compare metrics of probe (and msprobe): all in float64, non-finite counted apart."""
    a = actual.detach().to("cpu")
    b = expected.detach().to("cpu")
    if a.is_complex() or b.is_complex():
        a, b = torch.view_as_real(a.to(torch.complex128)), torch.view_as_real(b.to(torch.complex128))
    a = a.to(torch.float64).reshape(-1)
    b = b.to(torch.float64).reshape(-1)
    m = {"cosine": float("nan"), "max_abs": float("nan"), "max_rel": float("nan"),
         "one_thousandth": float("nan"), "five_thousandths": float("nan"),
         "euc_dist": float("nan"), "numel": a.numel(), "nonfinite_same": 0,
         "nonfinite_mismatch": 0, "notes": []}
    if a.numel() == 0:
        m["notes"].append("empty tensor")
        return m
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    finite = fa & fb
    if not bool(finite.all()):
        nonfinite = ~finite
        same = nonfinite & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
        m["nonfinite_same"] = int(same.sum())
        m["nonfinite_mismatch"] = int(nonfinite.sum()) - m["nonfinite_same"]
        a, b = a[finite], b[finite]
    if a.numel() == 0:
        m["notes"].append("no finite elements")
        return m
    ad = (a - b).abs()
    m["max_abs"] = float(ad.max())
    m["euc_dist"] = math.sqrt(float(torch.dot(ad, ad)))
    na, nb = float(torch.dot(a, a)), float(torch.dot(b, b))
    if m["numel"] < 2:
        m["notes"].append("0-d or 1-element tensor: cosine not meaningful")
    elif na == 0.0 or nb == 0.0:
        m["notes"].append("cosine undefined: all zeros")
    else:
        m["cosine"] = float(torch.dot(a, b)) / math.sqrt(na) / math.sqrt(nb)
    abs_b = b.abs()
    rel = ad / abs_b
    zero_b = abs_b == 0
    if bool(zero_b.any()):
        rel[zero_b] = torch.where(ad[zero_b] == 0, 0.0, float("inf")).to(rel.dtype)
    m["max_rel"] = float(rel.max())
    m["one_thousandth"] = int((rel <= 0.001).sum()) / rel.numel()
    m["five_thousandths"] = int((rel <= 0.005).sum()) / rel.numel()
    return m
'''

# The script's docstring, as text: it goes into the script through docstring_literal,
# which escapes whatever the dump's names, values and paths hold.
_HEADER = """Repro of {entry}, written by probe from
{source}

Calls {api} alone on --device (default {device}) with the inputs of that call:
{what}
then prints the result against the dumped values and against a float64 run on the CPU,
with probe's compare metrics. Needs only torch (torch_npu for npu).

{header_inputs}
Notes:{notes}

Run:  python3 THIS_FILE [--device cpu|cuda|npu]
"""

_SCRIPT = '''#!/usr/bin/env python3
{doc}
import argparse
import math
import os
import sys

import torch
{npu_import}
ENTRY = {entry!r}
DEFAULT_DEVICE = {device!r}
BACKWARD = {backward!r}
INPLACE = {inplace!r}
DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), {bundle!r})
# key -> what dump.json recorded; "synthetic" ones have no saved values
TENSORS = {tensors}
SYNTHETIC = {synthetic}
OUTPUTS = {outputs}            # dumped outputs, flattened, None where not a tensor
GRAD_OUTPUTS = {grad_outputs}       # dumped grads w.r.t. the outputs (backward input)
GRAD_INPUTS = {grad_inputs}        # dumped grads w.r.t. the inputs (backward output)
SLOTS = {slots}              # input key -> argument slot of probe's grad order


def api():
    return {func}


def arguments(T, D):
    """The call's arguments as dumped; T(key) builds a tensor, D is the device."""
    args = [
        {args}
    ]
    kwargs = {{{kwargs}}}
    return args, kwargs

{metrics}

def load_data():
    if not os.path.isfile(DATA_FILE):
        sys.exit(f"missing {{DATA_FILE}}: copy it along with this script")
    data = torch.load(DATA_FILE, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        sys.exit(f"{{DATA_FILE}} does not hold a dict of tensors")
    assert all(v.device.type == "cpu" for v in data.values()), "bundled tensors must load on the CPU"
    return data


def dtype_of(name):
    return getattr(torch, name.replace("torch.", ""))


def synthesize(meta, gen):
    """Random values with the recorded shape, dtype and [min, max] range."""
    shape, dtype = meta["shape"], dtype_of(meta["dtype"])
    mn, mx, mean = (meta.get("range") or [None, None, None])
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    fin = lambda v: num(v) and math.isfinite(v)
    if dtype == torch.bool:
        p = mean if fin(mean) and 0 <= mean <= 1 else 0.5
        return torch.rand(shape, generator=gen) < p
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if not dtype.is_floating_point:
        lo = int(mn) if fin(mn) else 0
        hi = int(mx) if fin(mx) else max(lo, 9)
        lo, hi = min(lo, hi), max(lo, hi)
        t = torch.randint(lo, hi + 1, shape, generator=gen)
        if t.numel() >= 2:
            t.view(-1)[:2] = torch.tensor([hi, lo])   # the recorded extremes
        return t.to(dtype)
    lo, hi = (mn, mx) if fin(mn) and fin(mx) else (-1.0, 1.0)
    t = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    flat = t.view(-1)
    if flat.numel() >= 1 and num(mx):
        flat[0] = mx               # the recorded extremes, NaN/Inf included
    if flat.numel() >= 2 and num(mn):
        flat[1] = mn
    return t.to(dtype)


def make(data, key, device, ref):
    t = data[key]
    if ref:
        device = "cpu"
        if t.is_floating_point():
            t = t.to(torch.float64)
        elif t.is_complex():
            t = t.to(torch.complex128)
    stride = TENSORS[key].get("stride")
    if stride and list(stride) != list(t.stride()) and len(stride) == t.dim():
        try:                       # the dumped layout (a transposed or sliced input)
            u = torch.empty_strided(tuple(t.shape), tuple(stride), dtype=t.dtype, device=device)
            u.copy_(t)
            return u
        except RuntimeError:
            pass
    return t.to(device, copy=True)


def flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [x for o in out for x in flatten(o)]
    return [None]


def run(data, device, ref):
    """Forward (and backward); returns (flattened outputs, [(input key, grad)])."""
    leaves = []

    def T(key):
        t = make(data, key, device, ref)
        if BACKWARD and TENSORS[key]["requires_grad"] and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
            leaves.append((key, t))
            if INPLACE:
                t = t.clone()      # an in-place API may not write into a leaf
        return t

    args, kwargs = arguments(T, device if not ref else "cpu")
    out = api()(*args, **kwargs)
    outs = flatten(out)
    if not BACKWARD:
        return outs, []
    pairs = []
    for o, key in zip(outs, GRAD_OUTPUTS):
        if key is not None and isinstance(o, torch.Tensor) and o.requires_grad:
            g = make(data, key, device, ref)
            pairs.append((o, g.to(o.dtype)))
    if not pairs or not leaves:
        print("nothing to differentiate: no output with a dumped gradient, or no input requiring grad")
        return outs, []
    grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in leaves],
                                [g for _, g in pairs], allow_unused=True)
    return outs, [(k, g) for (k, _), g in zip(leaves, grads)]


def fmt(v):
    return "nan" if v != v else f"{{v:.6g}}"


def show(label, actual, expected):
    if actual.shape != expected.shape:
        print(f"  {{label:<24}} shape {{list(actual.shape)}} vs {{list(expected.shape)}}: not comparable")
        return
    m = metrics(actual, expected)
    extra = ""
    if m["nonfinite_same"] or m["nonfinite_mismatch"]:
        extra = f"  nonfinite same {{m['nonfinite_same']}} mismatch {{m['nonfinite_mismatch']}}"
    if m["notes"]:
        extra += "  (" + "; ".join(m["notes"]) + ")"
    print(f"  {{label:<24}} cosine {{fmt(m['cosine'])}}  max_abs {{fmt(m['max_abs'])}}  "
          f"max_rel {{fmt(m['max_rel'])}}  one_thousandth {{fmt(m['one_thousandth'])}}  "
          f"five_thousandths {{fmt(m['five_thousandths'])}}  euc_dist {{fmt(m['euc_dist'])}}{{extra}}")


def stats(t):
    w = t.detach().to("cpu", torch.float64) if not t.is_complex() else t.detach().abs().to("cpu", torch.float64)
    if w.numel() == 0:
        return [None] * 4
    return [float(w.max()), float(w.min()), float(w.mean()), float(torch.linalg.vector_norm(w))]


def show_stats(label, actual, key):
    rec = TENSORS[key].get("range") or [None, None, None]
    got = stats(actual)
    f = lambda v: "-" if v is None else fmt(v)
    print(f"  {{label:<24}} result max/min/mean {{f(got[0])}} / {{f(got[1])}} / {{f(got[2])}}   "
          f"dumped {{f(rec[1])}} / {{f(rec[0])}} / {{f(rec[2])}}  (statistics only: no values dumped)")


def describe(t):
    layout = "" if t.is_contiguous() else f" stride {{list(t.stride())}}"
    return f"{{str(t.dtype).replace('torch.', '')}}{{list(t.shape)}}{{layout}} on {{t.device}}"


def pair_grads(grads, data):
    """Match computed input grads with dumped ones: argument slot, else shape (msprobe order)."""
    used, pairs = set(), []
    for key, g in grads:
        if g is None:
            continue
        order = ([SLOTS[key]] if key in SLOTS and len(GRAD_INPUTS) > SLOTS[key] else []) + list(range(len(GRAD_INPUTS)))
        hit = None
        for transposed in (False, True):
            for j in order:
                dk = GRAD_INPUTS[j]
                if j in used or dk is None:
                    continue
                shape = list(TENSORS[dk]["shape"])
                want = list(g.shape) if not transposed else list(g.shape)[::-1]
                if shape == want and (not transposed or g.dim() == 2):
                    hit = (j, dk, transposed)
                    break
            if hit:
                break
        if hit:
            used.add(hit[0])
            pairs.append((key, g, hit[1], hit[2]))
        else:
            pairs.append((key, g, None, False))
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="cpu, cuda, npu (or cuda:1, npu:0)")
    device = parser.parse_args().device
    if device.startswith("npu") and "torch_npu" not in sys.modules:
        import torch_npu  # noqa: F401
    data = load_data()
    gen = torch.Generator().manual_seed(0)
    for key in SYNTHETIC:
        data[key] = synthesize(TENSORS[key], gen)
    print(f"== {{ENTRY}} on {{device}}" + ("   [SYNTHETIC inputs: " + ", ".join(SYNTHETIC) + "]" if SYNTHETIC else ""))
    for key, meta in TENSORS.items():
        if meta["source"] == "input":
            src = "synthetic" if key in SYNTHETIC else "dumped"
            print(f"  input {{key:<18}} {{describe(make(data, key, device, False))}}  ({{src}})")
    try:
        outs, grads = run(data, device, ref=False)
    except Exception as exc:
        print(f"the API raised {{type(exc).__name__}}: {{exc}}")
        raise
    try:
        ref_outs, ref_grads = run(data, "cpu", ref=True)
    except Exception as exc:
        print(f"float64 CPU reference failed: {{type(exc).__name__}}: {{exc}}")
        ref_outs, ref_grads = None, None
    if not BACKWARD:
        if not any(k is not None for k in OUTPUTS):
            print("  (the dump holds no output for this call: nothing to compare with)")
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            print(f"output.{{i}} {{describe(o)}}")
            key = OUTPUTS[i] if i < len(OUTPUTS) else None
            if key is not None and key in data:
                show("vs dump", o, data[key])
            elif key is not None:
                show_stats("vs dump", o, key)
            if ref_outs is not None and i < len(ref_outs) and isinstance(ref_outs[i], torch.Tensor):
                show("vs float64 cpu", o, ref_outs[i])
        return 0
    ref_by_key = dict(ref_grads or [])
    for key, g, dk, transposed in pair_grads(grads, data):
        print(f"grad of {{key}} {{describe(g)}}")
        if dk is not None:
            label = "vs dump " + dk + (" (transposed)" if transposed else "")
            if dk in data:
                show(label, g.t() if transposed else g, data[dk])
            else:
                show_stats(label, g.t() if transposed else g, dk)
        else:
            print("  no dumped gradient of matching shape")
        r = ref_by_key.get(key)
        if r is not None:
            show("vs float64 cpu", g, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
