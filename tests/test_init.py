"""``probe init DIR`` and ``seed_all``."""
import json
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import load_dump

from probe import PrecisionDebugger, seed_all
from probe.cli import main


def _delete_line(yaml_path, section, name):
    """Remove ``  - name`` from ``section:`` of the YAML, touching nothing else."""
    with open(yaml_path) as f:
        lines = f.readlines()
    current, out, removed = None, [], 0
    for line in lines:
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.strip()[:-1]
        if current == section and line.strip() == f"- {name}":
            removed += 1
            continue
        out.append(line)
    assert removed == 1
    with open(yaml_path, "w") as f:
        f.writelines(out)


def test_init_writes_config_and_yaml_that_drive_the_dump(tmp_path, monkeypatch, capsys):
    target = tmp_path / "proj"
    assert main(["init", str(target)]) == 0
    config_path, yaml_path = target / "config.json", target / "support_wrap_ops.yaml"
    assert set(capsys.readouterr().out.split()) == {str(config_path), str(yaml_path)}
    config = json.loads(config_path.read_text())
    assert config["wrap_ops_yaml"] == "support_wrap_ops.yaml"          # relative to config.json
    assert os.path.samefile(target / config["wrap_ops_yaml"], yaml_path)

    monkeypatch.chdir(tmp_path)  # the example config dumps to ./dump_path
    x = torch.randn(4)

    def dump():
        dbg = PrecisionDebugger(config_path=str(config_path))
        dbg.start()
        F.gelu(x)
        F.relu(x)
        dbg.stop()
        dbg.step()
        dbg.close()
        return list(load_dump(tmp_path / "dump_path"))

    assert dump() == ["Functional.gelu.0.forward", "Functional.relu.0.forward"]
    _delete_line(yaml_path, "functional", "gelu")
    assert dump() == ["Functional.relu.0.forward"]


def test_init_folder_can_move_with_its_config(tmp_path, monkeypatch, capsys):
    """config.json names its registry relative to itself: the moved folder's own copy is
    used, from any working directory."""
    assert main(["init", str(tmp_path / "proj")]) == 0
    moved = tmp_path / "elsewhere" / "proj"
    moved.parent.mkdir()
    os.rename(tmp_path / "proj", moved)
    _delete_line(moved / "support_wrap_ops.yaml", "functional", "gelu")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    x = torch.randn(4)
    dbg = PrecisionDebugger(config_path=str(moved / "config.json"))
    dbg.start()
    F.gelu(x)
    F.relu(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert list(load_dump(work / "dump_path")) == ["Functional.relu.0.forward"]


def test_init_refuses_to_overwrite_without_force(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    (tmp_path / "config.json").write_text("{}")
    assert main(["init", str(tmp_path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (tmp_path / "config.json").read_text() == "{}"
    assert main(["init", str(tmp_path), "--force"]) == 0
    assert json.loads((tmp_path / "config.json").read_text())["task"] == "statistics"


@pytest.fixture
def restore_rng_env(monkeypatch):
    for key in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "HCCL_DETERMINISTIC"):
        monkeypatch.setenv(key, "")
    yield
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def _draws():
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist(), torch.randn(2).tolist()


def test_seed_all_fixes_every_rng(restore_rng_env):
    seed_all(123)
    first = _draws()
    seed_all(123)
    assert _draws() == first
    seed_all(124)
    assert _draws() != first
    assert os.environ["PYTHONHASHSEED"] == "124"
    assert not torch.are_deterministic_algorithms_enabled()


def test_seed_all_mode_enables_deterministic_algorithms(restore_rng_env):
    seed_all(5, mode=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


@pytest.mark.parametrize("seed", [-1, 2 ** 32, 1.5, "1", True])
def test_seed_all_refuses_bad_seeds(seed):
    with pytest.raises(ValueError, match="seed"):
        seed_all(seed)


def test_repository_example_config_dumps_a_real_model(tmp_path, monkeypatch):
    """The config.json at the repository root works as shipped (its dump_path is relative)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.chdir(tmp_path)
    dbg = PrecisionDebugger(config_path=os.path.join(root, "config.json"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    dbg.start()
    model(torch.randn(2, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    with open(tmp_path / "dump_path" / "step0" / "rank" / "dump.json") as f:
        data = json.load(f)["data"]
    assert "Functional.linear.0.forward" in data and "Functional.linear.0.backward" in data
