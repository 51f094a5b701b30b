"""Every command that reads a directory says the same of the files in it that are not traces (issue 30 item 5):
the real run folders hold a manifest.json beside the traces; analyze (text and JSON, in memory and on an
executor), ingest and calibrate each name it once, with its reason."""

from __future__ import annotations

import shutil

import orjson
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from tracediag.cli import cli

RUN = FIXTURES / "runs" / "straggler_persistent"


@pytest.fixture
def folder(tmp_path):
    """The real run with one more non-trace file: two ignored, in a stable order."""
    out = tmp_path / "run"
    shutil.copytree(RUN, out)
    (out / "notes.json").write_bytes(b'{"lr": 0.1}')
    return out


def _ignored_line(text: str) -> list[str]:
    return [line for line in text.splitlines() if "in the directories ignored" in line]


@pytest.mark.parametrize("extra", [[], ["--executor", "local"]], ids=["in-memory", "executor"])
def test_analyze_names_the_non_trace_files_it_skipped(folder, extra):
    result = CliRunner().invoke(cli, ["analyze", str(folder), *extra])
    assert result.exit_code == 0, result.output
    (line,) = _ignored_line(result.output)
    assert line.startswith("warning: 2 files in the directories ignored (not traces: ")
    assert "manifest.json: not a trace" in line
    assert line.endswith(" and 1 more)")


def test_analyze_json_carries_the_same_warning(folder):
    result = CliRunner().invoke(cli, ["analyze", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    warnings = orjson.loads(result.stdout)["warnings"]
    assert sum("2 files in the directories ignored" in w for w in warnings) == 1


def test_ingest_and_calibrate_count_them_alike(folder, tmp_path):
    ingest = CliRunner().invoke(cli, ["ingest", str(folder)])
    assert ingest.exit_code == 0, ingest.output
    assert "2 in the directories ignored (not traces: " in ingest.output
    calibrate = CliRunner().invoke(
        cli, ["calibrate", str(folder), "--gpu", "a100-80gb", "-o", str(tmp_path / "p.json")]
    )
    analyze = CliRunner().invoke(cli, ["analyze", str(folder)])
    assert _ignored_line(calibrate.output) == _ignored_line(analyze.output)
