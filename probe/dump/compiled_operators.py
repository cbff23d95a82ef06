"""Which Python operator a compiled graph's node stands for, read from its source line.

An eager run names ``a * 2`` ``Tensor.__mul__`` and ``a.mul(2)`` ``Tensor.mul``: the
interceptor reads the caller's instruction (``hook_module/operators.py``). Dynamo's graph
has lost that difference: traced under probe's function mode both are ``call_method mul``.
What is left is the node's ``stack_trace``: the user's file and line. The line's
expression tree, walked in Python's evaluation order, gives its operators and method calls
in the order the graph holds its nodes; a node is matched to the next event of its kind.

    names = OperatorNames()
    names.event(node_method="mul", filename, line)  ->  ("op", "__mul__") / ("call", None)

Files are parsed once (``ast``); a line that cannot be read gives no events, and the node
keeps its method's name.
"""
from __future__ import annotations

import ast
import linecache
from typing import Dict, List, Optional, Tuple

_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
           ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "and", ast.BitOr: "or",
           ast.BitXor: "xor", ast.LShift: "lshift", ast.RShift: "rshift"}
_UNARY = {ast.USub: "neg", ast.Invert: "invert", ast.UAdd: "pos"}
_COMPARE = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}

# the names a graph node of each operator has (the method or torch function it became)
_NODE_NAMES = {
    "add": {"add"}, "sub": {"sub", "subtract"}, "mul": {"mul", "multiply"},
    "truediv": {"div", "true_divide", "divide"}, "floordiv": {"floor_divide"},
    "mod": {"remainder", "fmod"}, "pow": {"pow"}, "matmul": {"matmul"},
    "and": {"bitwise_and", "__and__", "logical_and"}, "or": {"bitwise_or", "__or__", "logical_or"},
    "xor": {"bitwise_xor", "__xor__"}, "lshift": {"bitwise_left_shift", "__lshift__"},
    "rshift": {"bitwise_right_shift", "__rshift__"}, "neg": {"neg", "negative"},
    "invert": {"bitwise_not", "logical_not"}, "pos": {"positive"},
    "eq": {"eq"}, "ne": {"ne"}, "lt": {"lt"}, "le": {"le"}, "gt": {"gt"}, "ge": {"ge"},
    "getitem": {"getitem"}, "setitem": {"setitem"},
}
_IN_PLACE = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
             "lshift", "rshift"}


def _is_number(node):
    """Is ``node`` a plain number's expression (``2``, ``-1.0``, ``math.sqrt(2 / math.pi)``)?
    Then a tensor on its right makes the operator reflected (``__rmul__``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "math"
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math") or \
            (isinstance(f, ast.Name) and f.id in ("float", "int"))
    return False


class _Events(ast.NodeVisitor):
    """(line, kind, dunder or method) in evaluation order: operands before their operator."""

    def __init__(self):
        self.events: List[Tuple[int, str, str]] = []

    def visit_BinOp(self, node):
        self.visit(node.left)
        self.visit(node.right)
        op = _BINARY.get(type(node.op))
        if op is not None:
            self.events.append((node.lineno, op, f"__r{op}__" if _is_number(node.left) else f"__{op}__"))

    def visit_UnaryOp(self, node):
        self.visit(node.operand)
        op = _UNARY.get(type(node.op))
        if op is not None:
            self.events.append((node.lineno, op, f"__{op}__"))

    def visit_Compare(self, node):
        self.visit(node.left)
        for c in node.comparators:
            self.visit(c)
        for o in node.ops:
            op = _COMPARE.get(type(o))
            if op is not None:
                self.events.append((node.lineno, op, f"__{op}__"))

    def visit_AugAssign(self, node):
        self.visit(node.value)
        op = _BINARY.get(type(node.op))
        if op in _IN_PLACE:
            self.events.append((node.lineno, op, f"__i{op}__"))

    def visit_Subscript(self, node):
        self.visit(node.value)
        self.visit(node.slice)
        kind = "setitem" if isinstance(node.ctx, ast.Store) else "getitem"
        self.events.append((node.lineno, kind, f"__{kind}__"))

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name is not None:
            self.events.append((node.lineno, "call", name))


class OperatorNames:
    """Per compiled graph: matches its operator-like nodes to their source's events."""

    _files: Dict[str, Optional[Dict[int, List[Tuple[str, str]]]]] = {}

    def __init__(self):
        self._next: Dict[Tuple[str, int], int] = {}

    @classmethod
    def _line_events(cls, filename, line):
        events = cls._files.get(filename, False)
        if events is False:
            events = None
            text = "".join(linecache.getlines(filename))
            if text:
                try:
                    tree = ast.parse(text)
                except SyntaxError:
                    tree = None
                if tree is not None:
                    visitor = _Events()
                    visitor.visit(tree)
                    events = {}
                    for lineno, kind, name in visitor.events:
                        events.setdefault(lineno, []).append((kind, name))
            cls._files[filename] = events
        return None if events is None else events.get(line, [])

    def dunder(self, node_name, filename, line):
        """The dunder (``__mul__``) the node named ``node_name`` ran as at ``filename:line``,
        or None where the source called a method (``a.mul(2)``) or can't be read."""
        events = self._line_events(filename, line)
        if not events:
            return None
        key = (filename, line)
        first = self._next.get(key, 0)
        # from where the last match on this line left off; a line run again (a loop, the
        # next layer) starts over
        for i in list(range(first, len(events))) + list(range(first)):
            kind, name = events[i]
            if kind == "call" and name == node_name:
                self._next[key] = i + 1
                return None
            if kind != "call" and _matches(kind, name, node_name):
                self._next[key] = i + 1
                return name
        return None


def _matches(kind, dunder, node_name):
    names = _NODE_NAMES.get(kind, ())
    if kind in _IN_PLACE and dunder == f"__i{kind}__":
        return node_name.endswith("_") and node_name[:-1] in names
    return node_name in names


OPERATOR_NODE_NAMES = frozenset(n for names in _NODE_NAMES.values() for n in names) | \
    frozenset(n + "_" for k in _IN_PLACE for n in _NODE_NAMES[k])
