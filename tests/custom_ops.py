"""Custom ops for the forensics tests, defined the way every torch probe supports allows:
``torch.library.Library`` (``torch.library.custom_op`` came with torch 2.4). Each op is
``torch.ops.<namespace>.<name>``, as a custom_op-made one is.

    fail = define("probe_crash_test", "fail(Tensor x, float scale) -> Tensor", kernel)
"""
import torch

_LIBRARIES = []   # a Library's registrations last as long as the object


def define(namespace, schema, kernel, fake=None, backward=None):
    """The op ``namespace::schema`` running ``kernel``; ``fake`` is its meta function (what
    FakeTensorMode runs), ``backward(ctx, *grads)`` its autograd formula."""
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(schema)
    name = schema.split("(", 1)[0]
    lib.impl(name, kernel, "CompositeExplicitAutograd")
    if fake is not None:
        lib.impl(name, fake, "Meta")
    op = getattr(getattr(torch.ops, namespace), name)
    if backward is not None:
        class Function(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                with torch._C._AutoDispatchBelowAutograd():
                    return op(*args)

            @staticmethod
            def backward(ctx, *grads):
                return backward(ctx, *grads)
        lib.impl(name, Function.apply, "Autograd")
    _LIBRARIES.append(lib)
    return op
