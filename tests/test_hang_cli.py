"""`tracediag hang`: the wiring only (exit codes, formats, one-line errors); the analysis is tested on
the library (test_hang_fixtures.py)."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from tracediag.cli import cli

HANG = FIXTURES / "hang"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_hang_found_exits_3_with_the_sentence_first(runner):
    result = runner.invoke(cli, ["hang", str(HANG / "host_stuck")])
    assert result.exit_code == 3
    assert result.stdout.startswith("Rank 2 never entered all_reduce #25 of group 0 (default_pg)")
    assert "group 0 (default_pg): hang" in result.stdout


def test_consistent_exits_0(runner):
    result = runner.invoke(cli, ["hang", str(HANG / "healthy"), "--format", "json"])
    assert result.exit_code == 0
    assert orjson.loads(result.stdout)["verdict"] == "consistent"


def test_html_escapes_what_the_dumps_say(runner, tmp_path):
    out = tmp_path / "hang.html"
    result = runner.invoke(cli, ["hang", str(HANG / "killed"), "--format", "html", "-o", str(out)])
    assert result.exit_code == 3
    page = out.read_text()
    assert "<section class='hang'>" in page
    assert "rank 3 wrote no dump" in page


@pytest.mark.parametrize(
    "args",
    [
        ["hang", "missing_dir/"],
        ["hang", str(HANG / "healthy" / "manifest.json")],
        ["hang", str(HANG / "healthy"), "--rank-from-filename", "("],
    ],
    ids=["missing", "not_a_dump", "bad_regex"],
)
def test_bad_input_exits_2_with_one_line(runner, args):
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: ")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output
