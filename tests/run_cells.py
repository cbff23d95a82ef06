"""What a whole run's grid cell says where a pair's calls could not be merged across ranks
(shared by the data-parallel and tensor-parallel run tests)."""
import json
import re


def clean_where_merged_calls_are_checked(cell, first, why):
    """A pair whose calls' outputs can't be merged across ranks (statistics of a Partial
    tensor, copies no layout merges) is "clean" only where the calls compared after them
    agree, and its cell says so: how many (the pair's "can't tell" calls, all of this kind),
    the first with why, how many calls checked them. None such: clean, no reason."""
    with open(cell["report"]) as fh:
        n = json.load(fh)["calls"]["can't tell"]
    assert cell["verdict"] == "clean", cell
    if first is None:
        assert n == 0 and cell["reason"] is None, cell
        return
    m = re.fullmatch(rf"{n} calls? can't be judged \((their outputs|its output) can't be merged across ranks\), "
                     rf"first {re.escape(first)} can't be merged across ranks: (.+); the (\d+) calls? compared "
                     r"after (the last of them|it) agrees? with the bench", cell["reason"] or "")
    assert n >= 1 and m is not None, (n, cell)
    assert m.group(2).startswith(why) and int(m.group(3)) >= 1, cell["reason"]
