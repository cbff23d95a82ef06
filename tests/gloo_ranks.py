"""Several ranks of a training script on gloo over 127.0.0.1, each its own process: what
the tests of parallel runs (DDP, FSDP2, tensor parallel) share."""
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port() -> int:
    """A TCP port nothing listens on now (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env() -> dict:
    """The ranks' environment: this tree's probe first, one intra-op thread each."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")


def run_ranks(script: str, out, world: int, args, timeout: float, what: str):
    """``tests/{script} OUT PORT RANK WORLD *args`` for each rank; (return codes, outputs).
    A rank that has not finished after ``timeout`` seconds fails the test (a hang)."""
    os.makedirs(out, exist_ok=True)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, script), str(out), port, str(r), str(world),
                               *args], env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for r in range(world)]
    try:
        said = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{what} did not finish in {timeout} s")
    return [p.returncode for p in procs], said
