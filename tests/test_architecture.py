"""The import rule of docs/architecture.md, checked on the source: no import cycle between modules, and
no module importing a later stage than its own.

The stage order is read from the doc's ``stages`` block, so the doc and this test cannot disagree. Every
import counts, including those under ``TYPE_CHECKING`` and inside functions: a lazy import hides a cycle
from the interpreter, not from the reader. `KNOWN_CLIMBS` and `KNOWN_CYCLES` are the edges still
breaking the rule, each with the issue that removes it; the test fails when a new one appears and when
a listed one is gone (then delete it from the list), so the list only shrinks.
"""

from __future__ import annotations

import ast
import re

from conftest import ROOT

PACKAGE = ROOT / "tracediag"
DOC = ROOT / "docs" / "architecture.md"

KNOWN_CLIMBS: dict[tuple[str, str], str] = {}
"""(importer, imported) module pairs where an earlier stage imports a later one, with the issue fixing it."""
KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Modules importing each other in a circle, with the issue fixing it."""


def stages() -> list[set[str]]:
    """The doc's stage order: one line per stage, its folders and top-level modules first."""
    block = re.search(r"```text stages\n(.*?)```", DOC.read_text(), re.S)
    assert block, f"{DOC.name} has no ```text stages block"
    rows = [line.split("#")[0].split() for line in block.group(1).splitlines()]
    return [set(row[1:]) for row in rows if row]


def modules() -> dict[str, ast.Module]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return out


def imports(mods: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(importer, imported) pairs between the package's modules."""
    edges = set()
    for name, tree in mods.items():
        is_package = (PACKAGE / "/".join(name.split(".")[1:]) / "__init__.py").exists()
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:  # `import tracediag.x.y` names a module, not an attribute
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add((name, target))
    return edges


def stage_of(module: str, order: list[set[str]]) -> int:
    """The stage of a module: that of its folder (or its own name, for a top-level module)."""
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    found = [i for i, names in enumerate(order) if key in names]
    assert len(found) == 1, f"{key} is in {len(found)} stages of {DOC.name}: place it in exactly one"
    return found[0]


def cycles(edges: set[tuple[str, str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        u = stack.pop()
                        on_stack.discard(u)
                        comp.add(u)
                        if u == v:
                            break
                    if len(comp) > 1:
                        out.add(frozenset(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(graph[w])))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
    return out


def test_the_walker_sees_imports_of_every_form():
    """The walker's view of a few imports this package is known to make (absolute, lazy, TYPE_CHECKING)."""
    edges = imports(modules())
    assert ("tracediag.reduce", "tracediag.causes") in edges  # `from tracediag.causes import ...`
    assert ("tracediag.execute.driver", "tracediag.reduce") in edges  # inside a function
    assert ("tracediag.observed_vs_predicted", "tracediag.analysis") in edges  # under TYPE_CHECKING
    assert ("tracediag", "tracediag.ingest.workers") in edges  # `import tracediag.ingest.workers`
    assert cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == {frozenset("abc")}


def test_every_folder_has_a_stage():
    order = stages()
    names = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    placed = set().union(*order)
    assert names - placed == set(), f"not placed in {DOC.name}'s stages"
    assert placed - names == set(), f"{DOC.name} places what the package does not have"


def test_no_import_climbs_to_a_later_stage():
    order = stages()
    climbs = {(a, b) for a, b in imports(modules()) if stage_of(b, order) > stage_of(a, order)}
    assert climbs - KNOWN_CLIMBS.keys() == set(), "new imports from an earlier stage into a later one"
    assert KNOWN_CLIMBS.keys() - climbs == set(), "fixed: delete these from KNOWN_CLIMBS"


def test_no_import_cycles():
    found = cycles(imports(modules()))
    assert found - KNOWN_CYCLES.keys() == set(), "new import cycles"
    assert KNOWN_CYCLES.keys() - found == set(), "fixed: delete these from KNOWN_CYCLES"


def test_the_model_reads_no_files():
    """The analytic model (calibration included) computes over tables: no module of `model/` imports a
    reader; `calibrate` is given the GEMM table `ingest.gemms` reads (issue 27, item 3)."""
    edges = imports(modules())
    readers = {(a, b) for a, b in edges if a.startswith("tracediag.model") and b.startswith("tracediag.ingest")}
    assert readers == set()
    assert ("tracediag.cli.calibrate", "tracediag.ingest.gemms") in edges
