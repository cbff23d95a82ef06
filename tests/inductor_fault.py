"""A wrong inductor lowering: the bug a compiled run has and an eager run has not.

    with wrong_lowering(torch.ops.aten.erf.default, scale=1.02):
        compiled(x)       # erf computed as erf(1.02 * x) inside inductor's kernels (gelu's too)

Only inductor's own lowering table is changed, for the graphs compiled inside the block
(the FX graph cache is off there, so no kernel compiled before is reused and none made
here is kept); eager calls of the op are untouched.
"""
import contextlib

import torch


@contextlib.contextmanager
def wrong_lowering(op, scale=1.02):
    from torch._inductor import config, lowering
    original = lowering.lowerings[op]
    mul = lowering.lowerings[torch.ops.aten.mul.Tensor]

    def wrong(x, *args, **kwargs):
        return original(mul(x, scale), *args, **kwargs)

    lowering.lowerings[op] = wrong
    try:
        with config.patch(fx_graph_cache=False):
            yield
    finally:
        lowering.lowerings[op] = original
