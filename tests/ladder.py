"""The import ladder as data, and a checker that reads every import of every module with ``ast``.

``import_graph`` finds, in each module of a source tree, every ``import`` / ``from … import`` statement (at module
level, inside functions and classes, under ``if`` / ``try``) and every ``importlib.import_module("literal")``, and
resolves each to the project module it loads. ``climbs`` reports an import from a rung to a rung above it (or from
one adapter to another); ``circles`` reports the strongly connected parts of the graph (function-level imports count:
a circle that only closes at call time is still a circle, it just fails later).

Pure standard library, so ``tests/test_layers.py`` can run it over the real tree and over a synthetic one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (a project module when it resolves to one)
    line: int
    nested: bool  # inside a function or class body (runs at call time, not at import time)

    def where(self) -> str:
        return f"{self.source}:{self.line}{' (in a function)' if self.nested else ''}"


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (the folder of top-level ``package``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package, *parts])] = path
    return out


def _resolve(name: str, known: set[str]) -> str:
    """The longest known module that ``name`` starts with (``pkg.mod.attr`` -> ``pkg.mod``), else ``name``."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return name


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]):
        self.module, self.known, self.depth = module, known, 0
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[Import] = []

    def _add(self, name: str, node: ast.AST) -> None:
        self.found.append(Import(self.module, _resolve(name, self.known), node.lineno, self.depth > 0))

    def _nested(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _nested

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
        else:
            stem = node.module or ""
        for alias in node.names:  # ``from pkg import mod`` loads pkg.mod when it is a module, else pkg
            full = f"{stem}.{alias.name}"
            self._add(full if full in self.known else stem, node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        named = (isinstance(func, ast.Attribute) and func.attr == "import_module"
                 and isinstance(func.value, ast.Name) and func.value.id == "importlib") or (
                 isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
        if named and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self._add(node.args[0].value, node)
        self.generic_visit(node)


def import_graph(trees: dict[str, Path]) -> list[Import]:
    """Every import of every module under ``trees`` (top-level name -> folder, e.g. {"specdiff": .../specdiff})."""
    files: dict[str, Path] = {}
    for package, root in trees.items():
        files.update(module_files(root, package))
    known = set(files)
    found = []
    for module, path in files.items():
        finder = _Finder(module, path.name == "__init__.py", known)
        finder.visit(ast.parse(path.read_text(), str(path)))
        found.extend(finder.found)
    return found


def rung_of(module: str, rungs: dict[str, int]) -> tuple[str, int] | None:
    """(prefix, rung) of the longest prefix in ``rungs`` that ``module`` is or lies under; None when none does."""
    hits = [p for p in rungs if module == p or module.startswith(p + ".")]
    if not hits:
        return None
    best = max(hits, key=len)
    return best, rungs[best]


@dataclass(frozen=True)
class Climb:
    imp: Import
    why: str

    def __str__(self) -> str:
        return f"{self.imp.where()} imports {self.imp.target}: {self.why}"


def climbs(imports: list[Import], rungs: dict[str, int], adapters: frozenset[str] = frozenset()) -> list[Climb]:
    """Imports that climb the ladder: to a higher rung, or from one adapter (a prefix in ``adapters``) to another.
    Modules outside ``rungs`` (the standard library, frameworks) are not this check's business."""
    out = []
    for imp in imports:
        src, dst = rung_of(imp.source, rungs), rung_of(imp.target, rungs)
        if src is None or dst is None:
            continue
        if dst[1] > src[1]:
            out.append(Climb(imp, f"rung {dst[0]} ({dst[1]}) is above {src[0]} ({src[1]})"))
        elif src[0] != dst[0] and src[0] in adapters and dst[0] in adapters:
            out.append(Climb(imp, f"adapter {src[0]} must not import adapter {dst[0]}"))
    return out


def _under(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def foreign(imports: list[Import], allowed: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
            frameworks: tuple[str, ...]) -> list[Climb]:
    """Imports of a framework (a top-level name in ``frameworks``) by a part not allowed to use it, function bodies
    included. ``allowed``: prefix -> (frameworks it may import, sub-modules of those it may not), longest prefix wins;
    a part outside ``allowed`` may import every framework."""
    out = []
    for imp in imports:
        if imp.target.split(".")[0] not in frameworks:
            continue
        found = rung_of(imp.source, dict.fromkeys(allowed, 0))
        if found is None:
            continue
        may, may_not = allowed[found[0]]
        if not _under(imp.target, may) or _under(imp.target, may_not):
            out.append(Climb(imp, f"{found[0]} may import {', '.join(may) or 'no framework'}"
                                  + (f" (not {', '.join(may_not)})" if may_not else "")))
    return out


def circles(imports: list[Import], modules: set[str] | None = None) -> list[list[str]]:
    """Import circles: the strongly connected components (two or more modules, or one importing itself) of the
    graph over ``modules`` (default: every importing module), each sorted, the list sorted (Tarjan's algorithm)."""
    nodes = modules if modules is not None else {i.source for i in imports}
    edges: dict[str, set[str]] = {n: set() for n in nodes}
    for imp in imports:
        if imp.source in nodes and imp.target in nodes:
            edges[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth: the longest import chain, a few dozen at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1 or node in edges[node]:
                found.append(sorted(part))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(found)
