"""Forensics for failures that take days by hand (issue #6).

* :mod:`~probe.forensics.crash` — an API that raises saves its inputs, stack and a
  repro script to ``{dump_path}/exception/{entry}/``, then the exception goes on.
* :mod:`~probe.forensics.repro` — ``probe repro``: one dumped call as a script that
  needs only torch.
* :mod:`~probe.forensics.meta_check` — meta (fake-tensor) inference vs the kernel's
  real output dtype/shape/stride (task ``meta_check``, ``probe meta-check``).
* :mod:`~probe.forensics.backward_origin` — the forward API behind a backward that
  raises or yields NaN/Inf.

A :class:`~probe.PrecisionDebugger` builds its handler chain at construction, with a
:class:`~probe.forensics.hub.ForensicsHandler` (``debugger.forensics``) between the
interceptor and the dump collector; :func:`configure` (called there) adds the features
its config asks for. A user adds one with the feature's ``enable(debugger)``, which adds
it to ``debugger.forensics``: the one composition point.
"""


def configure(debugger):
    """Enable what a debugger's config asks for: crash dumps always, backward origin
    when ``backward_origin`` is set (it costs tens of microseconds per call), the meta
    check for task ``meta_check``."""
    from probe.forensics import backward_origin, crash, meta_check
    h = debugger.forensics
    if h.get(crash.CrashDump) is None:
        crash.enable(debugger)
    if getattr(debugger.config, "backward_origin", False) and h.get(backward_origin.BackwardOrigin) is None:
        backward_origin.enable(debugger)
    if getattr(debugger.config, "task", None) == "meta_check" and h.get(meta_check.MetaCheck) is None:
        meta_check.enable(debugger)
    return h
