"""Merging one step's rank dumps into one logical dump (shard_merge), on dumps written here
with known tensors: Shard / Replicate / Partial by a recorded layout or a layout file, in
statistics and tensor mode; what can't be told; the rank whose piece differs; memory held
to one call's shards; the layout file's validation."""
import json
import os
import tracemalloc

import numpy as np
import pytest

from probe.compare.layout_file import LayoutRules, load_layout_file, parse_layout
from probe.compare.shard_culprit import find_culprit
from probe.compare.shard_merge import entry_tensors, merge_ranks, parse_placement
from probe.errors import ConfigError


def _leaf(arr, name=None, data_dir=None, **layout):
    """A tensor's dump.json description (statistics in float64, as the dump computes them)."""
    x = arr.astype(np.float64)
    d = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(layout.pop("shape", arr.shape)),
         "Max": float(x.max()), "Min": float(x.min()), "Mean": float(x.mean()),
         "Norm": float(np.sqrt((x * x).sum())), "requires_grad": False}
    if layout:
        d.update({"local_shape": list(arr.shape), **layout})
    if data_dir is not None:
        os.makedirs(data_dir, exist_ok=True)
        np.save(os.path.join(data_dir, name + ".npy"), arr)
        d["data_name"] = name + ".npy"
    return d


def _write(folder, entries):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "dump.json")
    with open(path, "w") as fh:
        json.dump({"task": "tensor", "level": "L1", "framework": "pytorch", "data": entries}, fh)
    return path


def _sharded(tmp_path, whole, dim, ranks, tensors, placement=None, offsets=True, name="Functional.linear.0.forward"):
    """Rank dumps of one call whose output is ``whole`` split along ``dim`` (a DTensor's record)."""
    pieces = np.array_split(whole, ranks, axis=dim)
    paths, at = [], 0
    for r, piece in enumerate(pieces):
        folder = str(tmp_path / f"rank{r}")
        offset = [0] * whole.ndim
        offset[dim] = at
        at += piece.shape[dim]
        data = os.path.join(folder, "dump_tensor_data") if tensors else None
        layout = {"shape": whole.shape, "placements": [placement or f"Shard(dim={dim})"], "mesh_shape": [ranks],
                  "global_offset": offset if offsets else None}
        out = _leaf(piece, f"{name}.output.0", data, **layout)
        paths.append((r, _write(folder, {name: {"input_args": [], "input_kwargs": {}, "output": [out]}})))
    return paths


def _merged(report):
    with open(report.json_path) as fh:
        return json.load(fh)["data"]


@pytest.mark.parametrize("tensors", [False, True], ids=["statistics", "tensor"])
@pytest.mark.parametrize("dim,ranks", [(0, 2), (1, 3), (1, 4)])
def test_shards_merge_into_the_whole_tensor(tmp_path, tensors, dim, ranks):
    whole = np.random.default_rng(dim * 10 + ranks).standard_normal((6, 10)).astype(np.float32)
    paths = _sharded(tmp_path, whole, dim, ranks, tensors)       # uneven pieces for 3 ranks of 10
    report = merge_ranks(paths, str(tmp_path / "merged" / "dump.json"))
    out = _merged(report)["Functional.linear.0.forward"]["output"][0]
    ref = _leaf(whole)
    assert out["shape"] == [6, 10] and "placements" not in out and "local_shape" not in out
    for k in ("Max", "Min", "Mean", "Norm"):
        assert out[k] == pytest.approx(ref[k], rel=1e-12, abs=1e-12)
    assert report.counts == {"shard": 1} and not report.cant_tell and not report.disagree
    if tensors:
        got = np.load(tmp_path / "merged" / "dump_tensor_data" / out["data_name"])
        assert np.array_equal(got, whole)


def test_offsets_left_out_by_an_older_torch_follow_rank_order_on_a_1d_mesh(tmp_path):
    whole = np.arange(24, dtype=np.float32).reshape(4, 6)
    report = merge_ranks(_sharded(tmp_path, whole, 1, 2, True, offsets=False), str(tmp_path / "m" / "dump.json"))
    out = _merged(report)["Functional.linear.0.forward"]["output"][0]
    assert np.array_equal(np.load(tmp_path / "m" / "dump_tensor_data" / out["data_name"]), whole)


def _copies(tmp_path, arrays, placement, tensors, name="Functional.linear.1.forward"):
    paths = []
    for r, a in enumerate(arrays):
        folder = str(tmp_path / f"rank{r}")
        layout = {"shape": a.shape, "placements": [placement], "mesh_shape": [len(arrays)],
                  "global_offset": [0] * a.ndim} if placement else {}
        out = _leaf(a, f"{name}.output.0", os.path.join(folder, "dump_tensor_data") if tensors else None, **layout)
        paths.append((r, _write(folder, {name: {"input_args": [], "output": [out]}})))
    return paths


def test_partial_sums_in_tensor_mode_and_cannot_be_told_from_statistics(tmp_path):
    rng = np.random.default_rng(0)
    terms = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2)]
    report = merge_ranks(_copies(tmp_path / "t", terms, "Partial(sum)", True), str(tmp_path / "mt" / "dump.json"))
    out = _merged(report)["Functional.linear.1.forward"]["output"][0]
    got = np.load(tmp_path / "mt" / "dump_tensor_data" / out["data_name"])
    assert np.allclose(got, terms[0] + terms[1], rtol=0, atol=1e-6) and report.counts == {"partial": 1}
    assert out["Max"] == pytest.approx(float(got.astype(np.float64).max()))

    report = merge_ranks(_copies(tmp_path / "s", terms, "Partial(sum)", False), str(tmp_path / "ms" / "dump.json"))
    out = _merged(report)["Functional.linear.1.forward"]["output"][0]
    assert out["Max"] is None and out["Norm"] is None and "data_name" not in out
    why = report.cant_tell["Functional.linear.1.forward.output.0"]
    assert "Partial(sum)" in why and "statistics of a sum are not functions of its terms'" in why
    assert parse_placement("_Partial(reduce_op=RedOpType.SUM)") == ("partial", "sum")   # torch 2.1's spelling


@pytest.mark.parametrize("tensors", [False, True], ids=["statistics", "tensor"])
def test_replicated_copies_give_one_tensor_and_copies_that_differ_are_named(tmp_path, tensors):
    a = np.random.default_rng(1).standard_normal((5, 5)).astype(np.float32)
    report = merge_ranks(_copies(tmp_path / "same", [a, a.copy()], "Replicate()", tensors),
                         str(tmp_path / "m1" / "dump.json"))
    assert report.counts == {"replicate": 1} and not report.disagree
    report = merge_ranks(_copies(tmp_path / "diff", [a, a * 1.01], "Replicate()", tensors),
                         str(tmp_path / "m2" / "dump.json"))
    assert report.disagree == {"Functional.linear.1.forward.output.0": "rank 1's copy differs from rank 0's"}
    out = _merged(report)["Functional.linear.1.forward"]["output"][0]
    assert out["Max"] == pytest.approx(float(a.max()))          # the lowest rank's copy is the one compared


def test_plain_tensors_are_one_copy_when_equal_and_cant_tell_when_not(tmp_path):
    a = np.ones((2, 3), np.float32)
    report = merge_ranks(_copies(tmp_path / "p", [a, a], None, False), str(tmp_path / "m" / "dump.json"))
    assert report.counts == {"replicate": 1}
    report = merge_ranks(_copies(tmp_path / "q", [a, 2 * a], None, False), str(tmp_path / "n" / "dump.json"))
    assert "layout file rule" in report.cant_tell["Functional.linear.1.forward.output.0"]


def test_a_layout_file_merges_plain_shards_as_a_recorded_layout_does(tmp_path):
    whole = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    paths = []
    for r, piece in enumerate(np.split(whole, 2, axis=1)):       # Megatron: plain local tensors
        folder = str(tmp_path / f"rank{r}")
        out = _leaf(piece, "Functional.linear.0.forward.output.0", os.path.join(folder, "dump_tensor_data"))
        paths.append((r, _write(folder, {"Functional.linear.0.forward": {"input_args": [], "output": [out]}})))
    layout = tmp_path / "layout.yaml"
    layout.write_text('"Functional.linear.*.forward.output.0": {shard_dim: -1}\n')
    report = merge_ranks(paths, str(tmp_path / "m" / "dump.json"), load_layout_file(str(layout)))
    out = _merged(report)["Functional.linear.0.forward"]["output"][0]
    assert out["shape"] == [4, 8] and "Shard(dim=1)" in out["merge"] and "layout file" in out["merge"]
    assert np.array_equal(np.load(tmp_path / "m" / "dump_tensor_data" / out["data_name"]), whole)


def test_row_names_match_the_compare_rows(tmp_path):
    """The layout file's patterns match the compare's row names: the merge walks entries
    with the same names rows.flatten gives (kwargs, nested lists, parameter gradients)."""
    from probe.compare.rows import flatten
    t = _leaf(np.ones((2,), np.float32))
    entries = {"Torch.cat.0.forward": {"input_args": [[t, t], 1], "input_kwargs": {"out": t}, "output": [t]},
               "Module.fc.Linear.parameters_grad": {"weight": t, "bias": t}}
    paths = [(r, _write(str(tmp_path / f"rank{r}"), entries)) for r in (0, 1)]
    seen = []

    class Spy(LayoutRules):
        def find(self, row_name):
            seen.append(row_name)
            return None
    merge_ranks(paths, str(tmp_path / "m" / "dump.json"), Spy("names", ()))
    want = [r.name for name, e in entries.items() for r in flatten(name, e) if r.kind == "tensor"]
    assert sorted(seen) == sorted(want)


def test_the_rank_whose_piece_differs_is_found_by_slices_and_by_statistics(tmp_path):
    rng = np.random.default_rng(3)
    whole = rng.standard_normal((8, 12)).astype(np.float32)
    faulty = whole.copy()
    faulty[:, 8:] *= 1.05                            # rank 2 of 3 (columns 8..11) computed it wrong
    paths = _sharded(tmp_path / "t", faulty, 1, 3, True)
    bench = tmp_path / "bench.npy"
    np.save(bench, whole)
    mt = entry_tensors(paths, "Functional.linear.0.forward")["Functional.linear.0.forward.output.0"]
    ref = _leaf(whole)
    stats = tuple(ref[k] for k in ("Max", "Min", "Mean", "Norm"))
    c = find_culprit(mt, stats, str(bench), 1e-4)
    assert c.ranks == [2] and c.certain and "rank 2" in c.text and "ranks 0, 1 within" in c.text
    # statistics: a piece whose Max lies above the whole tensor's Max is convicted
    spiky = whole.copy()
    spiky[0, 1] = 10.0
    mt = entry_tensors(_sharded(tmp_path / "s", spiky, 1, 3, False), "Functional.linear.0.forward")
    c = find_culprit(mt["Functional.linear.0.forward.output.0"], stats, None, 1e-4)
    assert c.ranks == [0] and c.certain and "exceeds the whole tensor's" in c.text
    # a small scale inside the pieces' natural spread, the extremes on a correct rank: every
    # rank is a candidate, and it says so
    whole[0, 0], whole[1, 0] = 5.0, -5.0
    faulty = whole.copy()
    faulty[:, 8:] *= 1.02
    ref = _leaf(whole)
    stats = tuple(ref[k] for k in ("Max", "Min", "Mean", "Norm"))
    mt = entry_tensors(_sharded(tmp_path / "u", faulty, 1, 3, False), "Functional.linear.0.forward")
    c = find_culprit(mt["Functional.linear.0.forward.output.0"], stats, None, 1e-4)
    assert c.ranks == [0, 1, 2] and not c.certain and "cannot be told from statistics" in c.text
    # a scale inside the extremes stands out of the family of the pieces' RMS (values of one size)
    whole = (np.sign(rng.standard_normal((8, 12))) * (1 + 0.01 * rng.standard_normal((8, 12)))).astype(np.float32)
    whole[0, 0], whole[1, 0] = 1.5, -1.5
    ref = _leaf(whole)
    stats = tuple(ref[k] for k in ("Max", "Min", "Mean", "Norm"))
    faulty = whole.copy()
    faulty[:, 8:] *= 1.2
    mt = entry_tensors(_sharded(tmp_path / "v", faulty, 1, 3, False), "Functional.linear.0.forward")
    c = find_culprit(mt["Functional.linear.0.forward.output.0"], stats, None, 1e-4)
    assert c.ranks == [2] and "out of family" in c.text


def test_memory_holds_one_calls_shards(tmp_path):
    """20 calls of 2 x 1 MB shards (40 MB of tensors): the merge's peak of traced memory stays
    within a few calls' worth, whatever the number of calls."""
    calls, rows = 20, 1 << 17                     # a (131072, 2) float32 shard is 1 MB
    folders = [str(tmp_path / f"rank{r}") for r in (0, 1)]
    entries: list = [{}, {}]
    rng = np.random.default_rng(4)
    for k in range(calls):
        whole = rng.standard_normal((rows, 4)).astype(np.float32)
        for r in (0, 1):
            name = f"Functional.linear.{k}.forward"
            layout = {"shape": whole.shape, "placements": ["Shard(dim=1)"], "mesh_shape": [2],
                      "global_offset": [0, 2 * r]}
            out = _leaf(whole[:, 2 * r:2 * r + 2].copy(), f"{name}.output.0",
                        os.path.join(folders[r], "dump_tensor_data"), **layout)
            entries[r][name] = {"input_args": [], "output": [out]}
    paths = [(r, _write(folders[r], entries[r])) for r in (0, 1)]
    tracemalloc.start()
    try:
        report = merge_ranks(paths, str(tmp_path / "m" / "dump.json"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.counts == {"shard": calls}
    one_call = 2 * rows * 2 * 4                    # both shards of one call, 2 MB
    assert peak < 4 * one_call, f"peak {peak / 1e6:.1f} MB for {calls} calls of {one_call / 1e6:.1f} MB"


@pytest.mark.parametrize("doc,said", [
    ([1, 2], "expected a mapping of row-name patterns to layouts"),
    ({}, "got an empty mapping"),
    ({"Functional.linear.*": {"shard_dim": "1"}}, "key 'Functional.linear.*': shard_dim '1' must be an integer"),
    ({"x": {"shard_dim": True}}, "shard_dim True must be an integer"),
    ({"x": {"partial": "prod"}}, "key 'x': partial 'prod' must be one of sum, avg, max, min"),
    ({"x": {"replicate": "yes"}}, "replicate 'yes' must be true"),
    ({"x": {"split": 1}}, "unknown layout 'split'"),
    ({"x": {"shard_dim": 0, "partial": "sum"}}, "must be exactly one of"),
    ({"x": 3}, "value 3 must be exactly one of"),
])
def test_a_bad_layout_is_one_line_naming_file_key_and_value(doc, said):
    with pytest.raises(ConfigError) as err:
        parse_layout(doc, "layout.json")
    text = str(err.value)
    assert said in text and text.startswith("layout file layout.json") and "\n" not in text


def test_layout_files_in_json_and_yaml_and_unreadable_ones(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"A.*": {"shard_dim": 1}, "A.0.forward.output.0": {"replicate": True}}))
    rules = load_layout_file(str(tmp_path / "a.json"))
    assert rules.find("A.0.forward.output.0").kind == "shard"          # the first pattern that matches wins
    assert rules.find("B.0.forward.output.0") is None
    (tmp_path / "b.yaml").write_text("'A.[01].*': {partial: sum}\n")
    assert load_layout_file(str(tmp_path / "b.yaml")).find("A.1.x").reduce == "sum"
    (tmp_path / "c.json").write_text("{'A': 1")
    with pytest.raises(ConfigError, match=r"c.json: not valid JSON"):
        load_layout_file(str(tmp_path / "c.json"))
    (tmp_path / "d.yaml").write_text("a: [1\n")
    with pytest.raises(ConfigError, match=r"d.yaml: not valid YAML \(line 2"):
        load_layout_file(str(tmp_path / "d.yaml"))
    with pytest.raises(ConfigError, match="not found"):
        load_layout_file(str(tmp_path / "none.yaml"))
