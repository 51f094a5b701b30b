"""`-j`/`--jobs`: 0 is automatic, N >= 1 a process count; anything else is refused saying both."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import RUNS

from tracediag.cli import cli

RUN = str(RUNS / "healthy_ddp")
ACCEPTED = "give 0 (automatic) or a number of processes N >= 1"


@pytest.mark.parametrize("value", ["-1", "-300", "abc", "1.5", ""])
@pytest.mark.parametrize("command", [["analyze", RUN], ["ingest", RUN], ["compare", RUN, RUN]])
def test_a_bad_process_count_names_what_is_accepted(runner, command: list[str], value: str) -> None:
    result = runner.invoke(cli, [*command, "-j", value])
    assert result.exit_code == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"Error: Invalid value for '--jobs' / '-j': {value!r}: {ACCEPTED}"


def test_the_environment_variable_is_checked_as_the_option(runner) -> None:
    result = runner.invoke(cli, ["analyze", RUN], env={"TRACEDIAG_JOBS": "-1"})
    assert result.exit_code == 2
    assert ACCEPTED in result.stderr


@pytest.mark.parametrize("value", ["0", "1", "10" * 20])
def test_automatic_one_and_more_than_the_cpus_read_the_same_table(runner, tmp_path, value: str) -> None:
    """A count past the CPUs is capped, not refused, and reads what -j 1 reads."""
    out = tmp_path / f"j{len(value)}.parquet"
    result = runner.invoke(cli, ["ingest", RUN, "-j", value, "-o", str(out)])
    assert result.exit_code == 0, result.output
    ref = tmp_path / "ref.parquet"
    assert runner.invoke(cli, ["ingest", RUN, "-j", "1", "-o", str(ref)]).exit_code == 0
    assert pl.read_parquet(out).equals(pl.read_parquet(ref))
