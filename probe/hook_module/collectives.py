"""What a collective produced: the tensors it wrote, recorded as the call's outputs.

``dist.all_reduce(t)`` returns None (or a ``Work`` with ``async_op=True``); its result is
``t`` itself after the call, ``all_gather``'s the list it filled. The interceptor hands the
dump handler ``CollectiveCall(func, api)`` in place of the function: calling it runs the
collective and returns a ``CollectiveResult``, a list of those result tensors (what the
handler records as outputs) that keeps the real return value in ``value`` for the user.

With ``async_op=True`` (and ``isend``/``irecv``) the tensors hold the result only once the
work completes: ``result.when_done(fn)`` runs ``fn`` from the work's completion callback
(``Work.get_future().then``), so the outputs are recorded then, and probe adds no wait.
"""
import inspect
import logging

log = logging.getLogger(__name__)

# API -> the parameter holding what the collective writes (its outputs)
RESULT_PARAM = {
    "all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
    "all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor",
    "_all_gather_base": "output_tensor", "reduce_scatter": "output",
    "reduce_scatter_tensor": "output", "_reduce_scatter_base": "output",
    "all_to_all": "output_tensor_list", "all_to_all_single": "output",
    "recv": "tensor", "irecv": "tensor", "gather": "gather_list", "scatter": "tensor",
    "all_gather_single": "output_tensor", "reduce_scatter_single": "output",
}
# torch 2.13 renamed two collectives (the old names stay, deprecated, calling the new ones);
# FSDP2 calls the new names. They are recorded under the old, registered name, so that a
# dump names a collective the same on every torch: the YAML line -> the names it covers.
RENAMED = {"all_gather_into_tensor": ("all_gather_single",),
           "reduce_scatter_tensor": ("reduce_scatter_single",)}
_ALWAYS_ASYNC = {"isend", "irecv"}
_signatures: dict = {}


class CollectiveResult(list):
    """The result tensors of one collective call; ``value`` is what the call returned."""
    __slots__ = ("value",)

    def __init__(self, tensors, value):
        super().__init__(tensors)
        self.value = value

    def when_done(self, fn):
        """``fn()`` once the async work completes; None when the call was synchronous
        (the caller records now). Returns True when ``fn`` was scheduled."""
        work = self.value
        get_future = getattr(work, "get_future", None)
        if get_future is None:
            return False
        try:
            future = get_future()
        except RuntimeError:   # a backend without futures: recorded now, as before the wait
            return False
        future.then(lambda _f: fn())
        return True


class CollectiveCall:
    """Runs one collective; see the module docstring."""
    __slots__ = ("func", "api", "__wrapped__")

    def __init__(self, func, api):
        self.func = func
        self.api = api
        self.__wrapped__ = func

    def __call__(self, *args, **kwargs):
        value = self.func(*args, **kwargs)
        return CollectiveResult(_result_tensors(self.func, self.api, args, kwargs), value)

    def is_async(self, kwargs):
        return self.api in _ALWAYS_ASYNC or bool(kwargs.get("async_op"))


def _result_tensors(func, api, args, kwargs):
    param = RESULT_PARAM.get(api)
    if param is None:
        return []
    sig = _signatures.get(func)
    if sig is None:
        try:
            sig = _signatures[func] = inspect.signature(func)
        except (TypeError, ValueError):
            return []
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return []
    value = bound.arguments.get(param)
    if value is None:
        return []
    # Fresh aliases: the op writes in place without bumping the version counter, so the
    # tensors themselves would hit the summaries cached for them as inputs.
    return [t.detach() for t in (value if isinstance(value, (list, tuple)) else [value])]


def unwrap(result):
    """What the user's call returns: the collective's own return value."""
    return result.value if type(result) is CollectiveResult else result
