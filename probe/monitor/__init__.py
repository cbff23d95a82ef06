"""Training monitor: per-layer statistics of every (n-th) step, anomaly alerts, outputs.

``Monitor`` (monitor.py) ties the parts: options.py (checked options), hooks.py (what is
hooked and when), summaries.py (statistics on the device, one fetch), anomaly.py (NaN/Inf
and robust spikes, first alert in call order), outputs.py (CSV, TensorBoard, alerts.jsonl),
dump_on_alert.py (a PrecisionDebugger dump of the alerting layer), hf_callback.py
(transformers' Trainer).
"""
from probe.monitor.monitor import Monitor

__all__ = ["Monitor", "MonitorCallback"]


def __getattr__(name):
    if name == "MonitorCallback":   # imports transformers: only when asked for
        from probe.monitor.hf_callback import MonitorCallback
        return MonitorCallback
    raise AttributeError(f"module 'probe.monitor' has no attribute {name!r}")
