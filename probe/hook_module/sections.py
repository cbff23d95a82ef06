"""The registry's sections and the entry-name prefix each gives, as msprobe names them.

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
