"""API accuracy pre-check (run_ut) and overflow check.

    from probe.precheck import run_ut, find_overflow
    result = run_ut("dump/step0/rank/dump.json", out_dir="precheck_out")
    print(result.summary_table())

Imports are lazy: ``import probe.precheck`` does not import torch.
"""
_EXPORTS = {
    "run_ut": "probe.precheck.runner",
    "RunUtResult": "probe.precheck.runner",
    "find_overflow": "probe.precheck.overflow",
    "OverflowCollector": "probe.dump.overflow",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'probe.precheck' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(module), name)


__all__ = list(_EXPORTS)
