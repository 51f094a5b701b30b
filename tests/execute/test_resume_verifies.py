"""`--resume` reuses a summary only when it reads back whole; `--out` that is a file is one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from conftest import RUNS

from tracediag.cli import cli

if TYPE_CHECKING:
    from pathlib import Path

RUN = str(RUNS / "healthy_ddp")


def _damage(path: Path) -> None:
    """XOR every 97th byte past the first third: the real table's footer and pages no longer decode."""
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 3, len(data) - 8, 97):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _analyze(runner, out: Path, *more: str):
    return runner.invoke(
        cli, ["analyze", RUN, "--executor", "local", "-j", "2", "--out", str(out), "--format", "json", *more]
    )


def test_damaged_summaries_are_redone_with_a_warning_naming_them(runner, tmp_path: Path) -> None:
    """Was an internal error (ComputeError: Invalid thrift / Unexpected EOF), exit 1."""
    out = tmp_path / "out"
    first = _analyze(runner, out)
    assert first.exit_code == 0, first.output
    damaged = sorted((out / "ranks" / "rank=00002").glob("*.parquet"))
    assert damaged
    for table in damaged:
        _damage(table)
    with pytest.warns(UserWarning, match="does not read back") as caught:
        again = _analyze(runner, out, "--resume")
    assert again.exit_code == 0, again.output
    assert again.stdout == first.stdout  # the same analysis as from a clean run
    warned = [str(w.message) for w in caught if "does not read back" in str(w.message)]
    assert len(warned) == 1
    assert warned[0].startswith(f"tracediag: {out / 'ranks' / 'rank=00002'}: a previous run's summary")
    assert warned[0].endswith("; redone")


def _assert_redone(runner, out: Path, first_stdout: str, table: Path) -> None:
    """`--resume` warns once that `table`'s rank summary has another schema, redoes it, and says the same."""
    with pytest.warns(UserWarning, match="does not read back") as caught:
        again = _analyze(runner, out, "--resume")
    assert again.exit_code == 0, again.output
    assert again.stdout == first_stdout
    warned = [str(w.message) for w in caught if "does not read back" in str(w.message)]
    assert warned == [
        f"tracediag: {table.parent}: a previous run's summary does not read back "
        f"(ValueError: {table.name} has other columns or types than this version's summaries); redone"
    ]


def test_a_summary_that_reads_with_other_columns_is_redone(runner, tmp_path: Path) -> None:
    """Found by benchmarks/fuzz_campaign.py: a byte flipped in a column name of one rank's table still read
    back alone, so the summary was reused, and concatenating the ranks failed (SchemaError, exit 1)."""
    import polars as pl

    out = tmp_path / "out"
    first = _analyze(runner, out)
    assert first.exit_code == 0, first.output
    table = out / "ranks" / "rank=00002" / "replay_sync.parquet"
    pl.read_parquet(table).rename({"bytes": "byte]"}).write_parquet(table)
    _assert_redone(runner, out, first.stdout, table)


def test_a_summary_of_the_older_kernel_schema_is_redone(runner, tmp_path: Path) -> None:
    """Summaries written before the per-step kernel table's ``count`` became Int32 and its ``category`` an Enum
    (Int64 and Categorical, the same rows) read back whole, but would not concatenate with new ranks'."""
    import polars as pl

    out = tmp_path / "out"
    first = _analyze(runner, out)
    assert first.exit_code == 0, first.output
    table = out / "ranks" / "rank=00001" / "kernels.parquet"
    new = pl.read_parquet(table)
    assert (new.schema["count"], new.schema["category"]) == (
        pl.Int32(),
        pl.Enum(["communication", "compute", "memory"]),
    )
    new.with_columns(
        pl.col("count").cast(pl.Int64), pl.col("category").cast(pl.String).cast(pl.Categorical)
    ).write_parquet(table)
    _assert_redone(runner, out, first.stdout, table)
    assert pl.read_parquet(table).schema == new.schema  # rewritten in the new schema


@pytest.mark.filterwarnings("error::UserWarning")
def test_intact_summaries_are_reused_without_a_warning(runner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _analyze(runner, out).exit_code == 0
    table = next((out / "ranks" / "rank=00001").glob("*.parquet"))
    written = table.stat().st_mtime_ns
    again = _analyze(runner, out, "--resume")
    assert again.exit_code == 0
    assert table.stat().st_mtime_ns == written  # not rewritten


@pytest.mark.parametrize("command", ["analyze", "ingest"])
def test_out_naming_a_file_is_one_line_exit_2(runner, tmp_path: Path, command: str) -> None:
    """Was FileExistsError, exit 1; the file is left as it was."""
    taken = tmp_path / "taken"
    taken.write_text("mine")
    for out, why in [(taken, "(it is a file)"), (taken / "sub", f"({taken} is a file)")]:
        args = [command, RUN, "--executor", "local", "-j", "1", "--out", str(out)]
        result = runner.invoke(cli, args)
        assert result.exit_code == 2
        assert result.stderr.strip() == f"Error: {out}: --out must name a directory {why}"
    assert taken.read_text() == "mine"
