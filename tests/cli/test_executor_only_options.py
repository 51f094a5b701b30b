"""The summary path's options (--out, --resume, --retries, --address, --scheduler-file) given without
--executor are refused, not ignored: the run is read into this process then, and nothing is written there."""

from __future__ import annotations

import pytest
from conftest import RUNS

from tracediag.cli import cli

RUN = str(RUNS / "healthy_ddp")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--out", "{tmp}/summaries"], "--out applies"),
        (["--resume"], "--resume applies"),
        (["--retries", "3"], "--retries applies"),
        (["--address", "127.0.0.1:1"], "--address applies"),
        (["--out", "{tmp}/s", "--resume"], "--out, --resume apply"),
    ],
)
@pytest.mark.parametrize("command", [["analyze", RUN], ["ingest", RUN, "-o", "{tmp}/events.parquet"]])
def test_an_option_of_the_summary_path_without_executor_is_refused(
    runner, tmp_path, command: list[str], options: list[str], named: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in [*command, *options]]
    result = runner.invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {named} to the summary path: add --executor local (or ray, dask)"
    )
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_default_retries_is_not_taken_for_a_given_option(runner) -> None:
    result = runner.invoke(cli, ["analyze", RUN])
    assert result.exit_code == 0, result.output
