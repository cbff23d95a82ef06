"""console_log.show_info: verbose INFO lines reach stderr only where logging is not set up."""
import contextlib
import logging

from probe import console_log


@contextlib.contextmanager
def bare_logging():
    """No handler on the root logger, as in a script that never configured logging, and a
    fresh ``probe`` logger; both restored on exit. Used inside the test body: pytest adds
    its own handlers to the root logger around it."""
    root, probe = logging.getLogger(), logging.getLogger("probe")
    saved = root.handlers[:], probe.handlers[:], probe.level
    root.handlers[:], probe.handlers[:] = [], []
    probe.setLevel(logging.NOTSET)
    try:
        yield probe
    finally:
        root.handlers[:], probe.handlers[:] = saved[0], saved[1]
        probe.setLevel(saved[2])


def test_adds_one_stderr_handler_at_most(capsys):
    with bare_logging() as probe:
        console_log.show_info()
        console_log.show_info()
        assert len(probe.handlers) == 1 and probe.level == logging.INFO
        logging.getLogger("probe.toolbox.fallback").info("probe fallback: %s", "Tensor.add.0")
        logging.getLogger("probe.toolbox.fallback").debug("not shown")
        cap = capsys.readouterr()                      # stderr as it is now: pytest's capture
        assert cap.err == "probe fallback: Tensor.add.0\n" and cap.out == ""
        # logging configured afterwards wins: the handler falls silent, nothing is said twice
        logging.getLogger().addHandler(logging.NullHandler())
        logging.getLogger("probe.compare.entry_points").info("[probe compare] verdict")
        assert capsys.readouterr().err == ""


def test_does_nothing_when_root_logging_is_configured(capsys):
    with bare_logging() as probe:
        logging.getLogger().addHandler(logging.NullHandler())
        console_log.show_info()
        assert probe.handlers == [] and probe.level == logging.NOTSET
        logging.getLogger("probe.toolbox.timing").info("slowest APIs")
        assert capsys.readouterr().err == ""


def test_does_nothing_when_the_probe_logger_has_a_handler():
    with bare_logging() as probe:
        own = logging.NullHandler()
        probe.addHandler(own)
        console_log.show_info()
        assert probe.handlers == [own] and probe.level == logging.NOTSET
