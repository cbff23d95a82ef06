"""config.json and PrecisionDebugger(...) arguments (issue #2, item 7).

Every bad value is refused at construction with a ConfigError whose one-line message
names the key; good values reach the dump.
"""
import json
import os

import pytest
import torch
from conftest import load_dump

from probe import ConfigError, PrecisionDebugger


def _write(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _base(dump_dir, **extra):
    cfg = {"task": "statistics", "dump_path": dump_dir, "rank": [], "step": [], "level": "L1"}
    cfg.update(extra)
    return cfg


BAD_TOP = [
    ("unknown_key", {"dump_pth": "x"}, "dump_pth"),
    ("task_unknown", {"task": "overflow"}, "task"),
    ("task_type", {"task": 5}, "task"),
    ("level_unknown", {"level": "L9"}, "level"),
    ("level_type", {"level": ["L1"]}, "level"),
    ("dump_path_space", {"dump_path": "/tmp/a b"}, "dump_path"),
    ("dump_path_semicolon", {"dump_path": "/tmp/a;rm"}, "dump_path"),
    ("dump_path_unicode", {"dump_path": "/tmp/dümp"}, "dump_path"),
    ("dump_path_type", {"dump_path": 5}, "dump_path"),
    ("dump_path_empty", {"dump_path": ""}, "dump_path"),
    ("rank_type", {"rank": "0"}, "rank"),
    ("rank_item_type", {"rank": [0, "1"]}, "rank"),
    ("rank_bool", {"rank": [True]}, "rank"),
    ("rank_negative", {"rank": [-1]}, "rank"),
    ("step_type", {"step": "0"}, "step"),
    ("step_float", {"step": [1.5]}, "step"),
    ("step_negative", {"step": [-2]}, "step"),
    ("step_range_reversed", {"step": ["5-2"]}, "step"),
    ("step_range_garbage", {"step": ["a-b"]}, "step"),
    ("step_range_negative", {"step": ["-3-5"]}, "step"),
    ("step_range_huge_end", {"step": ["0-" + "9" * 5000]}, "step"),
    ("step_huge_int", {"step": [2 ** 64]}, "step"),
    ("rank_range", {"rank": ["0-3"]}, "rank"),
    ("seed_type", {"seed": "1"}, "seed"),
    ("seed_bool", {"seed": True}, "seed"),
    ("is_deterministic_type", {"is_deterministic": "yes"}, "is_deterministic"),
    ("async_dump_type", {"async_dump": 1}, "async_dump"),
    ("enable_dataloader_type", {"enable_dataloader": "no"}, "enable_dataloader"),
    ("framework", {"framework": "mindspore"}, "framework"),
    ("wrap_ops_yaml_type", {"wrap_ops_yaml": 3}, "wrap_ops_yaml"),
    ("wrap_ops_yaml_missing", {"wrap_ops_yaml": "/nonexistent/ops.yaml"}, "wrap_ops_yaml"),
]

BAD_SECTION = [
    ("section_unknown_key", {"scop": []}, "scop"),
    ("scope_type", {"scope": "Torch.exp.0.forward"}, "scope"),
    ("scope_one_item", {"scope": ["Torch.exp.0.forward"]}, "scope"),
    ("list_type", {"list": "relu"}, "list"),
    ("list_item_type", {"list": [1]}, "list"),
    ("list_bad_regex", {"list": ["regex(([)"]}, "list"),
    ("data_mode_type", {"data_mode": "all"}, "data_mode"),
    ("data_mode_unknown", {"data_mode": ["fwd"]}, "data_mode"),
    ("summary_mode_unknown", {"summary_mode": "sha256"}, "summary_mode"),
]


def _refused(make, key):
    with pytest.raises(ConfigError) as info:
        make()
    msg = str(info.value)
    assert "\n" not in msg and key in msg, msg
    return msg


@pytest.mark.parametrize("case,extra,key", BAD_TOP, ids=[c[0] for c in BAD_TOP])
def test_bad_top_level_value_is_refused(tmp_path, dump_dir, case, extra, key):
    path = _write(tmp_path, _base(dump_dir, **extra))
    msg = _refused(lambda: PrecisionDebugger(config_path=path), key)
    if case != "wrap_ops_yaml_missing":
        assert path in msg  # names the file too


@pytest.mark.parametrize("case,section,key", BAD_SECTION, ids=[c[0] for c in BAD_SECTION])
def test_bad_task_section_value_is_refused(tmp_path, dump_dir, case, section, key):
    path = _write(tmp_path, _base(dump_dir, statistics=section))
    _refused(lambda: PrecisionDebugger(config_path=path), key)


@pytest.mark.parametrize("where,typo,meant", [("top", "dump_pth", "dump_path"), ("top", "levle", "level"),
                                              ("section", "scop", "scope"), ("section", "data_mod", "data_mode")])
def test_misspelt_key_names_the_key_it_looks_like(tmp_path, dump_dir, where, typo, meant):
    cfg = _base(dump_dir, **{typo: "x"}) if where == "top" else _base(dump_dir, statistics={typo: []})
    path = _write(tmp_path, cfg)
    msg = _refused(lambda: PrecisionDebugger(config_path=path), typo)
    assert f"did you mean {meant!r}?" in msg and path in msg and "allowed:" in msg, msg
    msg = _refused(lambda: PrecisionDebugger(config_path=_write(tmp_path, _base(dump_dir, task="tensr"))), "task")
    assert "did you mean 'tensor'?" in msg
    msg = _refused(lambda: PrecisionDebugger(dump_path=dump_dir, levl="L1"), "levl")
    assert "did you mean 'level'?" in msg
    # nothing close: no guess
    assert "did you mean" not in _refused(lambda: PrecisionDebugger(dump_path=dump_dir, zzzz=1), "zzzz")


def test_monitor_misspelt_key_names_the_key_it_looks_like(tmp_path):
    from probe.monitor.options import load_options
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"monitor": {"activatons": True}}))
    msg = _refused(lambda: load_options(str(path)), "activatons")
    assert "did you mean 'activations'?" in msg and str(path) in msg
    assert "did you mean 'tensorboard'?" in _refused(lambda: load_options(formats=["tensorbord"]), "tensorbord")


def test_dump_path_that_is_a_file_says_so(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    msg = _refused(lambda: PrecisionDebugger(dump_path=str(blocker)), "dump_path")
    assert msg.endswith(f"dump_path: {str(blocker)!r} is a file: a folder is needed"), msg
    assert "File exists" not in msg


def test_relative_wrap_ops_yaml_is_relative_to_the_config_file(tmp_path, dump_dir, monkeypatch):
    from probe.config import load_config
    from probe.hook_module.registry import DEFAULT_YAML
    proj = tmp_path / "proj"
    (proj / "ops").mkdir(parents=True)
    (proj / "ops" / "mine.yaml").write_text(open(DEFAULT_YAML).read())
    path = _write(proj, _base(dump_dir, wrap_ops_yaml="ops/mine.yaml"))
    monkeypatch.chdir(tmp_path)           # not the config's folder
    assert os.path.samefile(load_config(path).wrap_ops_yaml, proj / "ops" / "mine.yaml")
    bad = _write(proj, _base(dump_dir, wrap_ops_yaml="ops/other.yaml"))
    msg = _refused(lambda: load_config(bad), "wrap_ops_yaml")
    assert "ops/other.yaml" in msg and str(proj / "ops" / "other.yaml") in msg and bad in msg, msg


def test_unwritable_dump_path_is_refused(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    _refused(lambda: PrecisionDebugger(dump_path=str(blocker / "dump")), "dump_path")


def test_rank_list_that_can_never_match_is_refused(dump_dir, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    _refused(lambda: PrecisionDebugger(dump_path=dump_dir, rank=[2, 5]), "rank")
    PrecisionDebugger(dump_path=dump_dir, rank=[1, 5]).close()  # rank 1 can match


def test_missing_and_malformed_config_files(tmp_path):
    _refused(lambda: PrecisionDebugger(config_path=str(tmp_path / "nope.json")), "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\"task\": ")
    _refused(lambda: PrecisionDebugger(config_path=str(bad)), "bad.json")
    arr = tmp_path / "arr.json"
    arr.write_text("[]")
    _refused(lambda: PrecisionDebugger(config_path=str(arr)), "arr.json")


def test_task_section_of_wrong_type_is_refused(tmp_path, dump_dir):
    path = _write(tmp_path, _base(dump_dir, statistics=[]))
    _refused(lambda: PrecisionDebugger(config_path=path), "statistics")


def test_unknown_keyword_argument_is_refused(dump_dir):
    _refused(lambda: PrecisionDebugger(dump_path=dump_dir, dump_pth="elsewhere"), "dump_pth")


def test_seed_out_of_range_is_refused(tmp_path, dump_dir):
    path = _write(tmp_path, _base(dump_dir, seed=-5))
    msg = _refused(lambda: PrecisionDebugger(config_path=path), "seed")
    assert path in msg


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_level_is_honoured(dump_dir, level):
    """A level probe accepts must change what is dumped: modules at L0, modules and APIs at mix."""
    dbg = PrecisionDebugger(dump_path=dump_dir, level=level)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    x = torch.randn(2, 3)
    dbg.start(model=model)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    names = list(load_dump(dump_dir))
    modules = [n for n in names if n.startswith("Module.")]
    assert "Module.0.Linear.forward.0" in modules and "Module.0.Linear.backward.0" in modules
    apis = [n for n in names if not n.startswith("Module.")]
    assert (apis == []) if level == "L0" else ("Functional.linear.0.forward" in apis)


def test_keyword_arguments_override_the_file(tmp_path, dump_dir, make_debugger):
    other = os.path.join(dump_dir, "other")
    path = _write(tmp_path, _base(other, task="statistics", step=[3]))
    dbg = make_debugger(config_path=path, task="tensor", step=[0])  # dump_path from make_debugger
    assert (dbg.config.task, dbg.config.dump_path, dbg.config.step.spans) == ("tensor", dump_dir, ((0, 0),))
    dbg.start()
    torch.exp(torch.ones(2))
    dbg.stop()
    dbg.step()
    assert os.listdir(os.path.join(dump_dir, "step0", "rank", "dump_tensor_data"))


def test_good_values_are_accepted(tmp_path, dump_dir):
    cfg = _base(dump_dir, step=[0, "2-4", "7"], rank=[0, 1], seed=7, is_deterministic=False, async_dump=True,
                enable_dataloader=False,
                statistics={"scope": [], "list": ["relu", "regex(^Torch\\.)"], "data_mode": ["forward", "input"],
                            "summary_mode": "md5"},
                tensor={"scope": [], "list": [], "data_mode": ["all"]},
                overflow_check={"overflow_nums": 1})
    cfg = PrecisionDebugger(config_path=_write(tmp_path, cfg)).config
    assert cfg.step.spans == ((0, 0), (2, 4), (7, 7)) and cfg.rank.spans == ((0, 1),) and cfg.seed == 7
    assert cfg.summary_mode == "md5" and cfg.data_mode == ("forward", "input")
    assert cfg.list == ("relu", "regex(^Torch\\.)") and cfg.async_dump is True


def test_huge_step_and_rank_ranges_are_kept_as_ranges(tmp_path, dump_dir):
    """A trillion-step range costs two ints, not a set of its members (which grew to 24 GB
    until the OOM killer stopped PrecisionDebugger(...))."""
    cfg = _base(dump_dir, step=["0-1000000000000", 5, "2000000000000-2000000000005", "7-9"],
                rank=[7, 3, 1, 2])
    cfg = PrecisionDebugger(config_path=_write(tmp_path, cfg)).config
    assert cfg.step.spans == ((0, 1000000000000), (2000000000000, 2000000000005))
    assert cfg.rank.spans == ((1, 3), (7, 7))
    for step, wanted in ((0, True), (10 ** 12, True), (10 ** 12 + 1, False), (2 * 10 ** 12 - 1, False),
                         (2 * 10 ** 12, True), (2 * 10 ** 12 + 5, True), (2 * 10 ** 12 + 6, False)):
        assert cfg.wants_step(step) is wanted, step
    for rank, wanted in ((0, False), (1, True), (3, True), (4, False), (6, False), (7, True), (8, False)):
        assert cfg.wants_rank(rank) is wanted, rank
    empty = PrecisionDebugger(dump_path=dump_dir).config
    assert empty.wants_step(10 ** 15) and empty.wants_rank(0)   # no list: every step and rank


def test_step_range_edges_decide_which_steps_are_dumped(make_debugger, dump_dir):
    dbg = make_debugger(step=["1-2", "4-4"])
    for _ in range(6):
        dbg.start()
        torch.exp(torch.ones(2))
        dbg.stop()
        dbg.step()
    dbg.close()
    assert sorted(os.listdir(dump_dir)) == ["step1", "step2", "step4"]


def test_unreadable_config_json_is_one_line(tmp_path):
    for name, data in (("digits", b'{"step": [' + b"1" * 5000 + b"]}"), ("deep", b"[" * 100000 + b"]" * 100000),
                       ("utf16", '{"step": [1]}'.encode("utf-16")), ("latin1", b'{"dump_path": "\xe9"}')):
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        msg = _refused(lambda p=str(path): PrecisionDebugger(config_path=p), str(path))
        assert len(msg) < 400, msg


def test_seed_in_config_fixes_the_rngs(tmp_path, dump_dir):
    path = _write(tmp_path, _base(dump_dir, seed=42))
    PrecisionDebugger(config_path=path).close()
    a = torch.rand(3)
    torch.manual_seed(42)
    assert torch.equal(a, torch.rand(3))


def test_rank_dir_and_rank_filter_without_distributed(make_debugger, dump_dir):
    dbg = make_debugger(rank=[3])  # not distributed: the rank list does not apply
    dbg.start()
    torch.exp(torch.ones(2))
    dbg.stop()
    dbg.step()
    assert os.listdir(os.path.join(dump_dir, "step0")) == ["rank"]
