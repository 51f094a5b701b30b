"""Every real run under fixtures/runs holds what its manifest says: each rank, each profiled step.

Read straight from the Chrome traces (not through tracediag), so a reader bug cannot hide a fixture
that lost a rank or a step. The lateness runs (issue 24, ``make_lateness_runs.py``) also list their
files per rank (one rank may have several: profiler windows).
"""

from __future__ import annotations

import gzip
import json
from typing import TYPE_CHECKING

import pytest
from conftest import RUNS

if TYPE_CHECKING:
    from pathlib import Path

MANIFESTS = sorted(RUNS.glob("*/manifest.json"))


def _trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _markers(doc: dict) -> list[int]:
    return sorted(
        int(e["name"].split("#")[1])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
    )


def _files(sdir: Path, manifest: dict) -> dict[int, list[Path]]:
    if "files" in manifest:
        return {int(r): [sdir / n for n in names] for r, names in manifest["files"].items()}
    return {r: [sdir / f"rank{r}.pt.trace.json.gz"] for r in range(manifest["world_size"])}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.parent.name)
def test_manifest_ranks_and_steps_are_in_the_traces(path):
    sdir, manifest = path.parent, json.loads(path.read_text())
    world = manifest["world_size"]
    files = _files(sdir, manifest)
    assert sorted(files) == list(range(world))
    on_disk = sorted(p.name for p in sdir.glob("*.pt.trace.json.gz"))
    assert on_disk == sorted(p.name for fs in files.values() for p in fs)  # no stray trace, none missing
    for rank, paths in files.items():
        steps = []
        for p in paths:
            doc = _trace(p)
            info = doc["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, world, "gloo"), p.name
            steps += _markers(doc)
        assert steps == manifest["profiler_steps"], (rank, steps)
    assert set(manifest["ranks"]) <= set(range(world))
    assert set(manifest["affected_ranks"]) <= set(range(world))
    assert set(manifest["steps"]) <= set(manifest["profiler_steps"])
    assert manifest["validation"]["passed"] is True
    if manifest["cause"] != "healthy":
        assert manifest["steps"]


def test_gc_pause_records_python_gc_on_the_culprit_at_the_stated_steps_only():
    sdir = RUNS / "gc_pause"
    manifest = json.loads((sdir / "manifest.json").read_text())
    for rank in range(manifest["world_size"]):
        doc = _trace(sdir / f"rank{rank}.pt.trace.json.gz")
        ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        spans = {
            int(e["name"][13:]): (e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("ProfilerStep#")
        }
        gc_steps = sorted(
            {n for e in ev if e["name"] == "Python GC" for n, (s, t) in spans.items() if s <= e["ts"] < t}
        )
        assert gc_steps == (manifest["steps"] if rank in manifest["ranks"] else []), rank


def test_throttled_ranks_run_the_same_ops_the_culprit_longer():
    sdir = RUNS / "throttled"
    manifest = json.loads((sdir / "manifest.json").read_text())
    counts, total = [], []
    for rank in range(manifest["world_size"]):
        ops = [e for e in _trace(sdir / f"rank{rank}.pt.trace.json.gz")["traceEvents"] if e.get("cat") == "cpu_op"]
        names: dict[str, int] = {}
        for e in ops:
            names[e["name"]] = names.get(e["name"], 0) + 1
        counts.append(names)
        total.append(sum(e["dur"] for e in ops if e["name"].startswith("aten::")))
    assert all(c == counts[0] for c in counts)  # same op names, same counts on every rank
    (culprit,) = manifest["ranks"]
    assert total[culprit] > 1.5 * sorted(t for r, t in enumerate(total) if r != culprit)[1]
