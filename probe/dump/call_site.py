"""Arguments of a Python-level API as the user wrote them, not as torch re-packs them.

``F.layer_norm(x, shape, w, b, eps)`` reaches a function mode as ``(x, shape)`` plus
``weight=, bias=, eps=`` keywords, and ``F.softmax(x, dim=-1)`` gains ``_stacklevel``
and ``dtype``: torch's dispatch passes every parameter it has. msprobe, which wraps the
function itself, records the call as written, and its users compare row names such as
``input.2``. The caller's ``CALL`` instruction says how many arguments were positional
and which keywords were given; that layout is read once per call site and cached.
Where it cannot be read (``f(*args)``, other interpreters), the dispatch form is kept.

A bound method's CALL does not count its object: ``h.split(3, dim=2)`` is CALL 2 with one
keyword, and ``Tensor.split`` gets ``(h, 3)`` plus ``dim``. The instruction that loaded
the callable (found by walking back over the arguments' stack effects) tells
``h.split(...)`` from ``torch.Tensor.split(h, ...)``. Instructions are read by name for
CPython 3.9 to 3.13 (``python_compat.BYTECODE_PYTHONS``); on another Python the dispatch
form is kept (operators.py says so once in the log).
"""
import dis
import inspect
import sys

from probe import python_compat
from probe.torch_compat import EAGER_FRAME_CODE

_CALL_OPS = {dis.opmap[name] for name in ("CALL", "CALL_KW", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_METHOD") if name in dis.opmap}
_KW_NAMES = dis.opmap.get("KW_NAMES")
_LOAD_CONST = dis.opmap["LOAD_CONST"]
_SKIP = {dis.opmap[name] for name in ("PRECALL", "CACHE", "EXTENDED_ARG") if name in dis.opmap}

_sites: dict = {}    # (code, f_lasti) -> (n positional, keyword names) or None
_params: dict = {}   # function -> positional-or-keyword parameter names, or None
_plans: dict = {}    # (code, f_lasti, function, len(args), keywords) -> _Plan or None


class _Plan:
    """How one call site's arguments arrive and how they were written: the arguments
    are then re-split with a slice and a few lookups, no binding per call."""
    __slots__ = ("n_from_args", "pos_from_kwargs", "kw_from_kwargs", "kw_mixed")

    def __init__(self, n_from_args, pos_from_kwargs, kw_sources):
        self.n_from_args = n_from_args           # the first positionals written: args[:n]
        self.pos_from_kwargs = pos_from_kwargs   # the rest, arriving as these keywords
        if all(i is None for _, i in kw_sources):   # keywords written arrive as keywords
            self.kw_from_kwargs, self.kw_mixed = tuple(k for k, _ in kw_sources), None
        else:   # some arrive positionally: ((keyword, index in args or None), ...), in order
            self.kw_from_kwargs, self.kw_mixed = None, kw_sources


# Frames between here and the API's own: probe's handler chain, the mode, torch's dispatch
# and run_eagerly's frame round the mode and round the handler.
_API_FRAME_LIMIT = 10


def as_called(func, args, kwargs, api_frame_limit=_API_FRAME_LIMIT):
    """``(args, kwargs)`` re-split the way the caller of ``func`` wrote the call."""
    if not python_compat.READS_BYTECODE:
        return args, kwargs
    names = _params.get(func, False)
    if names is False:
        names = _params[func] = _param_names(func)
    if names is None:
        return args, kwargs
    caller = _caller_of(func.__code__, api_frame_limit)
    if caller is None:
        return args, kwargs
    key = (caller.f_code, caller.f_lasti, func, len(args), *kwargs)
    plan = _plans.get(key, False)
    if plan is False:
        plan = _plans[key] = _make_plan(names, _is_method(func), _site(caller), len(args), kwargs)
    if plan is None:
        return args, kwargs
    pos = args[:plan.n_from_args]
    if plan.pos_from_kwargs:
        pos += tuple(kwargs[k] for k in plan.pos_from_kwargs)
    if plan.kw_mixed is None:
        return pos, {k: kwargs[k] for k in plan.kw_from_kwargs}
    return pos, {k: kwargs[k] if i is None else args[i] for k, i in plan.kw_mixed}


def _site(caller):
    key = (caller.f_code, caller.f_lasti)
    site = _sites.get(key, False)
    if site is False:
        site = _sites[key] = _read_site(caller.f_code, caller.f_lasti, caller)
    return site


def _make_plan(names, bound, site, n_args, kwargs):
    """The re-split for arguments arriving as ``n_args`` positionals and ``kwargs``, or
    None when the written call cannot be mapped onto them (the dispatch form is kept)."""
    if site is None or n_args > len(names):
        return None
    n_pos, kw_names, method_form = site
    if bound:   # a method called on its object: ``self`` came before the written arguments
        if method_form is None:
            return None
        n_pos += method_form
    arrived = set(names[:n_args]) | set(kwargs)
    if n_pos > len(names) or any(n not in arrived for n in names[:n_pos]) or any(k not in arrived for k in kw_names):
        return None
    index = {n: i for i, n in enumerate(names[:n_args])}
    n_from_args = min(n_pos, n_args)
    return _Plan(n_from_args, names[n_from_args:n_pos], tuple((k, index.get(k)) for k in kw_names))


def _is_method(func):
    """A function defined in a class body (``Tensor.split``): called as ``x.split(...)``,
    its first argument is not in the CALL's count."""
    qualname = getattr(func, "__qualname__", "")
    return "." in qualname and "<locals>" not in qualname.rsplit(".", 2)[-2:][0]


def _param_names(func):
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return tuple(p.name for p in params)


def _caller_of(code, limit):
    """The frame that called the function whose code is ``code`` (it is on the stack)."""
    f = sys._getframe(2)
    for _ in range(limit):
        if f is None:
            return None
        if f.f_code is code:
            return f.f_back
        f = f.f_back
    return None


def _read_site(code, lasti, frame=None):
    """(positional count, keyword names, method form) of the CALL that ``lasti`` is in,
    else None. ``method form`` is True where the callable was ``obj.name`` and ``obj``
    is no class: a bound method, whose ``self`` is a positional the CALL does not count
    (``x.split(3, dim=2)`` is CALL 2 with one keyword, yet the method gets two
    positionals), False where the callable was loaded otherwise, None where unknown."""
    ins = list(dis.get_instructions(code))
    before = [i for i in ins if i.offset <= lasti]   # 3.13+: f_lasti is the CALL itself; 3.11/3.12: its last CACHE
    if not before or before[-1].opcode not in _CALL_OPS:
        return None
    call_op, argc = before[-1].opcode, before[-1].arg or 0
    # 3.11/3.12: KW_NAMES precedes CALL; 3.9/3.10 (CALL_FUNCTION_KW) and 3.13+ (CALL_KW)
    # take the names tuple loaded last, as one more stack item.
    names_on_stack = dis.opname[call_op] in ("CALL_KW", "CALL_FUNCTION_KW")
    names_op = _LOAD_CONST if names_on_stack else _KW_NAMES
    kw = ()
    for i in reversed(before[:-1]):
        if i.opcode in _SKIP:
            continue
        if i.opcode == names_op:
            kw = code.co_consts[i.arg]
        break
    if not isinstance(kw, tuple) or len(kw) > argc:
        return None
    return argc - len(kw), kw, _method_form(before[:-1], argc + names_on_stack, frame)


_LOADS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_GLOBAL", "LOAD_NAME",
          "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_ATTR"}
_JUMPS = set(dis.hasjrel) | set(dis.hasjabs)


def _method_form(before, n_items, frame=None):
    """Walk back over the ``n_items`` stack items the CALL takes as arguments to the
    instruction that loaded the callable; see ``_read_site``. Straight-line argument
    code only: a jump (``a if c else b``) or an unknown stack effect gives None."""
    depth = 0
    k = len(before)
    while depth < n_items:
        k -= 1
        if k < 1:
            return None
        i = before[k]
        if i.opcode in _SKIP or i.opname in ("KW_NAMES", "PRECALL"):
            continue
        if i.opcode in _JUMPS or i.is_jump_target:
            return None
        try:
            depth += dis.stack_effect(i.opcode, i.arg, jump=False) if i.opcode >= dis.HAVE_ARGUMENT \
                else dis.stack_effect(i.opcode)
        except (ValueError, TypeError):
            return None
        if depth > n_items:
            return None
    k -= 1
    while k >= 0 and (before[k].opcode in _SKIP or before[k].opname == "PRECALL"):
        k -= 1
    if k < 1:
        return None
    loader = before[k]
    if loader.opname not in ("LOAD_METHOD", "LOAD_ATTR"):
        return None    # ``f = x.split; f(3)``: whether ``f`` is bound is not in the code
    owner = before[k - 1]
    if owner.opname not in _LOADS or not isinstance(owner.argval, str):
        return True    # ``(x + 1).split(...)``: an object computed on the spot
    if owner.opname == "LOAD_ATTR":   # ``torch.Tensor.split(x, ...)`` vs ``self.h.split(...)``
        return not owner.argval.endswith("Tensor")
    value = _MISSING
    if frame is not None:   # a name: is it bound to a class (``Tensor.split(x, ...)``)?
        value = frame.f_locals.get(owner.argval, _MISSING) if owner.opname not in ("LOAD_GLOBAL", "LOAD_NAME") \
            else _MISSING
        if value is _MISSING:
            value = frame.f_globals.get(owner.argval, frame.f_builtins.get(owner.argval, _MISSING))
    if value is _MISSING:
        return not owner.argval.endswith("Tensor")
    return not isinstance(value, type)


_MISSING = object()
