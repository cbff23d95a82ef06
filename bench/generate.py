"""HF ``generate`` dumped at L1 statistics (``inference: true``): the cost of a dumped step.

    python bench/generate.py [--rounds 5] [--new 16] [--batch 4] [--hidden 128] [--layers 2]
    python bench/generate.py --trees /tmp/before . [--rounds 3]    # before/after in one run


Decode steps are the worst case for a dump: each call does little work and a decoder
layer makes a few dozen calls, so the per-entry cost is nearly all of the overhead. A tiny
Llama built from a config (head_dim 32) generates greedily, batched with left padding;
plain and dumped runs take turns, each in this process after one warm-up of each. Prints
the median seconds per generate, the ratio dumped/plain per step, the entries dumped per
step and us per entry ((dumped - plain) / entries). A third run, ``list`` matching no API,
dumps zero entries: every call is still intercepted and counted, and each step still has
its folder, an empty dump.json and its token layout; its cost per step is what a dumped
step costs besides its entries. ``--trees`` runs each of two source trees in children of its
own, taking turns, and prints wall and process CPU time per tree and after/before (CPU time is
the steadier figure on a loaded machine). A measurement, not a test.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

# this tree's probe, not an installed one; ``--trees`` runs each tree's in a child of its own
sys.path.insert(0, os.environ.get("PROBE_BENCH_TREE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_llama(hidden, layers):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=hidden // 32, num_key_value_heads=max(1, hidden // 64),
                      max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def prompts(batch):
    """Left-padded prompts of different lengths (5, 8, 11, ...), as a tokenizer would pad them."""
    g = torch.Generator().manual_seed(1)
    lengths = [5 + 3 * i for i in range(batch)]
    width = max(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, 512, (n,), generator=g)
        mask[row, width - n:] = 1
    return ids, mask


def generate(model, ids, mask, new):
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)


def dumped(model, ids, mask, new, root, api_list=None):
    from probe import PrecisionDebugger
    shutil.rmtree(root, ignore_errors=True)
    if api_list is None:
        dbg = PrecisionDebugger(dump_path=root, task="statistics", level="L1", inference=True)
    else:   # ``list`` is a config file's key
        cfg = root + ".json"
        with open(cfg, "w") as f:
            json.dump({"task": "statistics", "dump_path": root, "level": "L1", "inference": True,
                       "statistics": {"list": api_list}}, f)
        dbg = PrecisionDebugger(config_path=cfg)
    t0, c0 = time.perf_counter(), time.process_time()   # from start(): the config and registry are read once a run
    dbg.start(model)
    out = generate(model, ids, mask, new)
    dbg.stop()
    dbg.close()
    CPU.append(time.process_time() - c0)
    return time.perf_counter() - t0, out


CPU: list = []   # process CPU seconds of each timed run, all threads (--trees: steadier under load than wall time)


def entries(root):
    n = steps = 0
    for step in os.listdir(root):
        for rank in os.listdir(os.path.join(root, step)):
            with open(os.path.join(root, step, rank, "dump.json"), encoding="utf-8") as f:
                n += len(json.load(f)["data"])
            steps += 1
    return n, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=16, help="new tokens per request (steps: 1 prefill + new-1 decodes)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--trees", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="two source trees: each measured in a fresh interpreter, taking turns round by round")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)   # a --trees child's one line
    args = ap.parse_args()
    if args.trees:
        return compare_trees(args)
    torch.set_num_threads(1)
    model = tiny_llama(args.hidden, args.layers)
    ids, mask = prompts(args.batch)
    root = os.path.join("/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir(), "probe-bench-generate")
    plain_out = generate(model, ids, mask, args.new)            # warm-up of each
    _, dumped_out = dumped(model, ids, mask, args.new, root)
    assert torch.equal(plain_out, dumped_out), "dumping changed the generated tokens"
    none = ["no.such.api"]
    dumped(model, ids, mask, args.new, root, none)
    plain, on, empty = [], [], []
    cpu = {"plain": [], "empty": [], "on": []}
    for _ in range(args.rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        generate(model, ids, mask, args.new)
        plain.append(time.perf_counter() - t0)
        cpu["plain"].append(time.process_time() - c0)
        empty.append(dumped(model, ids, mask, args.new, root, none)[0])
        cpu["empty"].append(CPU[-1])
        on.append(dumped(model, ids, mask, args.new, root)[0])
        cpu["on"].append(CPU[-1])
    n, steps = entries(root)
    shutil.rmtree(root, ignore_errors=True)
    if os.path.exists(root + ".json"):
        os.remove(root + ".json")
    if args.json:
        print("RESULT " + json.dumps({"plain": plain, "on": on, "empty": empty, "n": n, "steps": steps, "cpu": cpu}))
        return None
    off_s, on_s = statistics.median(plain), statistics.median(on)
    print(f"tiny Llama d{args.hidden} x{args.layers} layers, batch {args.batch}, {args.new} new tokens: {steps} steps, "
          f"{n} entries ({n / steps:.0f} a step)")
    print(f"{'plain s':>9}{'dumped s':>10}{'ratio':>7}{'us/entry':>10}")
    print(f"{off_s:>9.3f}{on_s:>10.3f}{on_s / off_s:>7.2f}{(on_s - off_s) / n * 1e6:>10.1f}")
    zero = statistics.median(empty)
    print(f"zero entries (list matching no API): {zero:.3f} s, x{zero / off_s:.2f}, "
          f"{(zero - off_s) / steps * 1e3:.2f} ms a step besides its entries")



def compare_trees(args):
    """bench/ab.py's way for this script: one child per (round, tree), three rounds of
    generate's each (their medians), the trees' order swapped every round so that the machine's drift
    hits both alike; medians per tree, and after/before."""
    import subprocess
    results = {tree: [] for tree in args.trees}
    for r in range(args.rounds):
        for tree in (args.trees if r % 2 == 0 else args.trees[::-1]):
            env = dict(os.environ, PROBE_BENCH_TREE=os.path.abspath(tree))
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--rounds", "3",
                                  "--new", str(args.new), "--batch", str(args.batch), "--hidden", str(args.hidden),
                                  "--layers", str(args.layers)], capture_output=True, text=True, env=env)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if not line:
                print(f"{tree}: failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            results[tree].append(json.loads(line[-1][7:]))
    print(f"{'tree':<28}{'plain s':>9}{'dumped s':>10}{'ratio':>7}{'us/entry':>10}{'zero-entry':>12}{'ms/step':>9}"
          f"{'ratio, common plain':>21}")
    rows = {}
    for runs in results.values():
        for x in runs:
            x["plain"], x["on"], x["empty"] = (statistics.median(x[k]) for k in ("plain", "on", "empty"))
    # the plain run is the same code in both trees, yet its time differs between the trees'
    # children (by up to a third, either way): the last column divides by the plain runs of both
    common = statistics.median(x["plain"] for runs in results.values() for x in runs) if any(results.values()) else 0
    for tree, runs in results.items():
        if not runs:
            continue
        n, steps = runs[0]["n"], runs[0]["steps"]
        plain = statistics.median(x["plain"] for x in runs)
        ratio = statistics.median(x["on"] / x["plain"] for x in runs)
        per = statistics.median((x["on"] - x["plain"]) / n * 1e6 for x in runs)
        zero = statistics.median(x["empty"] / x["plain"] for x in runs)
        step = statistics.median((x["empty"] - x["plain"]) / steps * 1e3 for x in runs)
        rows[tree] = (ratio, per, zero)
        on = statistics.median(x["on"] for x in runs)
        print(f"{tree[-27:]:<28}{plain:>9.3f}{on:>10.3f}{ratio:>7.2f}{per:>10.1f}{zero:>12.2f}{step:>9.2f}"
              f"{on / common:>21.2f}")
    print("process CPU time (all threads; waiting for a core on a loaded machine is not in it):")
    for tree, runs in results.items():
        if runs:
            med = {k: statistics.median(statistics.median(x["cpu"][k]) for x in runs) for k in ("plain", "empty", "on")}
            n = runs[0]["n"]
            print(f"{tree[-27:]:<28}{med['plain']:>9.3f}{med['on']:>10.3f}{med['on'] / med['plain']:>7.2f}"
                  f"{(med['on'] - med['plain']) / n * 1e6:>10.1f}{med['empty'] / med['plain']:>12.2f}")
    if len(rows) == 2:
        (r0, p0, z0), (r1, p1, z1) = rows[args.trees[0]], rows[args.trees[1]]
        print(f"after/before: ratio x{r1 / r0:.2f}, us/entry x{p1 / p0:.2f}, zero-entry ratio x{z1 / z0:.2f}")


if __name__ == "__main__":
    main()
