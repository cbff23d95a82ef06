"""``probe --version`` and every command's ``--help`` work without importing torch
(issue 22, point 4): checked in a fresh interpreter through ``sys.modules``."""
import os
import subprocess
import sys

import pytest

from probe.cli import COMMANDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = """
import contextlib, io, sys
import probe.cli
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = probe.cli.main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
heavy = sorted(m for m in ("torch", "numpy", "pandas") if m in sys.modules)
print(code, heavy, repr(out.getvalue()[:200]))
"""


def _run(*argv):
    proc = subprocess.run([sys.executable, "-c", CHECK, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_imports_no_torch(command):
    out = _run(command, "--help")
    assert out.startswith("0 [] "), out
    assert f"probe {command}" in out


def test_version_and_top_help():
    from probe import __version__
    out = _run("--version")
    assert out.startswith("0 [] ") and f"probe {__version__}" in out
    assert _run("--help").startswith("0 [] ")


def test_shared_device_option_checks_its_value():
    proc = subprocess.run([sys.executable, "-m", "probe", "replay", "somewhere", "--device", "gpu"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cpu, cuda[:N] or npu[:N]" in proc.stderr


def test_a_statistics_compare_imports_no_torch(tmp_path):
    """Comparing statistics dumps (diagnosis included) needs no torch: a compare machine
    without it, and no ~2 s import before the first row."""
    import glob
    import subprocess
    import sys
    dump = glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "msprobe",
                                  "v26_mix_statistics_fp32", "step0", "*", "dump.json"))[0]
    code = ("import sys; from probe.compare import compare; "
            f"compare({{'npu_json_path': {dump!r}, 'bench_json_path': {dump!r}, 'is_print_compare_log': False}}, "
            f"{str(tmp_path)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def _fixture_dump(name="v26_mix_statistics_fp32"):
    import glob
    return glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "msprobe", name, "step0", "*", "dump.json"))[0]


def test_bare_probe_prints_the_help_and_fails(capsys):
    from probe.cli import main
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "usage: probe" in err and "compare" in err
    # the positional has its text, not a bare "command"
    assert "command     one of the commands below" in err


def test_help_texts_say_each_default_once_and_what_compare_writes(capsys):
    from probe.cli import main
    for command in ("run-ut", "compare"):
        with pytest.raises(SystemExit):
            main([command, "-h"])
        out = " ".join(capsys.readouterr().out.split())
        assert "(default .) (default .)" not in out, out
        if command == "compare":
            assert "Excel report" not in out and "HTML page" in out and "csv" in out
            assert "(default ./compare_out)" in out


def test_compare_takes_both_spellings_and_a_default_output(tmp_path, monkeypatch, capsys, caplog):
    from probe.cli import main
    dump = _fixture_dump()
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "--npu", dump, "--bench", dump, "--stack-mode", "--no-html"]) == 0
    cap = capsys.readouterr()
    written = cap.out.split()
    assert written and all(os.path.dirname(os.path.abspath(p)) == str(tmp_path / "compare_out") for p in written)
    assert f"wrote {len(written)} files to {tmp_path / 'compare_out'}" in cap.err and "default" in cap.err
    out = tmp_path / "elsewhere"
    assert main(["compare", "--npu", dump, "--bench", dump, "--output-path", str(out), "--stack_mode",
                 "--no-html"]) == 0
    assert all(os.path.dirname(p) == str(out) for p in capsys.readouterr().out.split())


def test_compare_refuses_two_ways_of_naming_the_dumps(tmp_path, capsys):
    from probe.cli import main
    dump = _fixture_dump()
    spec = tmp_path / "compare.json"
    spec.write_text('{"npu_json_path": "%s", "bench_json_path": "%s"}' % (dump, dump))
    assert main(["compare", "-i", str(spec), "--npu", dump, "--bench", dump, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(spec) in err[0] and "--npu" in err[0] and "not both" in err[0], err
    assert not (tmp_path / "o").exists()
    assert main(["compare", "--npu", dump, "-o", str(tmp_path / "o")]) == 2
    assert "--bench PATH is missing" in capsys.readouterr().err
