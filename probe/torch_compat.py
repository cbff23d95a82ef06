"""What differs between the torch versions probe supports, in one place.

probe declares ``torch>=2.1`` (torch_npu's oldest maintained line); CI runs the whole
suite on torch 2.1 and 2.13. Everything a newer torch added that probe leans on is looked
up here once, with what stands in for it on an older one; a feature that cannot work
there says so in one log line where it is used (see ``TORCH``'s users).

    from probe.torch_compat import is_compiling, TORCH
    if TORCH < (2, 4): ...
"""
import functools
import inspect
from typing import Optional

import torch
from torch._guards import TracingContext
from torch.nn.modules.module import register_module_forward_hook

TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

# Dynamo folds both to True while it traces (2.1-2.2: torch._utils.is_compiling is in
# its table of constant functions), so a compiled region gets the plain torch call.
is_compiling = getattr(torch.compiler, "is_compiling", None) or torch._utils.is_compiling

# The C base class of torch.Tensor: public as torch._C.TensorBase from torch 2.2 on,
# torch._C._TensorBase before.
TensorBase = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase


def op_name(op) -> Optional[str]:
    """An ``OpOverload``'s name without namespace or overload (``mm`` for aten.mm.default);
    None for what has no schema (a higher-order operator). torch 2.4 added it as
    ``OpOverload._opname``; the schema's name holds it on every torch."""
    schema = getattr(op, "_schema", None)
    return None if schema is None else schema.name.split("::", 1)[-1]


def _cpu_half_aminmax() -> bool:
    try:
        torch.aminmax(torch.zeros(1, dtype=torch.float16))
        return True
    except RuntimeError:   # "aminmax_cpu" not implemented for 'Half'
        return False


def _aminmax_any_cpu_dtype(t):
    if t.dtype is torch.float16 and t.device.type == "cpu":
        return torch.min(t), torch.max(t)
    return torch.aminmax(t)


# torch.aminmax of a float16 tensor on the CPU came after torch 2.1 (2.1 raises); min and
# max give the same two numbers there, in two passes.
aminmax = torch.aminmax if _cpu_half_aminmax() else _aminmax_any_cpu_dtype


@functools.lru_cache(maxsize=None)
def indexing_reaches_function_modes() -> bool:
    """Whether ``t[i]`` and ``t[i] = tensor`` reach a torch function mode (as
    ``Tensor.__getitem__`` / ``__setitem__``). On torch 2.1 neither does (``t[i] = 2.0``
    does; later torch, all): probe then patches both, as it patches the operators no
    instruction tells apart. Found by trying, once."""
    from torch.overrides import TorchFunctionMode
    seen = []

    class _Look(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", None))
            return func(*args, **(kwargs or {}))
    t, v = torch.zeros(2), torch.ones(())
    with torch.no_grad(), _Look():
        t[0]
        t[1] = v
    return seen == ["__getitem__", "__setitem__"]


# Global module forward hooks are given the call's keyword arguments (``with_kwargs``)
# from torch 2.6 on; before, a global hook sees the positional arguments only.
GLOBAL_HOOKS_TAKE_KWARGS = "with_kwargs" in inspect.signature(register_module_forward_hook).parameters
_NO_KWARGS: dict = {}


def register_global_forward_hook(hook):
    """``hook(module, args, kwargs, output)`` after every module's forward, nothing put on
    any module. Before torch 2.6 ``kwargs`` is always empty (see GLOBAL_HOOKS_TAKE_KWARGS)."""
    if GLOBAL_HOOKS_TAKE_KWARGS:
        return register_module_forward_hook(hook, with_kwargs=True)

    def without_kwargs(module, args, output):
        return hook(module, args, _NO_KWARGS, output)
    return register_module_forward_hook(without_kwargs)


_tracing_context = getattr(TracingContext, "try_get", None) or TracingContext.get  # try_get: torch 2.3


def in_compile_trace() -> bool:
    """True while torch.compile traces (dynamo, AOTAutograd) rather than runs: tensors
    seen then are fake. A module hook can be called so only where dynamo keeps the module
    whole in its graph, see ``dynamo_inlines_nn_modules``."""
    return _tracing_context() is not None


def dynamo_inlines_nn_modules() -> bool:
    """Whether dynamo traces into torch.nn's own modules (Linear, LayerNorm, ...) as into
    the user's: their hooks then run when the compiled code runs. torch 2.5 made it the
    default (``inline_inbuilt_nn_modules``, 2.3 added the switch); before, such a module is
    one node of the graph: dynamo runs it with its hooks on fake tensors while it traces,
    and the compiled graph runs it without them. Asked only while compiling (imports dynamo)."""
    import torch._dynamo.config as dynamo_config
    return bool(getattr(dynamo_config, "inline_inbuilt_nn_modules", False))


def restore_optimizer_step_hooks() -> int:
    """Make ``optimizer.step()`` run the step hooks again (``register_step_pre_hook``,
    ``register_optimizer_step_post_hook``) where torch.compile took them away. Before torch
    2.3 (pytorch#115772), a process's first ``torch.compile`` strips from every torch.optim
    class the wrapper that runs them (so that a compiled optimizer step has no graph break
    at it), silently: no step hook of any optimizer runs after that. The wrapper is put back
    as ``Optimizer.__init__`` puts it, on each class that lost it; later compiles do not
    strip again. Returns how many classes got it back (0 on torch >= 2.3)."""
    if TORCH >= (2, 3):
        return 0
    from torch.optim import Optimizer
    hook_code = Optimizer.profile_hook_step(lambda: None).__code__   # the wrapper's own code
    restored = 0
    todo = list(Optimizer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        step = vars(cls).get("step")
        # "hooked" unwrapped: stripped; not "hooked": Optimizer.__init__ will wrap it
        if step is None or not getattr(step, "hooked", False) or getattr(step, "__code__", None) is hook_code:
            continue
        wrapped = Optimizer.profile_hook_step(step)
        wrapped.hooked = True  # type: ignore[attr-defined]
        cls.step = wrapped  # type: ignore[method-assign]
        restored += 1
    return restored


# torch 2.5 (pytorch#133137) made dynamo trace the torch function modes on the stack, probe's
# interceptor included: ``is_compiling()`` folds to True there and the mode steps aside.
# Before, dynamo runs each op of the code it traces for real on fake tensors, with the
# mode on the stack (and torch.nn modules with their hooks): the mode must step aside
# then too (``compiling``). On every torch, a Python frame that starts while compiled code
# runs (the mode's, for each op of a graph before 2.5; on any torch, for a call dynamo
# left to run eagerly, a graph break's or a skipped frame's; probe's handler) is compiled
# as a graph of its own unless dynamo is kept out of it (``run_eagerly``).
DYNAMO_TRACES_FUNCTION_MODES = TORCH >= (2, 5)


def _compiling_or_tracing() -> bool:
    return is_compiling() or _tracing_context() is not None


# What probe's function mode and module hooks ask to stay out of torch.compile's way.
compiling = is_compiling if DYNAMO_TRACES_FUNCTION_MODES else _compiling_or_tracing

# torch.compiler.is_compiling() holds True for a whole compile, code that runs during it
# without being traced included, only since pytorch#184614 (torch 2.13: dynamo's
# ``_compile_session_context``). Before, it is True only in code dynamo traces: its own runs
# of each op on fake tensors (torch 2.6's ``addmm`` decomposition computes ``alpha * mm``,
# through probe's patched ``Tensor.__rmul__``) see False, and the compile's tracing
# context, set then, tells them apart. The mode is off the stack there (dynamo takes it
# off while it compiles); probe's patched attributes are not.
COMPILE_SESSION_FLAG = hasattr(torch.compiler, "_compile_session_context")

# What probe's patched attributes ask to stay out of torch.compile's way.
compiling_for_patches = is_compiling if COMPILE_SESSION_FLAG else _compiling_or_tracing


def run_eagerly(func):
    """``func``, whose calls and every frame under them run eagerly, unseen by dynamo's
    frame callback, where it is called from running code: what ``torch.compiler.disable``
    does, without importing dynamo, and without a graph break where dynamo traces a call
    of it (it traces ``func`` then: a mode or hook that steps aside while compiling). For
    probe's own work called from inside compiled code.

    On torch 2.5+ too: a call dynamo leaves to run eagerly inside a compiled frame (HF
    Llama's ``lm_head`` after a graph break on torch 2.6) reaches the mode, whose frame
    dynamo then compiled as a graph of its own. That traced the mode (stepping aside, so
    the call was not dumped) and ran the call as inductor's kernel in place of the eager
    one: the gradients were no longer bitwise those of the run without probe."""
    dynamo_frames = torch._C._dynamo.eval_frame

    @functools.wraps(func)
    def eager(*args, **kwargs):
        if is_compiling():     # dynamo traces this call: it traces func
            return func(*args, **kwargs)
        prior = dynamo_frames.set_eval_frame(None)
        try:
            return func(*args, **kwargs)
        finally:
            dynamo_frames.set_eval_frame(prior)
    _skip_frame(eager.__code__)   # nor is this frame compiled
    return eager


def _skip_frame(code):
    """Dynamo's frame callback runs ``code``'s frames as they are (not those under them)."""
    dynamo_frames = torch._C._dynamo.eval_frame
    skip_code = getattr(dynamo_frames, "skip_code", None)
    if skip_code is not None:
        skip_code(code)
    else:   # newer torch (2.13) has no skip_code in C: the strategy it set, in full
        dynamo_frames.set_code_exec_strategy(code, dynamo_frames._FrameExecStrategy(
            dynamo_frames._FrameAction.SKIP, dynamo_frames._FrameAction.DEFAULT))


# The code of run_eagerly's frame between a caller and ``func``, for what reads the stack
# at a fixed depth.
EAGER_FRAME_CODE = run_eagerly(lambda: None).__code__


# FSDP2 (``fully_shard``: parameters become DTensor shards, the module's class becomes
# ``FSDP<Class>``) is ``torch.distributed.fsdp.fully_shard`` from torch 2.6 on,
# ``torch.distributed._composable.fsdp.fully_shard`` before (2.3-2.5); torch 2.1's
# ``torch.distributed._composable.fully_shard`` is FSDP1 underneath, not this.
_FSDP2_MODULES = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")


def fsdp2_module_class():
    """FSDP2's ``FSDPModule`` (what ``fully_shard`` makes a module an instance of) when a
    model of this process used it, else None. Only looked up where already imported: a
    model sharded by ``fully_shard`` imported it, and probe never imports it for others."""
    import sys
    for name in _FSDP2_MODULES:
        cls = getattr(sys.modules.get(name), "FSDPModule", None)
        if cls is not None:
            return cls
    return None


def fully_shard_api():
    """FSDP2's ``fully_shard`` (importing it), or None on a torch without FSDP2 (torch 2.1, 2.2)."""
    import importlib
    for name in _FSDP2_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "FSDPModule") and hasattr(module, "fully_shard"):
            return module.fully_shard
    return None


# FSDP2 on the CPU (gloo) runs only where the CPU's stand-in stream takes events:
# ``torch.cpu.Stream.record_event`` / ``wait_event`` (no-ops) came with torch 2.7
# (pytorch#145935). On torch 2.3-2.6 FSDP2's first all-gather raises AttributeError on the
# CPU, with or without probe; on an accelerator it runs.
FSDP2_RUNS_ON_CPU = hasattr(getattr(torch.cpu, "Stream", None), "record_event")
FSDP2_NOT_ON_CPU = (f"torch {torch.__version__}'s FSDP2 cannot run on the CPU: torch.cpu.Stream has no "
                    "record_event before torch 2.7 (pytorch#145935); on an accelerator it runs")


def real_tensors():
    """A context in which tensors are real even inside a compile's fake-tensor mode: the
    dump's flush may come while dynamo compiles, and fetches numbers of real tensors."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:   # torch < 2.2: no fake mode is left set where the dump flushes
        import contextlib
        return contextlib.nullcontext()
    return unset_fake_temporarily()

# torch.load(weights_only=True) refuses every pickle but plain tensors' from 2.6 on; before
# it, a crafted file runs code anyway (CVE-2025-32434). Read where a dump's .pt file is
# about to be loaded (probe.compare.tensors.load_pt), so a test can set it.
SAFE_WEIGHTS_ONLY = TORCH >= (2, 6)
