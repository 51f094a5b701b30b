"""The cause registry (`tracediag.causes`): every cause registered once, addressed by its `Cause`
member; no code tests a cause by its name; imports run one way (detect/ and whatif/ below causes/)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from conftest import FIXTURES

import tracediag
from tracediag import causes
from tracediag.analysis import Cause
from tracediag.causes import REGISTRY, spec_of

PACKAGE = Path(tracediag.__file__).parent
RUNS = FIXTURES / "runs"


def _load(name: str):
    return tracediag.load(sorted((RUNS / name).glob("rank*.pt.trace.json.gz")), jobs=1)


def test_every_cause_registered_once_in_its_own_module():
    registered = [s.cause for s in REGISTRY]
    assert sorted(registered) == sorted(c for c in Cause if c != Cause.HEALTHY)
    for spec in REGISTRY:
        assert spec_of(spec.cause.value) is spec
        # the spec lives in causes/<cause>.py
        assert (PACKAGE / "causes" / f"{spec.cause.value}.py").exists()
    with pytest.raises(KeyError):
        spec_of(Cause.HEALTHY)


def _is_cause(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "cause") or (
        isinstance(node, ast.Name) and node.id == "cause"
    )


def _names_a_cause(node: ast.AST) -> bool:
    """A string literal that is a cause's value, or a tuple/list/set of them."""
    values = {c.value for c in Cause}
    if isinstance(node, ast.Constant):
        return node.value in values
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_cause(e) for e in node.elts)
    return False


def test_no_code_compares_a_cause_with_its_name():
    hits = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_is_cause(s) for s in sides) and any(_names_a_cause(s) for s in sides):
                    hits.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert hits == []


def _imports(folder: str) -> set[str]:
    out = set()
    for path in (PACKAGE / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
    return out


def test_imports_run_one_way():
    detect = _imports("detect")
    whatif = _imports("whatif")
    assert not {m for m in detect if m.startswith(("tracediag.whatif", "tracediag.causes"))}
    assert not {m for m in whatif if m.startswith("tracediag.causes")}


def test_healthy_lists_every_registered_measure():
    """The healthy finding's sentence comes from the specs: each registered cause's measure is named."""
    (f,) = tracediag.analyze(_load("healthy_ddp")).findings
    assert f.cause == Cause.HEALTHY
    for spec in REGISTRY:
        assert spec.quiet in f.summary


def test_a_cause_is_detected_and_priced_through_its_spec(monkeypatch):
    """The registry is the only way in: the straggler run's finding disappears when its spec's detector
    finds nothing, and its what-if sentence opens with what its spec says was removed."""
    run = _load("straggler_persistent")
    (f,) = tracediag.analyze(run).findings
    assert f.cause == Cause.COMPUTE_STRAGGLER
    assert f.whatif.startswith(f"without rank {f.ranks[0]}'s extra compute (")
    spec = spec_of(Cause.COMPUTE_STRAGGLER)
    silent = dataclasses.replace(spec, detect=lambda ctx: [])
    monkeypatch.setattr(causes, "REGISTRY", tuple(silent if s is spec else s for s in REGISTRY))
    assert Cause.COMPUTE_STRAGGLER not in [g.cause for g in tracediag.analyze(run).findings]
