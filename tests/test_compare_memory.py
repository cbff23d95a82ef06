"""A tensor compare's memory stays within 2x its tensors plus a constant (issue #45, point 6).

The float64 measures of a call's re-run (``local_error._measure``) made whole-tensor
float64 copies, masks and products: one 1 GiB tensor pair peaked at 14.4 GB RSS. They are
summed a chunk at a time now; what remains is the re-run itself (the call's inputs and
output in float64). Each side here is one GELU call whose input and output are 200 MB
float32 tensors (one NaN, at the same place on both sides), the NPU's output off by 0.1%
(a faulty kernel), so the compare re-runs it. The peak is read in a fresh process (``ru_maxrss``), from just before the compare.
"""
import glob
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import HERE
from gloo_ranks import rank_env

import probe.compare.local_error as local_error_mod

pytestmark = pytest.mark.slow   # two processes over 200 MB tensors: about 2 minutes

N = 50_000_000          # float32 elements: 200 MB a tensor
SLACK_MB = 300          # the constant: numpy/torch buffers, the report, the allocator's slack

DUMP = textwrap.dedent("""
    import sys
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, {here!r})
    from probe import PrecisionDebugger
    from real_runs import KernelFault
    root, n, faulty = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    x[12345] = float("nan")      # NaN at the same place on both sides: the compare's NaN-aware paths
    dbg = PrecisionDebugger(dump_path=root, task="tensor")
    fault = KernelFault("gelu.default", 0, 0, "scale", 1.001)
    fault.new_step(0)
    dbg.start()
    if faulty:
        with fault:
            F.gelu(x)
        assert fault.applied
    else:
        F.gelu(x)
    dbg.stop(); dbg.step(); dbg.close()
""")

COMPARE = textwrap.dedent("""
    import json, resource, sys
    import numpy, torch
    from probe.compare import compare
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    paths = compare({"npu_json_path": sys.argv[1], "bench_json_path": sys.argv[2],
                     "is_print_compare_log": False}, sys.argv[3])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kb": before, "after_kb": after, "paths": paths}))
""")


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
def test_tensor_compare_peak_is_within_twice_its_tensors(tmp_path):
    dump_script, compare_script = tmp_path / "dump.py", tmp_path / "compare.py"
    dump_script.write_text(DUMP.format(here=HERE))
    compare_script.write_text(COMPARE)
    for side, faulty in (("npu", "1"), ("bench", "0")):
        proc = subprocess.run([sys.executable, str(dump_script), str(tmp_path / side), str(N), faulty],
                              env=rank_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
    npu, bench = (os.path.join(str(tmp_path / side), "step0", "rank", "dump.json") for side in ("npu", "bench"))
    files = glob.glob(os.path.join(str(tmp_path), "*", "step0", "rank", "dump_tensor_data", "*.npy"))
    assert len(files) == 4
    tensors_mb = sum(os.path.getsize(f) for f in files) / 2 ** 20
    proc = subprocess.run([sys.executable, str(compare_script), npu, bench, str(tmp_path / "out")],
                          env=rank_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    peak_mb = (said["after_kb"] - said["before_kb"]) / 1024
    assert peak_mb < 2 * tensors_mb + SLACK_MB, (peak_mb, tensors_mb)
    summary = [p for p in said["paths"] if os.path.basename(p).startswith("compare_summary")]
    with open(summary[0], encoding="utf-8") as fh:
        first = json.load(fh)["first_divergence"]
    print(f"tensor compare peak {peak_mb:.0f} MB over {tensors_mb:.0f} MB of tensor files")
    assert first["name"] == "Functional.gelu.0.forward"      # the re-run still names the call


def _measure_whole(npu, golden, replay):
    """The measure as one float64 pass over whole tensors (the code before chunking)."""
    a = npu.double().reshape(-1).numpy()
    g = golden.double().reshape(-1).numpy()
    r = replay.double().reshape(-1).numpy()
    fa, fg = np.isfinite(a), np.isfinite(g)
    if not (fa.all() and fg.all()):
        if not np.array_equal(fa, fg):
            return math.inf, 0.0, 0.0, 0.0
        a, g, r = a[fa], g[fa], r[fa]
    gg = float(np.sum(g * g))
    norm = math.sqrt(gg)
    d = a - g
    local = math.sqrt(float(np.sum(d * d))) / norm
    bias = float(np.sum(d * g)) / gg
    reference, ref_bias = 0.0, 0.0
    if np.isfinite(r).all():
        dr = r - g
        reference, ref_bias = math.sqrt(float(np.sum(dr * dr))) / norm, float(np.sum(dr * g)) / gg
    g2 = g * g
    n_eff = gg * gg / max(float(np.sum(g2 * g2)), 1e-300)
    spread = max(reference, local - abs(bias)) / math.sqrt(max(min(n_eff, g.size), 1.0))
    return local, reference, bias - ref_bias, spread


@pytest.mark.parametrize("case", ["finite", "nonfinite_same", "nonfinite_npu_only", "replay_inf"])
def test_chunked_measure_gives_the_whole_tensor_numbers(monkeypatch, case):
    """Counts and NaN/Inf decisions are exact; the sums differ from one whole-tensor sum
    only in the last bits (each chunk's pairwise sum added in order): 1e-13 relative."""
    import torch
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300_007, dtype=torch.float64, generator=gen) * 3
    golden = F.gelu(x)
    npu = F.gelu(x.bfloat16()) * 1.002          # a bf16 kernel with a scale fault
    replay = F.gelu(x.bfloat16())
    if case == "nonfinite_same":
        golden[[5, 200_000]] = torch.tensor([math.nan, math.inf], dtype=torch.float64)
        npu[[5, 200_000]] = torch.tensor([math.nan, math.inf], dtype=torch.bfloat16)
    elif case == "nonfinite_npu_only":
        npu[123_456] = math.nan
    elif case == "replay_inf":
        replay[77] = math.inf
    want = _measure_whole(npu, golden, replay)
    for chunk in (1000, 65_536, 1 << 20):
        monkeypatch.setattr(local_error_mod, "MEASURE_CHUNK", chunk)
        got = local_error_mod._measure(npu, golden, replay)
        if case == "nonfinite_npu_only":
            assert got == want == (math.inf, 0.0, 0.0, 0.0)
            continue
        assert got == pytest.approx(want, rel=1e-13, abs=0.0), (chunk, got, want)
        if case == "replay_inf":
            assert got[1] == 0.0
