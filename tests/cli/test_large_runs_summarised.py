"""A run too large to hold in memory is summarised rank by rank without an option to know (issue 31 item 1):
`analyze` switches to the summary path (`--executor local`) past `driver.SUMMARY_PATH_BYTES`, says so in one
line, and answers exactly as in memory; a damaged file is an error line and the others are analysed, as in
memory. Tested on real runs with the threshold lowered, since a real run past 512 MB is not in the repo."""

from __future__ import annotations

import gzip
import shutil

import orjson
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from tracediag.cli import cli
from tracediag.execute import driver

SAID = "each rank summarised in worker processes (as --executor local), not held in memory"


def _analyze(args: list[str]):
    result = CliRunner().invoke(cli, ["analyze", *args])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("name", ["straggler_persistent", "slow_node_6", "pipeline_1f1b_m8"])
def test_past_the_threshold_the_answer_is_the_in_memory_one(name, monkeypatch):
    run = str(FIXTURES / "runs" / name)
    in_memory = _analyze([run, "--format", "json"])
    assert SAID not in in_memory.stderr
    monkeypatch.setattr(driver, "SUMMARY_PATH_BYTES", 1)
    summarised = _analyze([run, "--format", "json", "-j", "1"])
    assert summarised.stderr.count(SAID) == 1
    assert orjson.loads(summarised.stdout) == orjson.loads(in_memory.stdout)


def test_the_estimate_counts_gzip_by_its_ratio(tmp_path):
    run = FIXTURES / "runs" / "straggler_persistent"
    traces = sorted(run.glob("*.json.gz"))
    gz = sum(p.stat().st_size for p in traces)
    plain = tmp_path / "rank0.json"
    plain.write_bytes(gzip.decompress(traces[0].read_bytes()))
    assert driver.decoded_bytes([str(p) for p in traces]) == gz * driver.GZIP_RATIO
    assert driver.decoded_bytes(str(plain)) == plain.stat().st_size


def test_a_damaged_file_is_an_error_line_and_the_others_are_analysed_as_in_memory(tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "runs" / "straggler_persistent", run)
    (run / "rank3.pt.trace.json.gz").write_bytes(b"\x1f\x8b\x08\x00 not gzip")
    in_memory = _analyze([str(run)])
    monkeypatch.setattr(driver, "SUMMARY_PATH_BYTES", 1)
    summarised = _analyze([str(run), "-j", "1"])
    errors = [line for line in summarised.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [line for line in in_memory.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1
    assert "rank3.pt.trace.json.gz" in errors[0]
    assert summarised.stdout == in_memory.stdout


def test_outputs_that_need_the_events_keep_them_here(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "SUMMARY_PATH_BYTES", 1)
    run = str(FIXTURES / "runs" / "straggler_persistent")
    for option in ("--perfetto", "--html"):
        result = _analyze([run, option, str(tmp_path / f"out{option}")])
        assert SAID not in result.stderr
