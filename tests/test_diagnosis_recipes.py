"""Diagnosis across two devices under real training recipes.

The NPU side trains on a simulated second device (``second_device.Device``: split-K matrix
products, its own random stream, dropout on where the model has it), the bench on the CPU
in fp32, both with the same recipe (``real_runs.run(recipe=...)``): fp16 autocast with a
GradScaler (the NPU side only computes in fp16), gradient accumulation over two
micro-batches, activation checkpointing (HF's, non-reentrant; with fused GQA attention
against eager on Llama), clip_grad_norm_ with an LR schedule and foreach AdamW, and a
top-2 MoE in bf16 whose near-tie tokens route differently on the two sides.

A clean run must name nothing at any step, in tensor and statistics mode. A fault of the
kind real kernels have (``real_runs.KernelFault``, below the API level: a stale output, a
reduction accumulated in bf16, a softmax without max subtraction computed in fp16, one
wrong element, a 2% scale) in forward, backward or the optimizer, at steps 0-2, must be
named at its step. The expected culprit comes from the faulted aten call, never from
probe's output. Where four statistics cannot tell (a stale output after differing draws),
probe must name the right call or nothing, and say why.
"""
import pytest
import torch
from real_runs import KernelFault, compare_steps, load_data, run
from second_device import Device

STEPS = 3

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]   # conftest: one intra-op thread


def _cpu_fp16_amp() -> str | None:
    """Why this torch cannot run the fp16 recipe on the CPU, or None."""
    try:
        torch.amp.GradScaler("cpu")
        with torch.autocast("cpu", dtype=torch.float16):
            ok = torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.float16
    except (AttributeError, RuntimeError, TypeError) as exc:
        return f"no fp16 CPU autocast / GradScaler('cpu') on torch {torch.__version__}: {exc}"
    return None if ok else f"CPU autocast on torch {torch.__version__} does not compute in fp16"


NO_FP16 = _cpu_fp16_amp()

# name -> the run's arguments; the bench runs the same recipe but "fp16" (fp32, on the CPU)
RECIPES = {
    "fp16_scaler": dict(kind="gpt2", recipe=("fp16", "scaler"), dropout=0.1),
    # on the CPU itself (no second device), no dropout: fp16's rounding is the only difference
    # (its residual add was named at step 1: output extremes 2.7e-3 apart, its inputs' "9e-5")
    "fp16_scaler_plain": dict(kind="gpt2", recipe=("fp16", "scaler"), device=None),
    "fp16_scaler_clip": dict(kind="llama", recipe=("fp16", "scaler", "clip")),
    "accum": dict(kind="gpt2", recipe=("accum",), dropout=0.1),
    "checkpoint": dict(kind="gpt2", recipe=("checkpoint",), dropout=0.1),
    "checkpoint_sdpa": dict(kind="llama", recipe=("checkpoint",), attn="sdpa"),   # fused GQA vs eager
    "clip_schedule_foreach": dict(kind="llama", recipe=("clip", "schedule"), opt="adamw_foreach"),
    "moe_bf16": dict(kind="moe", bf16=True),
}


def _args(name, side):
    a = dict(RECIPES[name])
    kind = a.pop("kind")
    if side == "bench":
        a["recipe"] = tuple(r for r in a.get("recipe", ()) if r != "fp16")
        a.pop("bf16", None)
        a.pop("attn", None)
        a.pop("device", None)
    else:
        a.setdefault("device", Device(split_k=True, seed=7))   # device=None: the CPU itself
    return kind, a


def _needs(name):
    if NO_FP16 and "fp16" in RECIPES[name].get("recipe", ()):
        pytest.skip(NO_FP16)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(recipe name, task, side)`` -> a STEPS-step dump root ("npu" or "bench"), made once."""
    base = tmp_path_factory.mktemp("recipe_runs")
    made = {}

    def get(name, task, side):
        key = (name, task, side)
        if key not in made:
            kind, a = _args(name, side)
            made[key] = run(kind, base / f"{name}_{task}_{side}", task, steps=STEPS, **a)
        return made[key]
    return get


def _top(summary, n=3):
    return summary["verdict"], [(x["npu_name"], x["reason"]) for x in summary["suspects"][:n]]


# ---------------------------------------------------------------- clean runs name nothing

CLEAN = [
    ("fp16_scaler", "tensor"),
    ("fp16_scaler", "statistics"),
    ("fp16_scaler_plain", "statistics"),
    ("fp16_scaler_clip", "tensor"),
    ("accum", "tensor"),
    ("accum", "statistics"),
    ("checkpoint", "tensor"),
    ("checkpoint_sdpa", "statistics"),
    ("clip_schedule_foreach", "tensor"),
    ("clip_schedule_foreach", "statistics"),
    ("moe_bf16", "tensor"),
    ("moe_bf16", "statistics"),
]


@pytest.mark.parametrize("name, task", CLEAN)
def test_clean_recipe_names_nothing_at_any_step(runs, tmp_path, name, task):
    _needs(name)
    npu, bench = runs(name, task, "npu"), runs(name, task, "bench")
    for s in range(STEPS):   # one step at a time: a failing step costs no compare after it
        summary = compare_steps(npu, bench, tmp_path, [s])[0][1]
        assert summary["mode"] == task
        assert summary["first_divergence"]["name"] is None and summary["calls"]["introduces"] == 0, \
            (s, *_top(summary))
        if RECIPES[name].get("dropout"):   # the draws differ and are said to, never blamed
            assert summary["draws"]["differ"] > 0, (s, summary["draws"])


def _where_shapes(root, step):
    data = load_data(root, step)
    return {k: v["output"][0]["shape"] for k, v in data.items() if k.startswith("Torch.where.")}


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_moe_routes_near_ties_differently(runs, task):
    """The MoE cases test what they claim: some tokens go to another expert on the NPU side
    (the tokens per expert, Torch.where's output shapes, differ at some step)."""
    differ = [s for s in range(STEPS) if _where_shapes(runs("moe_bf16", task, "npu"), s)
              != _where_shapes(runs("moe_bf16", task, "bench"), s)]
    assert differ, "no token routed differently: the near-tie MoE cases test nothing"


# ---------------------------------------------------------------- faults named at their step

FAULTS = [
    # recipe, task, (aten op, nth call, step, how, factor[, index])
    ("accum", "tensor", ("addmm.default", 12, 1, "stale", 0)),            # 2nd micro-batch's qkv = layer 0's
    ("accum", "tensor", ("tanh_backward.default", 2, 0, "scale", 1.02)),   # 2nd micro-batch's backward
    ("accum", "tensor", ("addcdiv_.default", 4, 2, "scale", 1.02)),        # optimizer
    ("checkpoint", "tensor", ("_softmax.default", 1, 1, "fp16_softmax", 0)),
    ("checkpoint", "tensor", ("tanh_backward.default", 0, 2, "poke", 0.5)),   # recomputed block's backward
    ("clip_schedule_foreach", "tensor", ("mean.dim", 3, 0, "bf16_acc", 0)),   # RMSNorm's variance
    ("clip_schedule_foreach", "tensor", ("linalg_vector_norm.default", 0, 1, "bf16_acc", 0)),  # clip's norm
    ("clip_schedule_foreach", "tensor", ("_foreach_addcdiv_.ScalarList", 0, 2, "scale", 1.02, 3)),
    ("fp16_scaler_clip", "tensor", ("silu.default", 0, 0, "stale", 0)),     # no earlier output: zeros
    ("fp16_scaler_clip", "tensor", ("silu_backward.default", 1, 2, "scale", 1.02)),
    ("fp16_scaler", "statistics", ("tanh.default", 1, 1, "scale", 1.5)),
    ("clip_schedule_foreach", "statistics", ("mean.dim", 2, 1, "stale", 0)),   # layer 0's variance again
    ("moe_bf16", "tensor", ("silu.default", 2, 1, "poke", 0.5)),           # one wrong element in an expert
]


def _id(v):
    if isinstance(v, tuple):
        return f"{v[0].split('.')[0]}-n{v[1]}-s{v[2]}-{v[3]}{v[4] or ''}"
    return str(v)


@pytest.mark.parametrize("name, task, spec", FAULTS, ids=_id)
def test_fault_in_a_recipe_named_at_its_step(runs, tmp_path, name, task, spec):
    _needs(name)
    fault = KernelFault(*spec)
    kind, a = _args(name, "npu")
    npu = run(kind, tmp_path / "npu", task, steps=fault.step + 1, fault=fault, **a)
    assert fault.applied
    fault.check_mapping(npu)
    expected = fault.expected()
    summary = compare_steps(npu, runs(name, task, "bench"), tmp_path / "out", [fault.step])[0][1]
    assert summary["first_divergence"]["name"] == expected, (expected, *_top(summary))
    assert summary["verdict"].startswith(expected), summary["verdict"]


def test_a_fault_after_differing_draws_in_statistics_mode_names_nothing_wrong(runs, tmp_path):
    """A stale output after differing dropout draws (statistics mode): its Max/Min/Mean/Norm
    differ by 0.047 where its inputs' differ by 0.19 (other masks), beyond what four numbers
    can tell. probe must then name the right call or nothing (never another), and say why;
    tensor mode names it (test_fault_in_a_recipe_named_at_its_step, accum-tensor)."""
    _needs("accum")
    fault = KernelFault("addmm.default", 12, 2, "stale", 0)
    kind, a = _args("accum", "npu")
    npu = run(kind, tmp_path / "npu", "statistics", steps=fault.step + 1, fault=fault, **a)
    assert fault.applied
    summary = compare_steps(npu, runs("accum", "statistics", "bench"), tmp_path / "out", [fault.step])[0][1]
    assert summary["first_divergence"]["name"] in (None, fault.expected()), _top(summary)
    assert any("drew different random numbers" in n and "random_from" in n for n in summary["notes"]), summary["notes"]
