"""Sequence alignment on synthetic call sequences with a known true correspondence."""
import random
import time

from probe.compare.align import align_calls, build_calls
from probe.compare.rows import flatten

APIS = [("Functional.linear", [[8, 32], [32, 32]], [[8, 32]]), ("Functional.gelu", [[8, 32]], [[8, 32]]),
        ("Tensor.__add__", [[8, 32], [8, 32]], [[8, 32]]), ("Functional.layer_norm", [[8, 32]], [[8, 32]]),
        ("Functional.softmax", [[8, 8]], [[8, 8]]), ("Torch.matmul", [[8, 32], [32, 8]], [[8, 8]])]


def _t(shape, seed):
    """A tensor summary whose statistics are a fixed pseudo-random function of ``seed``."""
    u = [((seed * 2654435761 + k * 40503) % 1000003) / 1000003 for k in range(4)]
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": u[0] + 1,
            "Min": -u[1] - 1, "Mean": u[2] - 0.5, "Norm": u[3] * 10 + 5, "requires_grad": False}


def _side(calls):
    """calls: list of (api index, identity seed) -> rows, with msprobe-style counters."""
    rows, counters = [], {}
    for api, seed in calls:
        name, ins, outs = APIS[api]
        n = counters.get(name, 0)
        counters[name] = n + 1
        entry = {"input_args": [_t(s, seed * 10 + k) for k, s in enumerate(ins)],
                 "output": [_t(s, seed * 10 + 9) for s in outs]}
        rows.extend(flatten(f"{name}.{n}.forward", entry))
    return rows


def _truth(ops, A, B, seeds_a, seeds_b):
    pairs = {(op[1], op[2]) for op in ops if op[0] == "pair"}
    true = {(i, seeds_b.index(s)) for i, s in enumerate(seeds_a) if s in seeds_b}
    return pairs, true


def test_random_insertions_and_deletions_are_recovered():
    rng = random.Random(0)
    for trial in range(20):
        base = [(rng.randrange(len(APIS)), k) for k in range(300)]
        npu = list(base)
        bench = list(base)
        for _ in range(5):                      # calls only the NPU makes
            npu.insert(rng.randrange(len(npu)), (rng.randrange(len(APIS)), 10_000 + rng.randrange(10**6)))
        for _ in range(5):                      # calls only the bench makes
            del bench[rng.randrange(len(bench))]
        A, B = build_calls(_side(npu)), build_calls(_side(bench))
        ops = align_calls(A, B)
        pairs, true = _truth(ops, A, B, [s for _, s in npu], [s for _, s in bench])
        assert pairs == true, (trial, sorted(pairs ^ true)[:5])
        # every call appears exactly once
        seen_a = sorted(i for op in ops for i in ([op[1]] if op[0] in ("pair", "npu") else op[1] if op[0] == "group" else []))
        assert seen_a == list(range(len(A)))


def test_long_shifted_sequence_aligns_in_near_linear_time():
    rng = random.Random(1)
    layer = [(a, 0) for a in (3, 0, 5, 4, 5, 0, 2, 3, 0, 1, 0, 2)]
    base = [(api, k) for k, (api, _) in enumerate(layer * 500)]          # 6k calls
    npu = list(base)
    npu.insert(len(npu) // 3, (2, 10**7))                               # one extra add
    A, B = build_calls(_side(npu)), build_calls(_side(base))
    t = time.perf_counter()
    ops = align_calls(A, B)
    elapsed = time.perf_counter() - t
    pairs, true = _truth(ops, A, B, [s for _, s in npu], [s for _, s in base])
    assert pairs == true
    assert [op for op in ops if op[0] != "pair"] == [("npu", len(npu) // 3)]
    print(f"align_calls: {len(npu)} x {len(base)} calls in {elapsed:.2f} s")   # a measurement, not a test
