"""The stages' import graph: no cycle among detload's modules, and planning and the engine
never import each other, directly or through another module.

Read from the source with ast (nothing is imported): every ``import``/``from ... import`` of
a detload module, at the top of a module or inside a function, except those only a type
checker sees (``if TYPE_CHECKING:``). A module's import of ``a.b.c`` also runs ``a.b``'s
``__init__``, so a package counts as imported by each import of one of its modules (from
outside the package: inside it, the package was initialised first).
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "detload")
PLANNING = "detload.planning"
ENGINE = "detload._engine"
# The PyTorch adapter's own cycle (torch.py <-> _pinned.py) is removed with the adapter's
# package of hand-offs, on its own line of work; nothing else may close a cycle.
KNOWN_CYCLES: list[list[str]] = []


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str, path: str, known: set[str]) -> tuple[set[str], set[str]]:
    """(every detload module ``module`` imports, those imported at module level)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    every: set[str] = set()
    top: set[str] = set()

    def add(name: str, at_top: bool) -> None:
        parts = name.split(".")
        for i in range(2, len(parts) + 1):  # the packages on the way run their __init__ too
            target = ".".join(parts[:i])
            # ... unless this module is inside one: its package was initialised before it ran.
            if target in known and not _in(target, module):
                every.add(target)
                if at_top:
                    top.add(target)

    def visit(node: ast.AST, at_top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            inner = at_top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, at_top)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                add(target, at_top)
                for alias in child.names:  # `from . import x` and `from .pkg import mod`
                    add(f"{target}.{alias.name}", at_top)
            visit(child, inner)

    visit(tree, True)
    return every, top


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = _modules()
    known = set(mods)
    every, top = {}, {}
    for m, p in mods.items():
        every[m], top[m] = _imports(m, p, known)
    return every, top


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _in(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_is_read_from_the_source():
    every, top = _graph()
    assert "detload._engine.worker" in every["detload._engine.pool"]  # a plain relative import
    assert "detload.planning.groups" in every["detload.planning.stage"]  # an import inside a function
    assert "detload.planning.groups" not in top["detload.planning.stage"]
    assert "detload._read" in every["detload._engine.worker"]  # a package's __init__ runs too
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_detload_modules():
    every, _ = _graph()
    assert _cycles(every) == KNOWN_CYCLES


def test_planning_and_the_engine_never_import_each_other():
    every, top = _graph()
    for m in every:
        if _in(PLANNING, m):
            assert not [t for t in every[m] if _in(ENGINE, t)], f"{m} imports the engine"
            reached = sorted(t for t in _reach(top, m) if _in(ENGINE, t))
            assert not reached, f"{m} reaches the engine through its imports: {reached}"
        if _in(ENGINE, m):
            assert not [t for t in every[m] if _in(PLANNING, t)], f"{m} imports planning"
            reached = sorted(t for t in _reach(top, m) if _in(PLANNING, t))
            assert not reached, f"{m} reaches planning through its imports: {reached}"


def test_the_shared_reader_sits_below_both():
    every, _ = _graph()
    assert "detload._read" in every["detload.planning.transform"]
    assert "detload._read" in every["detload._engine.worker"]
    for m in every:
        if _in("detload._read", m):
            assert not [t for t in _reach(every, m) if _in(ENGINE, t) or _in(PLANNING, t)], m
