"""Live toolbox: what engineers reach for after a dump points at a suspect API.

Each tool is a context manager and a start()/stop() object, filtered by the same YAML
registry as dumping and by name lists (keyword arguments, else ditorch's environment
variables), with an optional ``condition_func(*args, **kwargs)`` deciding per call:

    with OpAutoCompare(): loss = model(x); loss.backward()     # CPU golden, fwd + bwd
    with OpFallback(ops="layer_norm"): ...                      # run on the CPU
    with OpDtypeCast(dtype_map="bf16->fp32"): ...               # cast inputs, outputs back
    with OpTimeMeasure(): ...                                   # per-call fwd/bwd ms
    with OpCapture(output_dir="cap"): ...                       # then: probe replay cap

Heavy imports happen on first use of a name.
"""
import importlib

from probe.errors import ConfigError

_EXPORTS = {
    "OpAutoCompare": "probe.toolbox.autocompare",
    "OpFallback": "probe.toolbox.fallback",
    "OpDtypeCast": "probe.toolbox.dtype_cast",
    "OpTimeMeasure": "probe.toolbox.timing",
    "OpCapture": "probe.toolbox.capture",
}

FEATURES = {
    "autocompare": "OpAutoCompare",
    "fallback": "OpFallback",
    "cast_dtype": "OpDtypeCast",
    "op_time_measure": "OpTimeMeasure",
    "op_capture": "OpCapture",
}

__all__ = sorted(_EXPORTS) + ["apply_feature"]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'probe.toolbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def apply_feature(ops, feature, condition_func=None, **options):
    """Apply one tool to the APIs ``ops``: exact names in any spelling (``torch.add``,
    ``Torch.add``, ``torch.nn.functional.linear``), a list or a comma-separated string.

    Returns the tool, already started: it stays on until ``.stop()``, as ditorch's
    apply_feature does; it is also a context manager (``with apply_feature(...):`` stops it
    at the end of the block). ``feature``: one of autocompare, fallback, cast_dtype,
    op_time_measure, op_capture. ``options`` are the tool's keyword arguments.
    """
    cls_name = FEATURES.get(feature)
    if cls_name is None:
        raise ConfigError(f"unknown feature {feature!r}; choose one of {', '.join(FEATURES)}")
    if ops is None or (not isinstance(ops, str) and not list(ops)):
        raise ConfigError("apply_feature needs at least one API name")
    import re

    from probe.toolbox.options import parse_list
    exact = [f"^{re.escape(op)}$" for op in parse_list(ops)]  # a name here means that API only
    tool = __getattr__(cls_name)(ops=exact, condition_func=condition_func, **options)
    return tool.start()
