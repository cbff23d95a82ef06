"""Before/after in one run: bench/overhead.py's rows for two source trees, alternating.

    git worktree add /tmp/before REV && cp probe/dump/*.so /tmp/before/probe/dump/
    python bench/ab.py /tmp/before . [--rounds 3] [--rows "mid d256 2blk b8:L1:statistics" ...]

Each (tree, row) is timed in a fresh interpreter with that tree first on sys.path, trees
taking turns round by round so that drifting machine speed hits both alike; prints the
median ratio and us/entry per tree and row. A measurement, not a test.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
import overhead
model, level, task, root = sys.argv[2:6]
off, on, n = overhead.probe_row(model, level, task, root, 3, 30)
print("RESULT " + json.dumps({"off": off, "on": on, "n": n}))
"""

ROWS = ["mid d256 2blk b8:L1:statistics", "mid d256 2blk b8:L1:tensor", "gpt2 block d256 b4x64:L1:statistics"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs=2, help="the source trees to compare (before, after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", nargs="*", default=ROWS, help="model:level:task, as bench/overhead.py names them")
    args = ap.parse_args()
    root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    results = {}
    for r in range(args.rounds):
        for row in args.rows:
            for tree in (args.trees if r % 2 == 0 else args.trees[::-1]):
                model, level, task = row.split(":")
                out = subprocess.run([sys.executable, "-c", CHILD, os.path.abspath(tree), model, level, task, root],
                                     capture_output=True, text=True, cwd=tree)
                line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
                if not line:
                    print(f"{tree} {row}: failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                res = json.loads(line[-1][7:])
                results.setdefault((row, tree), []).append(res)
    print(f"{'row':<40}{'tree':<28}{'off ms':>8}{'on ms':>8}{'ratio':>7}{'us/entry':>9}")
    for row in args.rows:
        for tree in args.trees:
            runs = results.get((row, tree), [])
            if not runs:
                continue
            ratio = statistics.median(x["on"] / x["off"] for x in runs)
            per = statistics.median((x["on"] - x["off"]) / x["n"] * 1e6 for x in runs)
            off = statistics.median(x["off"] for x in runs) * 1e3
            on = statistics.median(x["on"] for x in runs) * 1e3
            print(f"{row:<40}{tree[-27:]:<28}{off:>8.2f}{on:>8.2f}{ratio:>7.2f}{per:>9.1f}")


if __name__ == "__main__":
    main()
