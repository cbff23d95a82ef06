"""The code's shape: probe's modules import each other without a cycle, and no module
imports another's private names.

The import graph is read with ``ast`` from every module under ``probe/``, function-level
imports included (a cycle hidden inside a function still ties the two modules together:
neither can be understood, moved or tested without the other). ``from pkg import name``
counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "probe")


def _modules():
    """module name -> (file path, is a package's __init__). A C extension is known by
    its type stub (``_cjoin.pyi``): a module of its own, importing nothing of probe."""
    out = {}
    for folder, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith((".py", ".pyi")):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT).rpartition(".")[0].replace(os.sep, ".")
                is_init = name.endswith(".__init__")
                out[name[:-len(".__init__")] if is_init else name] = (path, is_init)
    return out


def _targets(module, is_init, node, modules):
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            parts = module.split(".")
            if not is_init:
                parts = parts[:-1]
            parts = parts[:len(parts) - node.level + 1]
            base = ".".join(parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    for name in names:
        while name and name not in modules:       # probe.x.y.attr -> probe.x.y
            name = name.rpartition(".")[0]
        if name and name != module:
            yield name


def import_graph():
    """module -> {imported module: first line importing it}, probe's modules only."""
    modules = _modules()
    graph = {}
    for module, (path, is_init) in modules.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        edges = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, is_init, node, modules):
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_graph_sees_function_level_imports():
    graph = import_graph()
    assert "probe.vocabulary" in graph["probe.compare.match"]
    assert len(graph) > 100


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    described = []
    for comp in found:
        members = set(comp)
        described.append("; ".join(f"{m}:{line} -> {t}" for m in comp
                                   for t, line in sorted(graph[m].items()) if t in members))
    assert not found, "import cycles:\n" + "\n".join(described)


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]


def private_imports():
    """``module:line imports _name from other`` for each private name (``_x``, not a dunder,
    not a module such as a C extension) that a probe module takes from another probe module,
    function-level imports included: a private name is its module's own business."""
    modules = _modules()
    found = []
    for module, (path, is_init) in modules.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            sources = set(_targets(module, is_init, node, modules))
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if any(s.endswith("." + name) for s in sources):   # a module (a C extension)
                    continue
                if sources:
                    found.append(f"{module}:{node.lineno} imports {name} from {', '.join(sorted(sources))}")
    return found


def test_no_private_names_imported_across_modules():
    found = private_imports()
    assert not found, "private names imported:\n" + "\n".join(found)
