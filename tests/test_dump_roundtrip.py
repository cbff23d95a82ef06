"""Round trip: every forward entry of a tensor dump, rebuilt the way run-ut rebuilds it,
reproduces the dumped output bitwise (CPU, same dtype). Driven by torch's own OpInfo
samples for the registered APIs, in function, method, keyword and mixed spellings, by
the Python-level Tensor methods whose arguments the call-site reading recovers, and by
HF GPT-2 and Llama built from tiny configs."""
import inspect
import os
import subprocess
import sys
import warnings
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from conftest import load_dump  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402
from probe.compare.reader import DumpMeta, read_dump  # noqa: E402
from probe.hook_module.registry import load_registry  # noqa: E402
from probe.precheck.entries import RANDOM, parse_name, resolve_api  # noqa: E402
from probe.precheck.inputs import Loader, Unrebuildable, flat_outputs, is_tensor_desc  # noqa: E402


def _dump(path, fn):
    dbg = PrecisionDebugger(task="tensor", dump_path=str(path), level="L1")
    dbg.start()
    try:
        fn()
    finally:
        dbg.stop()
    dbg.step()
    dbg.close()
    return os.path.join(str(path), "step0", "rank")


def _same(a, b):
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(torch.equal(torch.nan_to_num(a, 1.5, 2.5, -2.5), torch.nan_to_num(b, 1.5, 2.5, -2.5))
                    and torch.equal(a.isnan(), b.isnan()))
    return bool(torch.equal(a, b))


# BLAS picks its kernel by the operands' memory layout (``q @ k.transpose(-1, -2)``), and
# a dump records shapes, not strides: the replay of a transposed operand, rebuilt
# contiguous, may round differently in the last bit.
_LAYOUT_DEPENDENT = {"matmul", "bmm", "mm", "baddbmm", "addmm", "linear", "einsum", "__matmul__"}


def replay_all(rank_dir):
    """(entries checked bitwise, Counter of mismatches, Counter of skip reasons)."""
    path = os.path.join(rank_dir, "dump.json")
    loader = Loader(os.path.join(rank_dir, "dump_tensor_data"))
    checked, bad, skipped = [], Counter(), Counter()
    for name, entry in read_dump(path, DumpMeta(path)):
        api = parse_name(name)
        if api is None or api.direction != "forward":
            continue
        if api.random or api.leaf in ("dropout", "empty_like", "new_empty"):
            skipped["random or uninitialised"] += 1
            continue
        try:
            func = resolve_api(api)
            args = loader.build(entry.get("input_args", []), name)
            kwargs = loader.build(entry.get("input_kwargs", {}), name)
            descs = flat_outputs(entry.get("output") or [])
            dumped = [loader.tensor(d) if is_tensor_desc(d) else None for d in descs]
        except (LookupError, Unrebuildable) as exc:
            skipped[f"{type(exc).__name__}: {str(exc)[:60]}"] += 1
            continue
        if api.inplace:
            args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.no_grad():
            try:
                out = func(*args, **kwargs)
            except Exception as exc:   # noqa: BLE001 - the rebuilt call must run
                bad[f"{name}: {type(exc).__name__}: {str(exc)[:100]}"] += 1
                continue
        outs = flat_outputs(out)
        ok = len(outs) == len(descs) and all(
            d is None or (_same(o, d) if isinstance(o, torch.Tensor) else o == descs[i].get("value"))
            for i, (o, d) in enumerate(zip(outs, dumped)))
        if not ok and api.leaf in _LAYOUT_DEPENDENT and all(
                d is None or torch.allclose(o, d, rtol=1e-5, atol=1e-6) for o, d in zip(outs, dumped)):
            skipped["matrix product of a non-contiguous input (strides are not dumped)"] += 1
            continue
        if not ok:
            bad[name] += 1
        checked.append(name)
    return checked, bad, skipped


# ---- the Python-level methods the issue names, every spelling ------------------------------
def test_python_level_methods_recorded_as_called(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8)

    def calls():
        x.split(3, dim=2)
        x.split(2, 1)
        x.split(split_size=4, dim=0)
        torch.Tensor.split(x, 3, dim=2)
        x.norm(2, dim=1)
        x.norm()
        x.norm(p=1, dim=(1, 2), keepdim=True)
        x.unflatten(1, (2, 3))
        torch.split(x, 2, 1)
        torch.norm(x, 2, 1)
        F.softmax(x, -1)
        F.layer_norm(x, (8,), None, None, 1e-3)
        (x + 1).split([2, 2], 0)
        x.split(*(3,), **{"dim": 2})
    rank = _dump(tmp_path, calls)
    data = load_dump(str(tmp_path))
    args = {k: (len(v["input_args"]), sorted(v["input_kwargs"])) for k, v in data.items()}
    assert args["Tensor.split.0.forward"] == (2, ["dim"])           # x.split(3, dim=2)
    assert args["Tensor.split.1.forward"] == (3, [])                # x.split(2, 1)
    assert args["Tensor.split.2.forward"] == (1, ["dim", "split_size"])
    assert args["Tensor.split.3.forward"] == (2, ["dim"])           # Tensor.split(x, 3, dim=2)
    assert args["Tensor.norm.0.forward"] == (2, ["dim"])            # x.norm(2, dim=1)
    assert args["Tensor.norm.2.forward"][1] == ["dim", "keepdim", "p"]
    assert args["Tensor.unflatten.0.forward"] == (3, [])
    assert args["Torch.split.0.forward"] == (3, [])
    assert data["Tensor.split.1.forward"]["input_args"][1]["value"] == 2
    assert data["Tensor.norm.0.forward"]["input_args"][1]["value"] == 2
    checked, bad, skipped = replay_all(rank)
    assert not bad and not skipped, (bad, skipped)
    assert len(checked) >= 14
    # probe repro's script for the call rebuilds it too
    from probe.forensics.repro import generate
    script = generate(str(tmp_path), "Tensor.split.0.forward", output=str(tmp_path / "repro_split.py"))
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    vs_dump = [line for line in run.stdout.splitlines() if "vs dump" in line]
    assert len(vs_dump) == 3 and all("max_abs 0 " in line for line in vs_dump), run.stdout


# ---- OpInfo samples through registered APIs --------------------------------------------------
def _registered():
    ops = load_registry().ops
    return set(ops.get("torch", [])), set(ops.get("tensor", [])), set(ops.get("functional", []))


def _keywordised(func, args, kwargs):
    """The same call with the trailing positionals written as keywords, where the Python
    signature names them (None where it does not)."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    if not args or any(p.kind in (p.VAR_POSITIONAL,) for p in params[:len(args)]):
        return None
    last = params[len(args) - 1] if len(args) <= len(params) else None
    if last is None or last.kind not in (last.POSITIONAL_OR_KEYWORD, last.KEYWORD_ONLY) or last.name in kwargs:
        return None
    return args[:-1], dict(kwargs, **{last.name: args[-1]})


def _opinfo_calls(limit_ops=120, per_op=2):
    frozen, filters = torch.backends.flags_frozen(), list(warnings.filters)
    common = pytest.importorskip("torch.testing._internal.common_methods_invocations",
                                 reason="torch's OpInfo database needs expecttest")
    # torch's test harness, imported, freezes torch.backends flags and adds warning
    # filters: undone, so later tests (seed_all sets cudnn flags) see the usual torch
    if torch.backends.flags_frozen() and not frozen:
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    warnings.filters[:] = filters
    torch_names, tensor_names, functional = _registered()
    calls = []
    n_ops = 0
    for op in common.op_db:
        if op.variant_test_name or op.name in RANDOM or "empty" in op.name or "rand" in op.name:
            continue
        if op.name.startswith("nn.functional."):
            short, owner, names = op.name[len("nn.functional."):], F, functional
        else:
            short, owner, names = op.name, torch, torch_names
        func = getattr(owner, short, None) if short in names else None
        method = getattr(torch.Tensor, short, None) if short in tensor_names else None
        if func is None and method is None:
            continue
        if not op.supports_dtype(torch.float32, "cpu"):
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:per_op]
        except Exception:   # noqa: BLE001 - a sample generator torch itself cannot run here
            continue
        n_ops += 1
        for k, s in enumerate(samples):
            if not isinstance(s.input, torch.Tensor):
                continue
            args, kwargs = (s.input, *s.args), dict(s.kwargs)
            if func is not None and op.op is func:
                calls.append((op.name, func, args, kwargs))
                kw = _keywordised(func, args, kwargs) if k % 2 == 0 else None
                if kw is not None:
                    calls.append((op.name + " keywords", func, *kw))
            if method is not None and op.method_variant is not None:
                calls.append((op.name + " method", "method:" + short, args, kwargs))
        if n_ops >= limit_ops:
            break
    return calls


@pytest.mark.slow   # every OpInfo sample of torch's op database
def test_opinfo_samples_round_trip(tmp_path):
    calls = _opinfo_calls()
    assert len(calls) >= 150
    ran = []

    def drive():
        for label, func, args, kwargs in calls:
            a = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
            try:
                if isinstance(func, str):
                    getattr(a[0], func[len("method:"):])(*a[1:], **kwargs)
                else:
                    func(*a, **kwargs)
            except Exception:   # noqa: BLE001 - a sample torch rejects (the keyword spelling)
                continue
            ran.append(label)
    rank = _dump(tmp_path, drive)
    checked, bad, skipped = replay_all(rank)
    assert len(ran) >= 150 and len(checked) >= 150, (len(ran), len(checked))
    assert not bad, sorted(bad)[:20]
    # arguments recorded by reference only (a Generator, a Python callable) cannot be rebuilt
    assert sum(skipped.values()) <= max(5, len(checked) // 20), skipped


# ---- real models ---------------------------------------------------------------------------
def _hf_models():
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, n_positions=16, vocab_size=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=16))
    return {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_hf_model_dump_round_trips(tmp_path, which):
    torch.manual_seed(0)
    model = _hf_models()[which]
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 64, (2, 8))

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    rank = _dump(tmp_path, step)
    checked, bad, skipped = replay_all(rank)
    assert len(checked) >= 40
    assert not bad, sorted(bad)[:20]
    assert sum(n for k, n in skipped.items() if not k.startswith("random")) <= 4, skipped


def test_method_owner_spellings(tmp_path):
    """Capitalised tensor names, a class alias, a bound method held in a variable."""
    Tensor = torch.Tensor   # noqa: N806 - a class under its usual name
    Q = torch.randn(2, 6)  # noqa: N806 - attention code names tensors so
    held = Q.split

    def calls():
        Q.split(3, 1)
        Tensor.split(Q, 3, 1)
        held(3, 1)
        (Q * 2).split(3, 1)
    rank = _dump(tmp_path, calls)
    data = load_dump(str(tmp_path))
    for n in range(4):
        args = data[f"Tensor.split.{n}.forward"]["input_args"]
        kwargs = data[f"Tensor.split.{n}.forward"]["input_kwargs"]
        assert args[0]["type"] == "torch.Tensor"
        assert [a.get("value") for a in args[1:]] + [v.get("value") for v in kwargs.values()] == [3, 1], n
    checked, bad, skipped = replay_all(rank)
    assert not bad and not skipped and len(checked) >= 4
