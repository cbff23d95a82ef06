"""Compare's options: one frozen, grouped object from the command line to each pair's
worker; a misspelt option is an error that names it, never silently dropped."""
import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from probe.compare import CompareOptions, compare, compare_run
from probe.compare.options import Analysis, Matching, Output
from probe.errors import ConfigError


def test_keywords_fill_the_groups_and_come_back():
    o = CompareOptions.from_keywords("t", fuzzy_match=True, replay=False, html=False)
    assert o == CompareOptions(Matching(fuzzy_match=True), Analysis(replay=False), Output(html=False))
    assert CompareOptions.from_keywords("t", **o.keywords()) == o
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.matching.align = True          # frozen: what the CLI decided reaches the worker as it was


def test_an_unknown_option_is_a_config_error_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"compare_run: unknown keyword argument 'fuzy_match'; did you mean 'fuzzy_match'\?"):
        compare_run("npu", "bench", "out", fuzy_match=True)
    with pytest.raises(ConfigError, match="did you mean 'processes'"):
        compare_run("npu", "bench", "out", proceses=2)


def test_compare_refuses_a_misspelt_keyword(tmp_path):
    param = {"npu_json_path": str(tmp_path / "a.json"), "bench_json_path": str(tmp_path / "b.json")}
    with pytest.raises(ConfigError, match="'replay'"):
        compare(param, str(tmp_path / "o"), relpay=False)
    with pytest.raises(ConfigError, match="not both"):
        compare(param, str(tmp_path / "o"), stack_mode=True, options=CompareOptions())


def test_the_command_line_builds_one_object():
    import argparse

    from probe.compare import cli
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--npu", "a", "--bench", "b", "-f", "--align", "off", "--no-replay", "--no-html", "-s"])
    assert cli.options_of(args) == CompareOptions(Matching(True, False), Analysis(True, False), Output(True, False))
