"""`ProfilerStep#N` numbers past the step column (Int32): refused with a count, never dropped or wrapped.

The real healthy_ddp run with every marker's number moved up by an offset; within range it reads as
before, only shifted."""

from __future__ import annotations

import gzip
import re
from typing import TYPE_CHECKING

import pytest
from conftest import RUNS

from tracediag.cli import cli

if TYPE_CHECKING:
    from pathlib import Path

RANKS = sorted((RUNS / "healthy_ddp").glob("rank*.pt.trace.json.gz"))


def _shifted(tmp_path: Path, offset: int, *, only_first: bool = False) -> list[str]:
    out = []
    for src in RANKS:
        text = gzip.decompress(src.read_bytes()).decode()
        marker = re.compile(r"ProfilerStep#(\d+)")
        text = marker.sub(lambda m: f"ProfilerStep#{int(m.group(1)) + offset}", text, count=1 if only_first else 0)
        dst = tmp_path / src.name.removesuffix(".gz")
        dst.write_text(text)
        out.append(str(dst))
    return out


@pytest.mark.parametrize("offset", [2**31, 2**63, 10**30])
def test_every_marker_out_of_range_is_named_with_its_count(runner, tmp_path: Path, offset: int) -> None:
    """Was "no ProfilerStep#N markers": what is wrong is the numbers, 8 markers on each of 4 ranks."""
    result = runner.invoke(cli, ["analyze", *_shifted(tmp_path, offset)])
    assert result.exit_code == 2
    first = offset + 2
    assert result.stderr.strip() == (
        f"Error: 32 ProfilerStep#N markers number their step beyond -2147483647..2147483646 "
        f"(e.g. {str(first)[:40]}): out of range, not read"
    )


def test_one_marker_out_of_range_is_not_dropped_silently(runner, tmp_path: Path) -> None:
    """One rank's first step out of range (4 files, one each): analysing the rest would report a gap as
    a healthy run of 7 steps."""
    result = runner.invoke(cli, ["analyze", *_shifted(tmp_path, 2**40, only_first=True)])
    assert result.exit_code == 2
    assert "Error: 4 ProfilerStep#N markers number their step beyond" in result.stderr


def test_numbers_near_the_limit_read_as_the_original_run_shifted(runner, tmp_path: Path) -> None:
    offset = 2**31 - 2 - 9  # the last step lands on the largest number accepted
    result = runner.invoke(cli, ["analyze", *_shifted(tmp_path, offset)])
    assert result.exit_code == 0, result.output
    assert f"8 steps ({2 + offset}..{9 + offset})" in result.stdout.splitlines()[0]


def test_ingest_reads_the_table_and_says_why_no_steps(runner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["ingest", *_shifted(tmp_path, 2**31)])
    assert result.exit_code == 0
    assert "steps   none: 32 ProfilerStep#N markers number their step beyond" in result.stdout


def test_the_column_maximum_itself_is_refused(runner, tmp_path: Path) -> None:
    """Step 2147483647 has no next number in Int32 (the what-if of that step was None: an internal error)."""
    result = runner.invoke(cli, ["analyze", *_shifted(tmp_path, 2**31 - 1 - 9)])
    assert result.exit_code == 2
    assert "Error: 4 ProfilerStep#N markers number their step beyond -2147483647..2147483646" in result.stderr
