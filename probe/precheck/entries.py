"""Dump entries as replayable API calls: the name parsed, the callable found, the kind known.

Entry names are ``{Prefix}.{api}.{N}.{forward|backward}``; the API may itself hold dots
(``Torch.linalg.norm.0.forward``). The callable is looked up through the same registry
sections the dump used (``Functional`` -> torch.nn.functional, ``Tensor`` -> torch.Tensor,
...), so a name dumped by msprobe or by probe resolves to the function that produced it.
"""
from __future__ import annotations

from msgspec.structs import astuple

from probe.vocabulary import PREFIX_SECTION, EntryName, api_name, in_place

# Outputs drawn from a random generator: judged by their distribution, not element-wise.
RANDOM = frozenset({
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    "native_dropout", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
    "randperm", "bernoulli", "bernoulli_", "multinomial", "normal", "normal_", "uniform_",
    "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "rrelu", "rrelu_",
    "gumbel_softmax", "poisson"})
# Dropouts are random only in training mode; their (input, p, training) positions.
DROPOUT_ARGS = {"dropout": (1, 2, True), "dropout1d": (1, 2, True), "dropout2d": (1, 2, True),
                "dropout3d": (1, 2, True), "alpha_dropout": (1, 2, False),
                "feature_alpha_dropout": (1, 2, False), "native_dropout": (1, 2, None)}
# Type and device conversions: the result is the input converted, nothing else.
CONVERSIONS = frozenset({"to", "type", "type_as", "float", "double", "half", "bfloat16", "int",
                         "long", "short", "char", "byte", "bool", "cpu", "cuda", "npu"})
# Ops whose result is a selection, a rearrangement or a sign/rounding of the inputs: any
# correct kernel gives bitwise the same values, so any difference is an error.
EXACT = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "transpose_", "permute", "t",
    "contiguous", "clone", "detach", "chunk", "split", "split_with_sizes", "tensor_split",
    "unbind", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "squeeze",
    "unsqueeze", "flatten", "unflatten", "expand", "expand_as", "repeat", "repeat_interleave",
    "__getitem__", "index_select", "gather", "narrow", "select", "flip", "roll", "masked_fill",
    "masked_fill_", "masked_select", "where", "relu", "relu_", "abs", "neg", "__neg__",
    "max", "min", "amax", "amin", "maximum", "minimum", "sort", "topk", "argmax", "argmin",
    "zeros_like", "ones_like", "full_like", "empty_like", "fill_", "zero_", "copy_", "tril", "triu",
    "pad", "embedding", "one_hot", "floor", "ceil", "trunc", "sign", "movedim",
    "swapaxes", "diagonal", "__setitem__", "unfold"})
# Of those, the ones whose gradient is a pure rearrangement too (a sum over repeated
# indices, as in expand's or gather's backward, is not bitwise reproducible).
EXACT_BACKWARD = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "transpose_", "permute", "t",
    "contiguous", "clone", "detach", "chunk", "split", "split_with_sizes", "tensor_split",
    "unbind", "cat", "concat", "concatenate", "stack", "hstack", "vstack", "squeeze",
    "unsqueeze", "flatten", "unflatten", "narrow", "select", "flip", "roll", "movedim",
    "swapaxes", "relu", "relu_", "abs", "neg", "__neg__", "masked_fill", "where", "tril", "triu"})
# Elementwise math judged additionally by ULP error (msprobe's ULP standard covers this kind).
ULP_APIS = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
                      "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "sqrt", "rsqrt",
                      "erf", "erfc", "erfinv", "reciprocal", "pow", "__pow__", "__rpow__", "div",
                      "__truediv__", "__rtruediv__", "atan2", "silu", "gelu", "softplus", "mish"})


class ApiEntry(EntryName, frozen=True, gc=False):
    """An API call's entry name (the vocabulary's ``EntryName``) and what replaying it
    needs to know of its kind: in place, a conversion, random, exact, ULP-judged."""

    @property
    def inplace(self) -> bool:
        return in_place(self.leaf)

    @property
    def conversion(self) -> bool:
        return self.prefix == "Tensor" and self.leaf in CONVERSIONS

    @property
    def random(self) -> bool:
        return self.leaf in RANDOM

    @property
    def exact(self) -> bool:
        return self.leaf in EXACT or self.conversion

    @property
    def exact_backward(self) -> bool:
        return self.leaf in EXACT_BACKWARD or self.conversion

    @property
    def ulp(self) -> bool:
        return self.leaf in ULP_APIS


def parse_name(name: str) -> ApiEntry | None:
    """The ApiEntry of an API call's entry name of a registry section, or None for module
    entries, custom ops and other shapes."""
    n = api_name(name)
    if n is None or n.prefix not in PREFIX_SECTION:
        return None
    return ApiEntry(*astuple(n))
_cache: dict = {}


def resolve_api(entry: ApiEntry):
    """The callable an entry name stands for; LookupError with the reason if there is none.

    A ``Tensor`` API is called unbound (``torch.Tensor.add(self, other)``), which is how
    its dumped ``input_args`` list it: self first.
    """
    key = entry.qualified
    if key in _cache:
        return _cache[key]
    from probe.hook_module.registry import lookup, section_owner  # imports torch
    section = PREFIX_SECTION[entry.prefix]
    owner = section_owner(section)
    if owner is None:
        raise LookupError(f"section {section!r} is not available here (package not installed)")
    func = lookup(owner, entry.api)
    if func is None or not callable(func):
        raise LookupError(f"{key} does not exist in this torch ({_torch_version()})")
    _cache[key] = func
    return func


def _torch_version():
    import torch
    return torch.__version__
