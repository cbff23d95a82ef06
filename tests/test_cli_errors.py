"""What the command line does with an exception: a user's mistake (ConfigError, a missing
file) is one line and exit 2; probe's own bug (any other ValueError, OSError, ...) keeps
its traceback."""
import types

import pytest

from probe import cli
from probe.errors import ConfigError


def _command(monkeypatch, exc):
    def run(args):
        raise exc
    module = types.SimpleNamespace(add_arguments=lambda parser: None, run=run)
    monkeypatch.setitem(cli.COMMANDS, "boom", ("probe_test_boom", "raises"))
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: module)


@pytest.mark.parametrize("exc", [ConfigError("--times must be >= 1"), FileNotFoundError("no such dump: x"),
                                 FileExistsError("config.json already exists")])
def test_a_users_mistake_is_one_line(monkeypatch, capsys, exc):
    _command(monkeypatch, exc)
    assert cli.main(["boom"]) == 2
    err = capsys.readouterr().err
    assert err == f"probe boom: error: {exc}\n"


@pytest.mark.parametrize("exc", [ValueError("probe's own bug"), OSError("disk full"), KeyError("x")])
def test_probes_own_bug_keeps_its_traceback(monkeypatch, exc):
    _command(monkeypatch, exc)
    with pytest.raises(type(exc)):
        cli.main(["boom"])
