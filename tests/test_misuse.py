"""Misuse is said in one line, once, and never raised into the training loop: the call
sequence mistakes, unknown API names in a user's YAML, and a bad keyword argument named
as a keyword argument (not as if it were in the config file)."""
import json
import logging

import pytest
import yaml

torch = pytest.importorskip("torch")

from conftest import load_dump  # noqa: E402

from probe import PrecisionDebugger  # noqa: E402
from probe.errors import ConfigError  # noqa: E402


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("probe")]


def test_stop_without_start(make_debugger, caplog):
    dbg = make_debugger(task="statistics")
    with caplog.at_level(logging.WARNING):
        dbg.stop()
        dbg.stop()
    assert _warnings(caplog) == ["probe: stop() called without start(): nothing to stop"]


def test_step_without_start(make_debugger, caplog):
    dbg = make_debugger(task="statistics")
    with caplog.at_level(logging.WARNING):
        dbg.step()
    assert _warnings(caplog) == ["probe: step() without start() during step 0: nothing was dumped"]


def test_second_start(make_debugger, dump_dir, caplog):
    dbg = make_debugger(task="statistics")
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING):
        dbg.start()
        torch.relu(x)
        dbg.start()
        torch.relu(x)
        dbg.stop()
        dbg.step()
    assert _warnings(caplog) == ["probe: start() called again without stop(): the dump goes on as one"]
    assert {"Torch.relu.0.forward", "Torch.relu.1.forward"} <= set(load_dump(dump_dir))


def test_step_while_started_says_later_calls_are_not_recorded(make_debugger, dump_dir, caplog):
    dbg = make_debugger(task="statistics")
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING):
        dbg.start()
        torch.relu(x)
        dbg.step()            # no stop(): the dump stops here
        torch.relu(x)         # not recorded: said above
        dbg.stop()            # after step(), nothing started: said too
    msgs = _warnings(caplog)
    assert msgs[0].startswith("probe: step() called between start() and stop()")
    assert msgs[1] == "probe: stop() called without start(): nothing to stop"
    assert list(load_dump(dump_dir)) == ["Torch.relu.0.forward"]


def test_correct_sequence_says_nothing(make_debugger, caplog):
    dbg = make_debugger(task="statistics", step=[1])
    with caplog.at_level(logging.WARNING):
        for _ in range(3):    # steps 0 and 2 are not dumped: start/stop are still right
            dbg.start()
            torch.relu(torch.ones(2))
            dbg.stop()
            dbg.step()
    assert _warnings(caplog) == []


def test_unknown_api_in_user_yaml(make_debugger, tmp_path, caplog):
    path = tmp_path / "ops.yaml"
    path.write_text(yaml.safe_dump({"functional": ["gelu", "geluu"], "torch": ["matmul", "linalg.normm"]}))
    with caplog.at_level(logging.WARNING):
        make_debugger(task="statistics", wrap_ops_yaml=str(path))
    msgs = _warnings(caplog)
    assert len(msgs) == 1, msgs
    assert str(path) in msgs[0]
    assert "functional.geluu (did you mean gelu" in msgs[0]
    assert "torch.linalg.normm (did you mean linalg.norm" in msgs[0]
    assert "matmul " not in msgs[0].split("did you mean")[0]


def test_packaged_yaml_copy_says_nothing(make_debugger, tmp_path, caplog):
    """Names the packaged registry lists but this torch lacks (torch_npu, newer APIs) are expected."""
    from probe.hook_module.registry import DEFAULT_YAML
    copy = tmp_path / "ops.yaml"
    copy.write_text(open(DEFAULT_YAML, encoding="utf-8").read())
    with caplog.at_level(logging.WARNING):
        make_debugger(task="statistics", wrap_ops_yaml=str(copy))
    assert _warnings(caplog) == []


def test_bad_keyword_named_as_keyword(tmp_path, dump_dir):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": dump_dir, "level": "L1"}))
    with pytest.raises(ConfigError) as exc:
        PrecisionDebugger(config_path=str(cfg), level="L9")
    assert str(exc.value).startswith("PrecisionDebugger keyword argument: level: unknown level 'L9'")
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": dump_dir, "level": "L9"}))
    with pytest.raises(ConfigError) as exc:
        PrecisionDebugger(config_path=str(cfg))
    assert str(exc.value).startswith(f"{cfg}: level: unknown level 'L9'")
