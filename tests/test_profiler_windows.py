"""Several files of one rank: profiler windows of one job (`schedule(..., repeat=2)` with
`tensorboard_trace_handler`) are one rank's timeline; other files claiming one rank are still refused.

Real run: fixtures/readers_runs/windows_repeat2 (2 ranks x 2 windows, torch 2.13 gloo, made by
fixtures/readers_runs/make_readers_runs.py).
"""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.cli import cli
from tracediag.errors import RankError
from tracediag.execute.driver import analyze_ranks
from tracediag.ingest.read import read_file

WINDOWS = FIXTURES / "readers_runs/windows_repeat2"
FILES = sorted(WINDOWS.glob("*.pt.trace.json.gz"))


def test_the_run_has_two_windows_per_rank():
    ranks = [read_file(f).meta.rank for f in FILES]
    assert sorted(ranks) == [0, 0, 1, 1]


def test_windows_of_a_rank_are_one_timeline_with_the_profilers_step_numbers():
    run = tracediag.load(WINDOWS)
    assert run.meta.ranks == [0, 1]
    for f in run.meta.files:
        assert len(f.windows) == 1
        parts = [read_file(p) for p in (f.path, *f.windows)]
        assert f.events_in == sum(p.meta.events_in for p in parts)
        rows = run.events.filter(pl.col("rank") == f.rank)
        assert rows.height == sum(p.events.height for p in parts)
        assert rows["ts"].is_sorted()
    analysis = tracediag.analyze(run)
    assert analysis.steps["step"].unique().sort().to_list() == [2, 3, 6, 7]  # as the profiler numbered them
    assert analysis.steps.height == 8  # every step of both windows on both ranks


def test_ingest_counts_every_window_and_a_saved_run_keeps_them(tmp_path, runner):
    out = tmp_path / "run.parquet"
    result = runner.invoke(cli, ["ingest", str(WINDOWS), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("files   4 read (2 more profiler windows")
    saved = tracediag.load(out)
    assert [len(f.windows) for f in saved.meta.files] == [1, 1]


def test_the_same_window_twice_overlaps_and_is_refused(tmp_path):
    copy = tmp_path / "again.pt.trace.json.gz"
    shutil.copy(FILES[0], copy)
    with pytest.raises(RankError, match=r"both claim rank 0 \(their recorded time windows overlap\)"):
        tracediag.load([FILES[0], copy])


def test_rank_0_of_two_jobs_is_refused():
    other = FIXTURES / "runs/healthy_ddp/rank0.pt.trace.json.gz"
    with pytest.raises(RankError, match=r"both claim rank 0 \((?:world sizes differ|different host processes)\)"):
        tracediag.load([FILES[0], other])


def test_executor_joins_the_windows_each_read_by_another_task(tmp_path):
    """One file per task (each window read by its own worker task): the driver gathers the files of a
    rank into one task, which joins them; the analysis equals the in-memory one."""
    want = tracediag.analyze(tracediag.load(WINDOWS, jobs=1)).to_dict()
    analysis, summaries = analyze_ranks(WINDOWS, out=str(tmp_path / "out"), executor="local", workers=2)
    assert analysis.to_dict() == want
    assert summaries.ranks == [0, 1]
    assert [len(f.windows) for f in summaries.meta.files] == [1, 1]
    assert summaries.manifest.filter("ok").height == 4  # a row per file, each read


def test_executor_refuses_two_files_of_a_rank_that_are_no_windows(tmp_path):
    copy = tmp_path / "again.pt.trace.json.gz"
    shutil.copy(FILES[0], copy)
    with pytest.raises(RankError, match=r"both claim rank 0 \(their recorded time windows overlap\)"):
        analyze_ranks([FILES[0], copy], out=str(tmp_path / "out"), executor="local", workers=1)
