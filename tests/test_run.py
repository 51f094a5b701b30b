"""Loading many files into a Run, and the Parquet round trip (issue 2)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from conftest import KINETO
from polars.testing import assert_frame_equal

import tracediag
from tracediag.cli import cli
from tracediag.schema import EVENT_SCHEMA

NCCL = [KINETO / "hta_a100_nccl_rank0.json.gz", KINETO / "hta_a100_nccl_rank1.json.gz"]


def test_load_concatenates_ranks_sorted_with_schema() -> None:
    run = tracediag.load(NCCL, jobs=1)
    assert run.meta.ranks == [0, 1]
    assert run.meta.world_size == 128  # as distributedInfo states, not the 2 files given
    assert run.events.schema == pl.Schema(EVENT_SCHEMA)
    per_file = [tracediag.load(p, jobs=1).events.height for p in NCCL]
    assert run.events.height == sum(per_file)
    assert run.events.select((pl.col("rank").diff().fill_null(0) >= 0).all()).item()
    assert run.events.select((pl.col("ts").diff().fill_null(0) >= 0).over("rank").all()).item()


def test_parallel_load_equals_serial() -> None:
    serial = tracediag.load(NCCL, jobs=1)
    parallel = tracediag.load(NCCL, jobs=2)
    assert_frame_equal(serial.events, parallel.events)
    assert serial.meta == parallel.meta


def test_parquet_round_trip_is_exact(tmp_path: Path) -> None:
    run = tracediag.load([*NCCL], jobs=1)
    out = tmp_path / "run.parquet"
    run.save(out)
    back = tracediag.load(out)
    assert_frame_equal(run.events, back.events)
    assert back.meta == run.meta
    assert back.meta.skipped == run.meta.skipped
    assert back.meta.skipped


def test_directory_and_glob_inputs(tmp_path: Path) -> None:
    run_dir = tracediag.load(
        KINETO,
        jobs=1,
        rank_map={
            "hta_rank_not_found.json.gz": 99,
            "hta_rocm_mi250.json.gz": 98,
            "hta_triton_example.json.gz": 97,
            "hta_backward_thread.json": 96,
            "hta_a100_nccl_rank0.json.gz": 95,
            "hta_ns_resolution_head.json.gz": 94,
            "hta_a100_nccl_rank1.json.gz": 93,
        },
    )
    names = {Path(f.path).name for f in run_dir.meta.files}
    assert names == {p.name for p in KINETO.iterdir() if p.name.endswith((".json", ".json.gz"))}
    run_glob = tracediag.load(str(KINETO / "gen_torch*rank*.json.gz"), jobs=1)
    assert run_glob.meta.ranks == [0, 1]


def test_cli_ingest_summary_and_output(runner, tmp_path: Path) -> None:
    out = tmp_path / "run.parquet"
    result = runner.invoke(cli, ["ingest", *map(str, NCCL), "-o", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    run = tracediag.load(out)
    assert f"{run.meta.events_in:,} in -> {run.events.height:,} rows" in result.stdout
    assert "steps   2 (551..552)" in result.stdout
    assert "ranks   2 (0, 1) of world size 128" in result.stdout


def test_non_trace_files_in_a_directory_are_ignored_and_listed(runner, tmp_path: Path) -> None:
    """A manifest or README beside the traces is not an error; the same file named explicitly is."""
    import shutil

    for p in NCCL:
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "manifest.json").write_text('{"cause": "healthy"}')
    run = tracediag.load(tmp_path, jobs=1, rank_from_filename=r"rank(\d+)")
    assert run.meta.ranks == [0, 1]
    assert not run.meta.errors
    assert len(run.meta.ignored) == 1
    assert "manifest.json: not a trace" in run.meta.ignored[0]
    result = runner.invoke(cli, ["ingest", str(tmp_path), "-j", "1"])
    assert result.exit_code == 0
    assert "ignored (not traces" in result.stdout
    result = runner.invoke(cli, ["ingest", *map(str, NCCL), str(tmp_path / "manifest.json"), "-j", "1"])
    assert result.exit_code == 2
    assert "manifest.json: not a trace" in result.stderr
