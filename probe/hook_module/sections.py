"""Facts about API names: the registry's sections and the entry-name prefix each gives (as
msprobe names them), and which APIs write their first argument.

Apart from ``registry`` (which imports torch) so that reading entry names (compare's
diagnosis of a statistics dump) needs no torch.
"""
SECTION_PREFIX = {
    "functional": "Functional",
    "tensor": "Tensor",
    "torch": "Torch",
    "torch_npu": "NPU",
    "distributed": "Distributed",
    "_VF": "VF",
    "aten": "Aten",
}

# Non-obvious in-place dunders (``a += b``, ``a[i] = v``).
INPLACE_DUNDERS = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__",
                             "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
                             "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "__setitem__"})


def in_place(leaf: str) -> bool:
    """Whether the API named ``leaf`` (``add_``, ``_foreach_mul_``, ``__iadd__``) writes its
    first argument."""
    return leaf in INPLACE_DUNDERS or (leaf.endswith("_") and not leaf.endswith("__"))
