"""Compare-engine speed, printed side by side with msprobe when it is installed.

    python bench/compare.py [--msprobe /opt/msvenv/bin/msprobe] [--skip-100k] [--skip-tensor]
                            [--pair DIR] [--pair-only] [--repeat K]

1. the fixtures' mix-level statistics pair (tiny_model, step0 vs step1), end to end in a
   fresh process (target 0.5 s; msprobe ~3.2 s);
2. a synthetic 100k-entry statistics pair (target < 15 s, < 1 GB peak memory, all its processes),
   and its HTML page (target < 40 MB, interactive < 5 s in headless Chromium when
   chromium, chromium-driver and selenium are installed);
3. a synthetic 100k-entry pair of transformer-like layers where the NPU side makes one
   extra API call a third of the way in (sequence shift): the alignment alone (target: a
   few seconds) and the whole compare with diagnosis, end to end;
4. tensor mode on synthetic .npy dumps (target >= 200 MB/s of tensor data);
   ``--pair DIR`` times, in the same way, a pair written elsewhere: the common yardstick
   ``python ../shared/bench/synth_dump.py 100000 DIR`` (dump.json files found under DIR's
   ``npu`` and ``bench`` folders); ``--pair-only`` times that pair alone; each 100k pair's
   compare is also given in CPU seconds (threads included) against the parse's, the
   ratio its wall time tends to as the machine's load grows;
5. ``probe --help`` (target < 0.3 s);
6. a whole run (``--run-only`` for this case alone): a synthetic tree of 16 ranks x 4 steps
   of 20k-entry statistics dumps (``--run-ranks/--run-steps/--run-entries`` to scale), one
   fault at one step/rank; wall time with 1 local worker process, with one per core, and
   on a 2-worker Dask LocalCluster; peak memory of the whole process tree; per-pair time.
"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "fixtures", "msprobe")
LOCAL = os.path.join(ROOT, "tests", "fixtures", "msprobe")


MSPROBE_MIX_REFERENCE_S = 3.2     # msprobe's mix pair where the compare targets were set


def _tree(pid: int) -> list:
    """pid and all its descendants (Linux /proc)."""
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                for child in fh.read().split():
                    out += _tree(int(child))
    except OSError:
        pass
    return out


def _pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def timed(cmd, env=None, capture=False, cwd=None, sample=True):
    """Wall time and peak memory (MB) of a child process and its helper processes.

    Memory is the peak over 0.1 s samples of the summed PSS of the process tree (pages
    shared copy-on-write counted once): a single process's max RSS misses what helper
    processes hold.  Where /proc has no smaps_rollup, the child's own max RSS instead.
    The sampling costs the child time: a read of smaps_rollup walks its page tables (~10 ms
    a read of a 500 MB compare, on a core the child would use, its memory map locked
    meanwhile), so ``sample=False`` times a run alone (peak None).
    """
    import resource
    import threading
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=cwd or ROOT, env=env)
    peak = [0.0]

    def watch():
        while proc.poll() is None:
            peak[0] = max(peak[0], sum(_pss_mb(p) for p in _tree(proc.pid)))
            time.sleep(0.1)

    sampler = threading.Thread(target=watch, daemon=True) if sample else None
    if sampler is not None:
        sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    if sampler is not None:
        sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err[-1500:]}")
    if not sample:
        peak[0] = None
    elif not peak[0]:
        peak[0] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if capture:
        return wall, peak[0], out
    return wall, peak[0]


def probe_compare(npu, bench, out, tree=None, sample=True):
    """(wall, peak, CPU): CPU is the process's user + system seconds, its threads' included
    (what a loaded machine has to find for it, where the wall time is what a quiet one
    gives). ``tree``: another checkout of probe (``--before``) run instead of this one."""
    import resource
    env = None if tree is None else {**os.environ, "PYTHONPATH": tree}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, peak = timed([sys.executable, "-m", "probe", "compare", "--npu", npu, "--bench", bench, "-o", out],
                       env=env, cwd=tree, sample=sample)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, peak, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


_ORJSON_PARSE = """
import sys, time, orjson
t, c = time.perf_counter(), time.process_time()
docs = [orjson.loads(open(p, "rb").read()) for p in sys.argv[1:]]
print(time.perf_counter() - t, time.process_time() - c)
"""


def orjson_parse_s(*paths) -> tuple[float, float]:
    """Seconds orjson takes to parse ``paths`` into dicts in a fresh process, as a plain
    script does it (the garbage collector on): the yardstick of issue #35's target; and the
    CPU seconds of that parse (one thread: about the same on a quiet machine)."""
    wall, cpu = timed([sys.executable, "-c", _ORJSON_PARSE, *paths], capture=True, sample=False)[2].split()
    return float(wall), float(cpu)


def checkout(rev: str, tmp: str) -> str:
    """A copy of the tree at ``rev`` (git archive: no worktree, nothing else touched), its
    C extensions built as this tree's are (without them its workbook took twice as long:
    not the code's time)."""
    dest = os.path.join(tmp, "before")
    os.makedirs(dest)
    data = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=data, check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest,
                   capture_output=True)      # optional, as in an install: Python paths where it fails
    compiled(dest)
    return dest


def compiled(tree: str) -> None:
    """The bytecode of ``tree``'s package written, as ``pip install`` writes it: where
    PYTHONDONTWRITEBYTECODE is set (this machine's environment sets it) each timed run
    would compile every module it imports again, ~0.15 s of the 100k-entry compare's
    ~7 s that an installed probe does not pay."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "probe")],
                   check=True, capture_output=True)


_STAMP = re.compile(rb"20\d{12}")     # output_stem's timestamp, in file names and in the page


def _outputs(folder: str) -> dict:
    """A compare's files, timestamps and the folder's own path taken out; a workbook by
    its zip entries (the zip's own dates are the time it was written)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        name = _STAMP.sub(b"T", os.path.basename(path).encode()).decode()
        if path.endswith(".xlsx"):
            with zipfile.ZipFile(path) as z:
                out[name] = {n: _STAMP.sub(b"T", z.read(n)) for n in z.namelist()}
        else:
            with open(path, "rb") as fh:
                out[name] = _STAMP.sub(b"T", fh.read().replace(folder.encode(), b"OUT"))
    return out


def same_outputs(a: str, b: str) -> str:
    """'identical', or which of two compares' files differ."""
    fa, fb = _outputs(a), _outputs(b)
    differ = sorted(n for n in set(fa) | set(fb) if fa.get(n) != fb.get(n))
    return "identical" if not differ else "DIFFER: " + ", ".join(differ)


def msprobe_compare(msprobe, npu, bench, out, tmp):
    cfg = os.path.join(tmp, "ms_compare.json")
    with open(cfg, "w") as fh:
        json.dump({"npu_path": npu, "bench_path": bench, "is_print_compare_log": False}, fh)
    try:                                            # 26.x
        return timed([msprobe, "compare", "-tp", npu, "-gp", bench, "-o", out])
    except SystemExit:                              # 8.x
        return timed([msprobe, "-f", "pytorch", "compare", "-i", cfg, "-o", out])


def row(label, ours, theirs=None, target=""):
    t = f"{theirs[0]:8.2f} s {theirs[1]:7.0f} MB" if theirs else "       -            -"
    print(f"{label:<44} {ours[0]:8.2f} s {ours[1]:7.0f} MB   {t}   {target}")


def synth_stats(path, n_entries, seed):
    """A statistics dump.json of ``n_entries`` API calls, 2 inputs + 1 output each."""
    rng = np.random.default_rng(seed)
    vals = rng.standard_normal((n_entries, 3, 4))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write('{"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {')
        for i in range(n_entries):
            t = [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [64, 128],
                  "Max": abs(v[0]) + 1, "Min": -abs(v[1]) - 1, "Mean": v[2] * 0.01, "Norm": abs(v[3]) + 50,
                  "requires_grad": True} for v in vals[i]]
            entry = {"input_args": t[:2], "input_kwargs": {}, "output": t[2:]}
            fh.write(("," if i else "") + json.dumps(f"Functional.linear.{i}.forward") + ":" + json.dumps(entry))
        fh.write("}}")


_LAYER = [("Functional.layer_norm", [[4, 512, 1024], [1024], [1024]], [[4, 512, 1024]]),
          ("Functional.linear", [[4, 512, 1024], [3072, 1024], [3072]], [[4, 512, 3072]]),
          ("Tensor.chunk", [[4, 512, 3072]], [[4, 512, 1024]] * 3),
          ("Tensor.view", [[4, 512, 1024]], [[4, 512, 16, 64]]),
          ("Tensor.transpose", [[4, 512, 16, 64]], [[4, 16, 512, 64]]),
          ("Torch.matmul", [[4, 16, 512, 64], [4, 16, 64, 512]], [[4, 16, 512, 512]]),
          ("Tensor.__truediv__", [[4, 16, 512, 512]], [[4, 16, 512, 512]]),
          ("Functional.softmax", [[4, 16, 512, 512]], [[4, 16, 512, 512]]),
          ("Torch.matmul", [[4, 16, 512, 512], [4, 16, 512, 64]], [[4, 16, 512, 64]]),
          ("Tensor.reshape", [[4, 512, 16, 64]], [[4, 512, 1024]]),
          ("Functional.linear", [[4, 512, 1024], [1024, 1024], [1024]], [[4, 512, 1024]]),
          ("Tensor.__add__", [[4, 512, 1024], [4, 512, 1024]], [[4, 512, 1024]]),
          ("Functional.layer_norm", [[4, 512, 1024], [1024], [1024]], [[4, 512, 1024]]),
          ("Functional.linear", [[4, 512, 1024], [4096, 1024], [4096]], [[4, 512, 4096]]),
          ("Functional.gelu", [[4, 512, 4096]], [[4, 512, 4096]]),
          ("Functional.linear", [[4, 512, 4096], [1024, 4096], [1024]], [[4, 512, 1024]]),
          ("Tensor.__add__", [[4, 512, 1024], [4, 512, 1024]], [[4, 512, 1024]])]


def synth_layers(path, n_entries, seed, insert_at=None):
    """Statistics dump of repeated transformer layers; ``insert_at``: one extra
    ``Tensor.__add__`` (same signature as the residual adds) before that call."""
    rng = np.random.default_rng(0)
    noise = np.random.default_rng(seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    counters = {}

    def summ(shape):
        v = rng.standard_normal(4) * [1, 1, 0.01, 1] + [3, -3, 0, 100]
        v = v * (1 + noise.standard_normal(4) * 1e-6)
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": v[0],
                "Min": v[1], "Mean": v[2], "Norm": v[3], "requires_grad": True}
    with open(path, "w") as fh:
        fh.write('{"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {')
        k = 0
        for i in range(n_entries):
            j = i - 1 if insert_at is not None and i > insert_at else i   # the bench's index
            api, ins, outs = _LAYER[j % len(_LAYER)]
            if i == insert_at:
                api, ins, outs = "Tensor.__add__", _LAYER[-1][1], _LAYER[-1][2]
                extra = np.random.default_rng(99)
                rng, saved = extra, rng
            n = counters.get(api, 0)
            counters[api] = n + 1
            entry = {"input_args": [summ(s) for s in ins], "input_kwargs": {}, "output": [summ(s) for s in outs]}
            if i == insert_at:
                rng = saved
            fh.write(("," if k else "") + json.dumps(f"{api}.{n}.forward") + ":" + json.dumps(entry))
            k += 1
        fh.write("}}")


def align_only(npu, bench):
    """Seconds to read + flatten both sides, and to align their calls."""
    sys.path.insert(0, ROOT)
    from probe.compare.align import align_calls, build_calls
    from probe.compare.engine import read_side
    t = time.perf_counter()
    a, b = read_side(npu), read_side(bench)
    t_read = time.perf_counter() - t
    t = time.perf_counter()
    A, B = build_calls(a.rows), build_calls(b.rows)
    ops = align_calls(A, B)
    t_align = time.perf_counter() - t
    unpaired = [op for op in ops if op[0] != "pair"]
    return t_read, t_align, len(A), len(B), unpaired


def synth_tensor(root, n, numel, seed, noise):
    rng = np.random.default_rng(seed)
    rank = os.path.join(root, "step0", "rank")
    data_dir = os.path.join(rank, "dump_tensor_data")
    os.makedirs(data_dir, exist_ok=True)
    data = {}
    base = np.random.default_rng(0)
    for i in range(n):
        x = base.standard_normal(numel).astype(np.float32)
        if noise:
            x = x + (rng.standard_normal(numel) * noise).astype(np.float32)
        name = f"Functional.linear.{i}.forward.output.0.npy"
        np.save(os.path.join(data_dir, name), x)
        data[f"Functional.linear.{i}.forward"] = {"input_args": [], "input_kwargs": {}, "output": [{
            "type": "torch.Tensor", "dtype": "torch.float32", "shape": [numel],
            "Max": float(x.max()), "Min": float(x.min()), "Mean": float(x.mean()),
            "Norm": float(np.linalg.norm(x)), "requires_grad": False, "data_name": name}]}
    with open(os.path.join(rank, "dump.json"), "w") as fh:
        json.dump({"task": "tensor", "level": "L1", "framework": "pytorch", "data": data}, fh)
    return os.path.join(rank, "dump.json"), sum(os.path.getsize(p) for p in glob.glob(data_dir + "/*"))


def synth_run(root, ranks, steps, n_entries, fault=None, every=1000):
    """A run's two dump trees, ``root/{npu,bench}/step{s}/rank{r}/dump.json``, written fast:
    one bench dump (a ``Distributed.all_reduce`` every ``every`` calls) hard-linked into
    every place on both sides, and one NPU dump with entry ``fault[2]``'s output scaled
    by 1.01 at step ``fault[0]``, rank ``fault[1]`` (default: step 1, rank 5, 60% in). Returns (npu root, bench root, MB a dump)."""
    fault = fault or (min(1, steps - 1), min(5, ranks - 1), int(n_entries * 0.6))
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    vals = rng.standard_normal((n_entries, 3, 4))
    src = {}
    for name, scale_at in (("clean", None), ("fault", fault[2])):
        path = os.path.join(root, f"{name}.json")
        counters = {}
        with open(path, "w") as fh:
            fh.write('{"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {')
            for i in range(n_entries):
                api = "Distributed.all_reduce" if i % every == every - 1 else "Functional.linear"
                k = counters[api] = counters.get(api, -1) + 1
                t = [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [64, 128],
                      "Max": abs(v[0]) + 1, "Min": -abs(v[1]) - 1, "Mean": v[2] * 0.01,
                      "Norm": abs(v[3]) + 50, "requires_grad": True} for v in vals[i]]
                if i == scale_at:
                    t[2] = {**t[2], **{s: t[2][s] * 1.01 for s in ("Max", "Min", "Mean", "Norm")}}
                entry = {"input_args": t[:2], "input_kwargs": {}, "output": t[2:]}
                fh.write(("," if i else "") + json.dumps(f"{api}.{k}.forward") + ":" + json.dumps(entry))
            fh.write("}}")
        src[name] = path
    for side in ("npu", "bench"):
        for s in range(steps):
            for r in range(ranks):
                d = os.path.join(root, side, f"step{s}", f"rank{r}")
                os.makedirs(d)
                bad = side == "npu" and (s, r) == fault[:2]
                os.link(src["fault" if bad else "clean"], os.path.join(d, "dump.json"))
    return os.path.join(root, "npu"), os.path.join(root, "bench"), os.path.getsize(src["clean"]) / 1e6


_RUN_DRIVER = """
import json, sys, time
from probe.compare import compare_run
npu, bench, out, how = sys.argv[1:5]
kw, cluster = {}, None
if how == "dask":
    from distributed import LocalCluster
    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None)
    kw["scheduler"] = cluster.scheduler_address
else:
    kw["processes"] = int(how)
t = time.perf_counter()
run = compare_run(npu, bench, out, **kw)
wall = time.perf_counter() - t
fd = run.summary["first_divergence"] or {}
print(json.dumps({"compare_s": wall, "pair_s": [o.seconds for o in run.outcomes],
                  "first": [fd.get("name"), fd.get("step"), fd.get("rank")]}))
if cluster is not None:
    cluster.close()
"""


def whole_run(tmp, ranks, steps, entries):
    npu, bench, mb = synth_run(os.path.join(tmp, "run"), ranks, steps, entries)
    n = ranks * steps
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"whole run: {ranks} ranks x {steps} steps = {n} pairs of {entries // 1000}k-entry "
          f"statistics dumps ({mb:.0f} MB each), {cores} cores")
    base = None
    for how, label in (("1", "1 local process"), (str(cores), f"{cores} local processes (one per core)"),
                       ("dask", "Dask LocalCluster, 2 workers")):
        if how == "dask":
            try:
                import distributed  # noqa: F401
            except ImportError:
                print(f"{'  ' + label:<44} skipped: pip install 'probe[dask]'")
                continue
        out = os.path.join(tmp, f"run_out_{how}")
        wall, peak, text = timed([sys.executable, "-c", _RUN_DRIVER, npu, bench, out, how], capture=True)
        res = json.loads(text.strip().splitlines()[-1])
        per = sorted(res["pair_s"])
        base = base or res["compare_s"]
        print(f"{'  ' + label:<44} {res['compare_s']:8.2f} s {peak:7.0f} MB   "
              f"per pair {per[len(per) // 2]:.2f} s (median), {n / res['compare_s']:.2f} pairs/s, "
              f"x{base / res['compare_s']:.2f} vs 1 process; process {wall:.1f} s; first {res['first']}")
        shutil.rmtree(out, ignore_errors=True)


def page_ready_s(html: str):
    """Seconds until the page in headless Chromium has parsed its data and drawn (its
    ``data-ready`` flag), or None without chromium / chromium-driver / selenium."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not chromium or not driver:
        return None
    opts = Options()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        d.get("about:blank")
        t = time.perf_counter()
        d.get("file://" + os.path.abspath(html))     # returns after the load event
        while d.execute_script("return document.body.dataset.ready") != "1":
            time.sleep(0.02)
        return time.perf_counter() - t
    finally:
        d.quit()


def time_pair(label, a, b, tmp, before=None, before_label=None, repeat=2):
    """``probe compare`` of dump.json files ``a`` and ``b`` end to end (best wall of
    ``repeat`` runs, timed alone, and the peak of one more run, sampled), against orjson
    parsing the same two files in a fresh process (best of ``repeat``); with ``before``,
    that checkout's compare in the same run.  Returns this tree's first output folder and
    its (wall, peak)."""
    mb = (os.path.getsize(a) + os.path.getsize(b)) / 1e6
    # several times: on a shared machine one run can take half as long again as the
    # other; the best shows the code, the spread shows the machine (as timeit reports),
    # and each round's compare over that round's parse shows the ratio as the machine moves
    trees = [(f"probe {before_label}", before), ("probe", None)] if before is not None else [("probe", None)]
    outs = [os.path.join(tmp, f"o_{abs(hash((label, name)))}") for name, _ in trees]
    # the runs alternate (parse, before, this, parse, before, this): the machine's speed
    # drifts over minutes, and a parse timed apart from the compares moved their ratio by a third
    runs_of: dict = {name: [] for name, _ in trees}      # (wall, CPU) of each run
    parses, parse_cpus = [], []
    for k in range(repeat):
        wall, cpu = orjson_parse_s(a, b)
        parses.append(wall)
        parse_cpus.append(cpu)
        for (name, tree), out in zip(trees, outs):
            wall, _, cpu = probe_compare(a, b, f"{out}_{k}", tree, sample=False)
            runs_of[name].append((wall, cpu))
    peaks = {name: probe_compare(a, b, f"{out}_peak", tree)[1] for (name, tree), out in zip(trees, outs)}
    parse = min(parses)
    for (name, tree), out in zip(trees, outs):
        runs = [w for w, _ in runs_of[name]]
        cpus = [c for _, c in runs_of[name]]
        ours = (min(runs), peaks[name])
        row(f"{label} ({mb:.0f} MB json), {name}", ours, None, "<= 1.5x parse, <= 600 MB")
        rounds = sorted(w / p for w, p in zip(runs, parses))
        print(f"{f'  -> the {repeat} runs':<44} " + ", ".join(f"{w:.2f} s" for w in runs)
              + f"; x{ours[0] / parse:.2f} the orjson parse (best over best); each round's over its "
              f"parse: x{rounds[0]:.2f}-{rounds[-1]:.2f}, median x{statistics.median(rounds):.2f}")
        # what a loaded machine has to find: the ratio the wall time tends to as load grows
        print(f"{'  -> CPU (user + system, threads included)':<44} {min(cpus):8.2f} s (best; "
              f"{', '.join(f'{c:.2f}' for c in cpus)}): x{min(cpus) / min(parse_cpus):.2f} the parse's")
    print(f"{'  -> orjson parses the two files into dicts':<44} {parse:8.2f} s (best of {repeat}, "
          f"fresh process: {', '.join(f'{p:.2f}' for p in parses)}; CPU best {min(parse_cpus):.2f} s)   "
          f"target: the compare <= {1.5 * parse:.2f} s")
    print(f"{'  -> peak memory':<44} of one more run a tree, its PSS sampled every 0.1 s "
          "(the timed runs are not sampled: a sample costs the compare ~10 ms)")
    if before is not None:
        print(f"{'  -> outputs of the two trees':<44} {same_outputs(outs[0] + '_0', outs[1] + '_0')}")
    return outs[-1] + "_0", ours


def pair_files(folder):
    """The npu and bench dump.json under ``folder`` (synth_dump.py's layout)."""
    found = []
    for side in ("npu", "bench"):
        paths = sorted(glob.glob(os.path.join(folder, side, "**", "dump.json"), recursive=True))
        if len(paths) != 1:
            raise SystemExit(f"--pair {folder}: expected one dump.json under {side}/, found {len(paths)}")
        found.append(paths[0])
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--msprobe", default=shutil.which("msprobe") or
                    ("/opt/msvenv/bin/msprobe" if os.path.exists("/opt/msvenv/bin/msprobe") else None))
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--before", metavar="REV", help="also time the 100k-entry pair with probe "
                    "as of this git revision (e.g. HEAD~3), in the same run")
    ap.add_argument("--skip-100k", action="store_true")
    ap.add_argument("--skip-tensor", action="store_true")
    ap.add_argument("--skip-run", action="store_true", help="skip the whole-run case")
    ap.add_argument("--run-only", action="store_true", help="only the whole-run case")
    ap.add_argument("--run-ranks", type=int, default=16)
    ap.add_argument("--run-steps", type=int, default=4)
    ap.add_argument("--run-entries", type=int, default=20_000)
    ap.add_argument("--pair", metavar="DIR", help="also time the pair written by "
                    "'python ../shared/bench/synth_dump.py 100000 DIR' (the common yardstick)")
    ap.add_argument("--pair-only", action="store_true", help="only the --pair case")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each 100k-entry pair and of its "
                    "parse, alternating (the best of each is printed)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be 1 or more, got {args.repeat}")
    compiled(ROOT)
    tmp = tempfile.mkdtemp(prefix="probe_bench_")
    if args.pair_only:
        if not args.pair:
            raise SystemExit("--pair-only needs --pair DIR")
        try:
            before = checkout(args.before, tmp) if args.before else None
            time_pair("shared synth_dump pair", *pair_files(args.pair), tmp, before, args.before, args.repeat)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if args.run_only:
        try:
            whole_run(tmp, args.run_ranks, args.run_steps, args.run_entries)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    print(f"{'case':<44} {'probe':>20}   {'msprobe':>20}   target")
    try:
        # 1. the mix-level statistics pair of the fixtures
        if os.path.isdir(os.path.join(SHARED, "v833_mix_statistics_fp32")):
            npu = os.path.join(SHARED, "v833_mix_statistics_fp32", "step1", "rank", "dump.json")
            bench = os.path.join(SHARED, "v833_mix_statistics_fp32", "step0", "rank", "dump.json")
        else:
            npu = glob.glob(os.path.join(LOCAL, "v26_mix_tensor_fp32", "step0", "*", "dump.json"))[0]
            bench = glob.glob(os.path.join(LOCAL, "v26_mix_statistics_fp32", "step0", "*", "dump.json"))[0]
        ours = probe_compare(npu, bench, os.path.join(tmp, "o1"))
        theirs = msprobe_compare(args.msprobe, npu, bench, os.path.join(tmp, "m1"), tmp) if args.msprobe else None
        row("mix statistics pair, end to end", ours, theirs, "0.5 s")

        # 2. synthetic 100k-entry statistics pair
        if not args.skip_100k:
            a = os.path.join(tmp, "s_npu", "dump.json")
            b = os.path.join(tmp, "s_bench", "dump.json")
            synth_stats(a, args.entries, 1)
            synth_stats(b, args.entries, 2)
            before = checkout(args.before, tmp) if args.before else None
            out, ours = time_pair(f"{args.entries // 1000}k stats pair", a, b, tmp, before, args.before, args.repeat)
            if args.pair:
                time_pair("shared synth_dump pair", *pair_files(args.pair), tmp, before, args.before, args.repeat)
            page = glob.glob(os.path.join(out, "compare_report_*.html"))
            if page:
                ready = page_ready_s(page[0])
                print(f"{'  -> its HTML page':<44} {os.path.getsize(page[0]) / 1e6:8.1f} MB, "
                      + (f"interactive in {ready:.2f} s (headless Chromium)" if ready is not None
                         else "no chromium/selenium: load time not measured")
                      + "   target < 40 MB, < 5 s")
            if theirs:
                # the targets were set where msprobe took 3.2 s for the mix pair; this box's
                # speed drifts by half, so also the best run at that reference speed
                scaled = ours[0] * MSPROBE_MIX_REFERENCE_S / theirs[0]
                print(f"{'  -> at the reference speed':<44} {scaled:8.2f} s   (msprobe's mix pair took "
                      f"{theirs[0]:.2f} s here, {MSPROBE_MIX_REFERENCE_S} s where the targets were set)")

        # 3. 100k-entry pair with a sequence shift: alignment
        if not args.skip_100k:
            a = os.path.join(tmp, "l_npu", "dump.json")
            b = os.path.join(tmp, "l_bench", "dump.json")
            # the NPU makes one extra call a third of the way in: same inputs, one more entry
            synth_layers(a, args.entries + 1, 1, insert_at=args.entries // 3)
            synth_layers(b, args.entries, 2)
            t_read, t_align, na, nb, unpaired = align_only(a, b)
            print(f"{'shifted pair: read + flatten (in process)':<44} {t_read:8.2f} s")
            print(f"{f'shifted pair: align {na} vs {nb} calls':<44} {t_align:8.2f} s"
                  f"{'':18}few s   unpaired: {unpaired[:3]}")
            ours = probe_compare(a, b, os.path.join(tmp, "o4"))
            row("shifted 100k pair, compare + diagnosis", ours, None, "< 20 s")

        # 4. tensor mode throughput
        if not args.skip_tensor:
            a, size_a = synth_tensor(os.path.join(tmp, "t_npu"), 24, 2_000_000, 1, 1e-4)
            b, size_b = synth_tensor(os.path.join(tmp, "t_bench"), 24, 2_000_000, 2, 0)
            ours = probe_compare(a, b, os.path.join(tmp, "o3"))
            total = (size_a + size_b) / 1e6
            row(f"tensor mode, {total:.0f} MB of .npy", ours, None, ">= 200 MB/s")
            print(f"{'  -> throughput':<44} {total / ours[0]:8.0f} MB/s (end to end, incl. start-up)")

        # 5. CLI start-up
        best = min(timed([sys.executable, "-m", "probe", "--help"])[0] for _ in range(3))
        print(f"{'probe --help':<44} {best:8.3f} s{'':34}< 0.3 s")

        # 6. a whole run
        if not args.skip_run:
            whole_run(tmp, args.run_ranks, args.run_steps, args.run_entries)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
