"""Verbose output of the library, shown without any logging setup: ``show_info()``.

Library code never prints: it logs through ``logging.getLogger(__name__)`` (the CLI
prints). A user who asked for verbose output (a toolbox tool with ``verbose=True``,
``compare(..., {"is_print_compare_log": True})``) expects to see those INFO lines even
when the script never configured logging, where Python would drop them (the root
logger's level is WARNING). The tool then calls :func:`show_info`, which gives the
``probe`` logger one plain stderr handler: only when neither ``probe`` nor the root
logger has a handler, at most once per process, and that handler stays silent once the
root logger has handlers of its own. The user's logging configuration always wins.
"""
import logging
import sys

_LOGGER = "probe"


class _Stderr(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (a replaced or captured stream too)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self.addFilter(lambda record: not logging.getLogger().handlers)   # logging set up since

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):   # StreamHandler.__init__ assigns one; stderr is read at each write
        pass


def show_info():
    """Let the ``probe`` logger's INFO records reach stderr as plain lines, unless logging
    is configured (the ``probe`` or the root logger has a handler). Idempotent."""
    logger = logging.getLogger(_LOGGER)
    if logger.handlers or logging.getLogger().handlers:
        return
    logger.addHandler(_Stderr())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
