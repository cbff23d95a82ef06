"""vLLM plugin: each engine step of each worker is one dumped step, with its token layout.

Registered under the entry point group ``vllm.general_plugins`` (pyproject.toml), which vLLM
loads in every process it starts (the API process, EngineCore, each worker). Active when
``PROBE_CONFIG=config.json`` is in the environment, or, as msprobe's vllm-ascend guide has it,
when the engine is given ``--additional-config '{"dump_config_path": "config.json"}'``::

    PROBE_CONFIG=config.json vllm serve ./model
    PROBE_CONFIG=config.json python generate.py      # LLM(...).generate(...)

What it patches, once ``vllm.v1.worker.gpu_model_runner`` is imported (CPUModelRunner and the
platforms' runners inherit it):

* ``__init__``: a :class:`PrecisionDebugger` per model runner (one per worker process), built
  before the model is loaded and compiled, so compiled graphs are instrumented;
* ``execute_model``: a step that schedules tokens is dumped; the trailing call with no tokens is
  not. Dumping starts at ``_model_forward`` (the model's forward, then ``compute_logits``) and
  resumes in ``sample_tokens`` (the sampler), where the step ends: ``stop()``, ``step()``;
* the warm-up, profile and dummy runs (``_dummy_run``, ``profile_run``) call the model outside
  ``execute_model``: never dumped.

Each step's ``token_layout.json`` comes from the scheduler's batch: rows in the order of the
input batch's requests, each request's ``num_scheduled_tokens`` rows, with the positions and
token ids the forward received (chunked prefill and decodes mixed), the prompts of the requests
new in the step, and the token each request sampled (a prefill chunk that samples nothing has
none). Steps go to ``{dump_path}/step{N}/rank{R}/``, R being the worker's torch.distributed rank.

A failure here is logged once and the engine's result returned: serving never breaks.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys

from probe.log_once import LogOnce

log = logging.getLogger(__name__)
_said = LogOnce(log)

ENV = "PROBE_CONFIG"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
RUNNER_V2_MODULE = "vllm.v1.worker.gpu.model_runner"   # model runner V2 (VLLM_USE_V2_MODEL_RUNNER)
ADDITIONAL_KEY = "dump_config_path"   # vllm-ascend's --additional-config key (msprobe's guide)


def register():
    """The ``vllm.general_plugins`` entry point, called in every vLLM process: the model runner
    is patched when its module is imported (at once if it already is). Costs nothing until then."""
    if any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        return
    todo = {RUNNER_MODULE: lambda m: patch_runner(m.GPUModelRunner), RUNNER_V2_MODULE: _say_v2}
    for name in list(todo):
        module = sys.modules.get(name)
        if module is not None:
            todo.pop(name)(module)
    if todo:
        sys.meta_path.insert(0, _PatchOnImport(todo))


def _say_v2(module):
    if os.environ.get(ENV):
        log.warning("probe: vLLM's model runner V2 is not patched: its steps are not dumped "
                    "(VLLM_USE_V2_MODEL_RUNNER=0 runs the V1 runner, which is)")


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``todo[name](module)`` right after module ``name`` is executed (a post-import hook)."""

    def __init__(self, todo):
        self.todo = todo

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.todo:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        then = self.todo.pop(fullname)
        if not self.todo:
            sys.meta_path.remove(self)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            try:
                then(module)
            except Exception as exc:   # a vLLM whose runner looks otherwise: say so, serve on
                log.warning("probe: cannot patch vLLM's model runner (%s: %s): nothing is dumped",
                            type(exc).__name__, exc)

        spec.loader.exec_module = exec_and_patch
        return spec


def config_path(vllm_config):
    """The probe config of this engine: ``PROBE_CONFIG``, else ``additional_config``'s
    ``dump_config_path``; None when neither is given (the plugin stays off)."""
    path = os.environ.get(ENV)
    if path:
        return path
    extra = getattr(vllm_config, "additional_config", None) or {}
    if isinstance(extra, dict) and extra.get(ADDITIONAL_KEY):
        return str(extra[ADDITIONAL_KEY])
    return None


def patch_runner(cls):
    """Wrap the methods of ``cls`` (GPUModelRunner) that delimit an engine step."""
    if getattr(cls, "_probe_patched", False):
        return
    init, execute, forward, sample = cls.__init__, cls.execute_model, cls._model_forward, cls.sample_tokens

    def __init__(self, vllm_config, *args, **kwargs):
        init(self, vllm_config, *args, **kwargs)
        self._probe_steps = None
        path = config_path(vllm_config)
        if path:
            from probe.errors import ConfigError
            try:
                self._probe_steps = EngineSteps(path)
                say_compiled(vllm_config)
            except ConfigError:
                raise   # a bad config is said at start-up, as PrecisionDebugger says it
            except Exception as exc:
                log.warning("probe: the vLLM plugin is off (%s: %s)", type(exc).__name__, exc)

    def execute_model(self, scheduler_output, *args, **kwargs):
        steps = getattr(self, "_probe_steps", None)
        if steps is None or not scheduler_output.total_num_scheduled_tokens:
            return execute(self, scheduler_output, *args, **kwargs)
        steps.begin(scheduler_output)
        try:
            out = execute(self, scheduler_output, *args, **kwargs)
        except BaseException:
            steps.end(None)
            raise
        steps.pause()
        if out is not None:   # no sample_tokens follows (pooling, a pipeline stage's tensors)
            steps.end(None)
        return out

    def _model_forward(self, input_ids=None, positions=None, *args, **kwargs):
        steps = getattr(self, "_probe_steps", None)
        if steps is not None and steps.pending is not None:
            steps.forward(self, input_ids, positions)
        return forward(self, input_ids, positions, *args, **kwargs)

    def sample_tokens(self, *args, **kwargs):
        steps = getattr(self, "_probe_steps", None)
        if steps is None or not steps.in_step:
            return sample(self, *args, **kwargs)
        steps.resume()
        out = None
        try:
            out = sample(self, *args, **kwargs)
        finally:
            steps.end(out)
        return out

    for name, wrapper, original in (("__init__", __init__, init), ("execute_model", execute_model, execute),
                                    ("_model_forward", _model_forward, forward),
                                    ("sample_tokens", sample_tokens, sample)):
        wrapper.__wrapped__ = original
        wrapper.__name__ = name
        wrapper.__qualname__ = f"{cls.__name__}.{name}"
        setattr(cls, name, wrapper)
    cls._probe_patched = True


def say_compiled(vllm_config):
    """One line when vLLM compiles its model (its default without ``enforce_eager``): what the
    dump holds then. vLLM compiles for a symbolic token count, and probe instruments compiled
    graphs of static shapes only (the statistics ops it inserts need them), so the torch APIs
    fused inside the graphs (norms, activations, rotary) are not dumped; the ops vLLM runs
    between and outside them (its kernels, its attention: ``torch.ops``) are, as called."""
    mode = getattr(getattr(vllm_config, "compilation_config", None), "mode", None)
    if mode is None or not int(mode):   # CompilationMode.NONE: eager
        return
    log.warning("probe: vLLM compiles the model (compilation mode %s): its kernels and attention (torch.ops) "
                "are dumped as called, the torch APIs inside its compiled graphs are not (they are compiled "
                "for a symbolic token count); enforce_eager=True dumps every API", getattr(mode, "name", mode))


class EngineSteps:
    """One worker's debugger and the engine step it is in."""

    def __init__(self, path):
        from probe.debugger import PrecisionDebugger
        self.debugger = PrecisionDebugger(config_path=path)
        self.pending = None     # the step's scheduler output, from execute_model until the forward
        self.in_step = False    # between execute_model and the end of sample_tokens
        self.rows = None        # (request, position, token) per row of the forward's tokens
        self.prompts = {}
        self.model = None
        self.dumping = False    # between the debugger's start() and stop()

    # each part logs its failure once and lets the engine go on
    def begin(self, scheduler_output):
        self.pending = scheduler_output
        self.in_step = True
        self.rows = None

    def forward(self, runner, input_ids, positions):
        scheduler_output, self.pending = self.pending, None
        try:
            self.rows, self.prompts = batch_layout(runner, scheduler_output, input_ids, positions)
        except Exception as exc:
            _said.warning("layout", "probe: no token layout for vLLM's steps (%s: %s)", type(exc).__name__, exc)
        self.model = getattr(runner, "model", None)
        self.resume()
        if self.rows is not None:   # now: statistics mode gives the step's records token_stats by it
            self._safely("layout", lambda: self.debugger.set_step_layout(make_layout(self.rows, self.prompts, None)))

    def pause(self):
        if self.dumping:
            self.dumping = False
            self._safely("stop", self.debugger.stop)

    def resume(self):
        if not self.dumping:
            self.dumping = True
            self._safely("start", lambda: self.debugger.start(self.model))

    def end(self, output):
        """The step is over: its layout with the tokens sampled, its files complete."""
        if not self.in_step:
            return
        self.in_step = False
        self.pending = None
        self.pause()
        if self.rows is not None:
            self._safely("layout", lambda: self.debugger.set_step_layout(make_layout(self.rows, self.prompts, output)))
        self._safely("step", self.debugger.step)

    def _safely(self, what, fn):
        try:
            fn()
        except Exception as exc:
            _said.warning(what, "probe: the vLLM plugin's %s failed (%s: %s); the engine is unaffected",
                          what, type(exc).__name__, exc)


def batch_layout(runner, scheduler_output, input_ids, positions):
    """(rows, prompts) of the batch the forward is about to run: the input batch's requests in
    order, ``num_scheduled_tokens`` rows each, then padding up to the forward's token count."""
    req_ids = [r for r in runner.input_batch.req_ids if r is not None]
    counts = scheduler_output.num_scheduled_tokens
    tokens = _as_list(input_ids)
    pos = _as_list(positions)
    n_rows = len(tokens) if tokens is not None else len(pos)
    rows = []
    for rid in req_ids:
        for _ in range(counts.get(rid, 0)):
            i = len(rows)
            rows.append((rid, int(pos[i]) if pos is not None else -1, int(tokens[i]) if tokens is not None else -1))
    if len(rows) > n_rows:
        raise ValueError(f"{len(rows)} scheduled tokens, the forward has {n_rows}")
    rows.extend(("", -1, -1) for _ in range(n_rows - len(rows)))   # padded tail
    prompts = {r.req_id: list(r.prompt_token_ids) for r in getattr(scheduler_output, "scheduled_new_reqs", ())
               if getattr(r, "prompt_token_ids", None) is not None}
    return rows, prompts


def _as_list(t):
    if t is None:
        return None
    if getattr(t, "ndim", 1) != 1:   # M-RoPE positions (3, n): the first row is the text position
        t = t[0]
    return t.tolist()


def make_layout(rows, prompts, output):
    """The contract's StepLayout (probe.inference.token_layout) of one engine step."""
    from probe.inference.token_layout import StepLayout, TokenRow
    produced = {}
    req_ids = getattr(output, "req_ids", None) or []
    sampled = getattr(output, "sampled_token_ids", None) or []
    for rid, toks in zip(req_ids, sampled):
        toks = toks.tolist() if hasattr(toks, "tolist") else list(toks)
        if toks:
            produced[rid] = int(toks[-1])
    return StepLayout(source="vllm", token_shape=(len(rows),),
                      rows=[TokenRow(r, p, t, pad=(r == "")) for r, p, t in rows],
                      produced=produced, prompts=prompts)
