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
