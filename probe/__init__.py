"""probe: precision debugging for PyTorch training.

    from probe import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="config.json")
    debugger.start(); train_step(); debugger.stop(); debugger.step()

Heavy modules (torch, pandas) are imported on first use of a name, so that
``import probe`` and ``probe --help`` stay cheap.
"""
import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "PrecisionDebugger": "probe.debugger",
    "module_dump": "probe.debugger",
    "module_dump_end": "probe.debugger",
    "seed_all": "probe.seed",
    "ConfigError": "probe.config",
    "DumpError": "probe.errors",
    "compare": "probe.compare",
    "compare_distributed": "probe.compare",
    "compare_run": "probe.compare",
    "check_ranks": "probe.compare",
    "OpAutoCompare": "probe.toolbox",
    "OpFallback": "probe.toolbox",
    "OpDtypeCast": "probe.toolbox",
    "OpTimeMeasure": "probe.toolbox",
    "OpCapture": "probe.toolbox",
    "apply_feature": "probe.toolbox",
    "Monitor": "probe.monitor",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'probe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
