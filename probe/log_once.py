"""Say a failure once: a broken hook runs on every call and must not flood a training log.

    said = LogOnce(logging.getLogger(__name__))
    said.warning(("feature", name), "probe: %s failed (%s)", name, exc)
    said.failed("writing the step's file", exc)     # "probe: writing ... failed, skipped ..."

Each ``LogOnce`` remembers its own keys (a dump run's, a tool's, a module's); thread-safe.
"""
import logging
import threading


class LogOnce:
    def __init__(self, logger: logging.Logger, who: str = "probe"):
        self.logger = logger
        self.who = who               # names the tool in ``failed``'s line ("probe monitor")
        self._said: set = set()
        self._lock = threading.Lock()

    def first(self, key) -> bool:
        """True the first time ``key`` is seen."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True

    def said(self, key) -> bool:
        """Whether ``key`` was said already (a check that only leads to saying it can stop)."""
        return key in self._said

    def warning(self, key, msg, *args):
        if self.first(key):
            self.logger.warning(msg, *args)

    def error(self, key, msg, *args):
        if self.first(key):
            self.logger.error(msg, *args)

    def failed(self, where: str, exc: BaseException) -> None:
        """``where`` raised ``exc`` and was skipped: a warning, once per place."""
        self.warning(where, "%s: %s failed, skipped (logged once): %s: %s", self.who, where,
                     type(exc).__name__, exc)
