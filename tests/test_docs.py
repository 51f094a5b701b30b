"""Docs that stay true: their Python examples run as written, the JSON doc names every evidence key the
detectors write, and no file names a path of a developer's machine."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from _reports import RUNS, traces
from conftest import ROOT, loadable_runs

import tracediag

EXAMPLES = ["README.md", "docs/api.md"]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


@pytest.mark.parametrize("doc", EXAMPLES)
def test_python_examples_run_as_written(doc, tmp_path):
    """The blocks of one page, in order, as one script run from a folder that looks like the repository
    root (its fixtures), so what the examples write lands in a temporary folder."""
    blocks = python_blocks((ROOT / doc).read_text())
    assert blocks, f"{doc} has no python example"
    (tmp_path / "fixtures").symlink_to(ROOT / "fixtures")
    script = tmp_path / "example.py"
    script.write_text("\n".join(blocks))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert (tmp_path / "run.parquet").exists()


def test_the_readme_snippet_names_the_straggler():
    """What the README's snippet analyses is the bundled run whose rank 2 computes more every step."""
    (block,) = python_blocks((ROOT / "README.md").read_text())
    path = re.search(r'tracediag\.load\("([^"]+)"\)', block).group(1)
    finding = tracediag.analyze(tracediag.load(ROOT / path, jobs=1)).findings[0]
    assert (finding.cause, finding.ranks) == ("compute_straggler", (2,))


def _documented_evidence() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "analysis-json.md").read_text()
    section = text.split("Evidence keys by cause:")[1].split("\n## ")[0]
    out = {}
    for item in re.split(r"\n- ", section):
        m = re.match(r"\s*`(\w+)`:(.*)", item, flags=re.S)
        if m:
            out[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    return out


def test_json_doc_names_every_evidence_key_the_detectors_write():
    documented = _documented_evidence()
    seen: dict[str, set[str]] = {}
    for name in [p.name for p in loadable_runs()]:
        analysis = tracediag.analyze(tracediag.load(traces(RUNS / name), jobs=1))
        for f in analysis.findings:
            seen.setdefault(f.cause.value, set()).update(f.evidence)
    assert {"compute_straggler", "comm_bound", "pipeline_bubble", "input_bound", "healthy"} <= set(seen)
    for cause, keys in seen.items():
        assert keys <= documented[cause], f"{cause}: undocumented {sorted(keys - documented[cause])}"


def test_no_path_of_a_developer_machine_in_the_repository():
    listed = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files are unknown")
    machine = re.compile("|".join(["/" + "work/", "/" + "root/", "/" + r"home/\w", "/" + "tmp/"]))
    found = []
    for name in listed.stdout.splitlines():
        path = ROOT / name
        if not path.is_file() or path.suffix in {".gz", ".pb", ".parquet", ".sqlite"}:
            continue
        text = path.read_text(errors="replace")
        found += [f"{name}: {m.group(0)}" for m in machine.finditer(text)]
    assert found == []
