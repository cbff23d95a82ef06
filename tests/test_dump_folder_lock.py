"""A dump folder is owned by one run (issue #45, point 5).

Two processes dumping into the same dump_path and rank at once mixed their files: dump.json
from one, tensor files from both. The second is refused with one line; a killed owner's
lock does not block the next run; a run into a used path says it replaces the old dump.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from conftest import HERE, load_dump
from gloo_ranks import rank_env
from models import make_gpt, train_step

from probe.dump.folder_lock import lock_path

pytestmark = pytest.mark.slow   # two processes on one folder: minutes on a busy machine

CHILD = textwrap.dedent("""
    import os, sys, time
    import torch
    sys.path.insert(0, {here!r})
    from probe import ConfigError, PrecisionDebugger
    from models import make_gpt, train_step
    dump_path, seed, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model, x, y = make_gpt(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=dump_path, task="tensor")
    try:
        dbg.start()
    except ConfigError as exc:
        print(f"REFUSED {{exc}}", flush=True)
        sys.exit(3)
    train_step(model, opt, x, y)          # half the step's calls, then wait mid-step
    open(os.path.join(flags, f"ready{{seed}}"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(flags, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    train_step(model, opt, x, y)
    dbg.stop(); dbg.step(); dbg.close()
    print("DONE", flush=True)
""")


def _start(script, dump_dir, seed, flags):
    return subprocess.Popen([sys.executable, str(script), dump_dir, str(seed), str(flags)], env=rank_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _tensor_descs(value):
    if isinstance(value, dict):
        if value.get("data_name"):
            yield value
        for v in value.values():
            yield from _tensor_descs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tensor_descs(v)


def _disagreeing(dump_dir):
    """(tensor files whose values disagree with dump.json's statistics, files checked)."""
    rank_dir = os.path.join(dump_dir, "step0", "rank")
    data = load_dump(dump_dir)
    bad, n = [], 0
    for desc in _tensor_descs(data):
        arr = np.load(os.path.join(rank_dir, "dump_tensor_data", desc["data_name"])).astype(np.float64)
        if arr.size == 0 or desc.get("Max") is None:
            continue
        n += 1
        got = (arr.max(), arr.min(), arr.mean(), np.sqrt((arr * arr).sum()))
        want = (desc["Max"], desc["Min"], desc["Mean"], desc["Norm"])
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            bad.append(desc["data_name"])
    return bad, n


def test_second_process_on_the_same_folder_is_refused(dump_dir, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(here=HERE))
    flags = tmp_path / "flags"
    flags.mkdir()
    first = _start(script, dump_dir, 0, flags)
    second = None
    try:
        assert _wait_for(flags / "ready0", first), first.communicate(timeout=60)[0]
        second = _start(script, dump_dir, 1, flags)
        _wait_for(flags / "ready1", second)       # the old code: the second dumps along
        (flags / "go").touch()
        said_second = second.communicate(timeout=300)[0]
        said_first = first.communicate(timeout=300)[0]
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
    assert first.returncode == 0 and "DONE" in said_first, said_first
    assert second.returncode == 3, said_second
    refusal = [line for line in said_second.splitlines() if line.startswith("REFUSED")]
    assert len(refusal) == 1 and "Traceback" not in said_second, said_second
    assert "dump_path" in refusal[0] and dump_dir in refusal[0] and f"pid {first.pid}" in refusal[0], refusal[0]
    bad, checked = _disagreeing(dump_dir)
    assert checked > 50 and bad == [], bad
    assert not os.path.exists(lock_path(dump_dir, "rank"))    # removed at close()

    # A killed owner leaves no lock behind: the kernel drops it with the process.
    os.mkdir(flags / "k")
    killed = _start(script, dump_dir, 2, flags / "k")
    try:
        assert _wait_for(flags / "k" / "ready2", killed), killed.communicate(timeout=60)[0]
        assert os.path.exists(lock_path(dump_dir, "rank"))
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    from probe import PrecisionDebugger
    dbg = PrecisionDebugger(dump_path=dump_dir, task="tensor")
    model, x, y = make_gpt(seed=3)
    dbg.start()
    train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y)
    dbg.stop()
    dbg.step()
    dbg.close()
    bad, checked = _disagreeing(dump_dir)
    assert checked > 50 and bad == [], bad


def test_debuggers_in_sequence_take_the_folder_in_turn(make_debugger, dump_dir):
    """close() lets go: the next debugger of the process (msprobe's singleton replaced, or
    the monitor arming a dump) dumps into the same folder."""
    x = torch.randn(4)
    for i in range(3):
        dbg = make_debugger(task="statistics")
        dbg.start()
        torch.exp(x)
        dbg.stop()
        dbg.step()
        if i == 1:
            dbg.close()       # closed by hand, or by the next debugger's construction
    assert list(load_dump(dump_dir, 0)) == ["Torch.exp.0.forward"]


def test_run_into_a_used_path_says_it_replaces_the_old_dump(make_debugger, dump_dir, caplog):
    model, x, y = make_gpt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = make_debugger(task="statistics")
    for _ in range(3):
        first.start()
        train_step(model, opt, x, y)
        first.stop()
        first.step()
    first.close()
    with caplog.at_level(logging.WARNING, logger="probe"):
        second = make_debugger(task="statistics", step=[0, 1])
        for _ in range(3):
            second.start()
            train_step(model, opt, x, y)
            second.stop()
            second.step()
        second.close()
    said = [r.getMessage() for r in caplog.records if "earlier dump" in r.getMessage()]
    assert len(said) == 1, caplog.text        # one line, though two step folders were replaced
    assert dump_dir in said[0] and "replaces" in said[0] and "step0" in said[0], said[0]
    with open(os.path.join(dump_dir, "step2", "rank", "dump.json"), encoding="utf-8") as f:
        assert json.load(f)["data"]            # the step the second run did not dump stays
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="probe"):
        fresh = make_debugger(task="statistics", dump_path=os.path.join(dump_dir, "fresh"))
        fresh.start()
        train_step(model, opt, x, y)
        fresh.stop()
        fresh.step()
        fresh.close()
    assert not [r for r in caplog.records if "earlier dump" in r.getMessage()]


@pytest.mark.skipif(sys.platform == "win32", reason="no flock on Windows: no lock (docs/dumping.md)")
def test_ranks_lock_their_own_files(dump_dir):
    """Each rank of a job has its own lock file: rank0's holder does not block rank1."""
    from probe.dump.folder_lock import FolderLock
    from probe.errors import ConfigError
    r0 = FolderLock(dump_dir, "rank0", "cfg")
    r1 = FolderLock(dump_dir, "rank1", "cfg")
    r0.acquire()
    r1.acquire()
    again = FolderLock(dump_dir, "rank0", "cfg")
    with pytest.raises(ConfigError) as info:    # flock: another open file is refused, even in one process
        again.acquire()
    assert "\n" not in str(info.value) and "rank0" in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    r0.release()
    again.acquire()
    again.release()
    r1.release()
    assert sorted(os.listdir(dump_dir)) == []
