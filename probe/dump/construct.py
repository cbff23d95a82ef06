"""construct.json: which module (or the optimizer) each dumped entry ran under.

The module hooks keep ``current`` up to date, so an API call finds its parent in O(1):
one attribute read, no stack walk. ``current`` is the running module's pair of entry
names (forward, backward); a backward entry's parent is the backward entry of the module
whose forward made it, so the backward half of the tree mirrors the forward half
(msprobe loses some backward parents; here every one is filled in).
"""

OPTIMIZER = ("optimizer", "optimizer")


class Construct:
    """child entry name -> parent entry name (None for the top level)."""
    __slots__ = ("tree", "current")

    def __init__(self):
        self.tree = {}
        self.current = None   # (forward name, backward name) of the innermost dumped module

    def reset(self):
        self.tree = {}
        self.current = None

    def to_json(self):
        return dict(self.tree)
