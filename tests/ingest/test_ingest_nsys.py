"""Nsight Systems SQLite reader (issue 6). Expected values are counted independently with sqlite3."""

from __future__ import annotations

import gzip
import os
import sqlite3
import stat
from typing import TYPE_CHECKING

import polars as pl
import pytest
from conftest import ROOT

from tracediag.errors import RankError, TraceError
from tracediag.ingest.nsys import export_nsys_rep, read_nsys
from tracediag.schema import EVENT_SCHEMA

if TYPE_CHECKING:
    from pathlib import Path

FIXTURES = ROOT / "fixtures" / "nsys"
REAL = {
    lazy: FIXTURES / f"gen_nsys2022.4_cpu_nvtx_steps_schema3.0.0_lazy{lazy}.sqlite.gz" for lazy in ("false", "true")
}
CONSTRUCTED = {r: FIXTURES / f"constructed_gpu_rank{r}.sqlite.gz" for r in (0, 1)}
CONSUMED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
)


def plain_copy(gz: Path, tmp_path: Path) -> Path:
    """A decompressed, writable copy of a fixture."""
    out = tmp_path / gz.name.removesuffix(".gz")
    out.write_bytes(gzip.decompress(gz.read_bytes()))
    return out


def query(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def consumed_rows(db: Path) -> int:
    tables = {r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    return sum(query(db, f"SELECT count(*) FROM {t}")[0][0] for t in CONSUMED if t in tables)


def assert_one_line_error(err: Exception, path: Path) -> None:
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")


# --- real exports (nsys 2022.4 on CPU: NVTX only) -------------------------------------------------


@pytest.mark.parametrize("lazy", ["false", "true"], ids=lambda x: f"lazy{x}")
def test_real_export_rows_steps_and_accounting(lazy, tmp_path):
    db = plain_copy(REAL[lazy], tmp_path)
    ranges = query(db, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL")[0][0]
    steps = query(db, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59 AND text GLOB 'ProfilerStep#*'")[0][0]
    marks = query(db, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 34")[0][0]

    trace = read_nsys(REAL[lazy], rank=3)

    ev = trace.events
    assert ev.schema == pl.Schema(EVENT_SCHEMA)
    assert ev.height == ranges == 20
    assert (ev["kind"] == "step").sum() == steps == 4
    assert sorted(ev.filter(pl.col("kind") == "step")["name"].cast(pl.String)) == [
        f"ProfilerStep#{i}" for i in range(4)
    ]
    assert (ev["rank"] == 3).all()
    assert trace.meta.format == "nsys"
    assert trace.meta.events_in == consumed_rows(db) == 27
    assert trace.meta.skipped == {"instant": marks, "metadata": 3}
    assert ev.height + sum(trace.meta.skipped.values()) == trace.meta.events_in


def test_real_export_absolute_time_and_ids(tmp_path):
    db = plain_copy(REAL["false"], tmp_path)
    ((epoch,),) = query(db, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    ((start, end),) = query(db, "SELECT start, end FROM NVTX_EVENTS WHERE text = 'ProfilerStep#2'")
    ((pid,),) = query(db, "SELECT pid FROM PROCESSES")

    trace = read_nsys(REAL["false"], rank=0)

    step = trace.events.filter(pl.col("name") == "ProfilerStep#2").row(0, named=True)
    assert trace.meta.time_base == "epoch"
    assert step["ts"] == epoch + start
    assert step["dur"] == end - start
    assert (trace.events["pid"] == pid).all()
    assert (trace.events["device"] == -1).all()
    # the `dataloader` thread's ranges sit on their own tid (globalTid % 0x1000000)
    loader = trace.events.filter(pl.col("name") == "load_batch")
    assert loader.height == 4
    assert loader["tid"].n_unique() == 1
    assert loader["tid"][0] != pid


def test_real_export_without_rank_is_a_clear_error():
    with pytest.raises(RankError) as e:
        read_nsys(REAL["true"])
    assert_one_line_error(e.value, REAL["true"])
    assert "--rank-from-filename REGEX" in str(e.value)
    assert "--rank FILE=N" in str(e.value)


# --- constructed GPU exports (real 2022.4 DDL, hand-chosen rows) ----------------------------------


def test_constructed_kinds_and_accounting(tmp_path):
    db = plain_copy(CONSTRUCTED[1], tmp_path)
    nccl = query(
        db,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
        " WHERE s.value LIKE 'nccl%'",
    )[0][0]
    n = {t: query(db, f"SELECT count(*) FROM {t}")[0][0] for t in CONSUMED}

    trace = read_nsys(CONSTRUCTED[1])

    kinds = dict(trace.events.group_by(pl.col("kind").cast(pl.String)).len().iter_rows())
    assert kinds == {
        "comm": nccl,
        "kernel": n["CUPTI_ACTIVITY_KIND_KERNEL"] - nccl,
        "memcpy": n["CUPTI_ACTIVITY_KIND_MEMCPY"],
        "memset": n["CUPTI_ACTIVITY_KIND_MEMSET"],
        "sync": n["CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"],
        "runtime": n["CUPTI_ACTIVITY_KIND_RUNTIME"],
        "step": 3,
        "annotation": 12,
    }
    assert nccl == 6
    assert trace.meta.events_in == sum(n.values())
    # an NVTX range left open at capture end, three marks, domain create x2 + destroy
    assert trace.meta.skipped == {"malformed": 1, "instant": 3, "metadata": 3}
    assert trace.events.height + sum(trace.meta.skipped.values()) == trace.meta.events_in
    assert trace.meta.devices == ("NVIDIA H100 80GB HBM3",)
    assert trace.meta.backend == "nccl"


def test_nccl_kernels_are_comm_with_their_collective():
    ev = read_nsys(CONSTRUCTED[0]).events.filter(pl.col("kind") == "comm")
    ops = dict(
        ev.select(
            pl.col("name").cast(pl.String).str.extract(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)"),
            pl.col("coll_op").cast(pl.String),
        )
        .unique()
        .iter_rows()
    )
    assert ops == {
        "AllReduce": "all_reduce",
        "AllGather": "all_gather",
        "ReduceScatter": "reduce_scatter",
        "SendRecv": "other",
    }
    assert set(ev["stream"]) == {13}
    assert set(ev["device"]) == {0}
    # compute kernels carry no collective
    kernels = read_nsys(CONSTRUCTED[0]).events.filter(pl.col("kind") == "kernel")
    assert kernels["coll_op"].null_count() == kernels.height


def test_nccl_nvtx_range_is_an_annotation_with_its_collective():
    ev = read_nsys(CONSTRUCTED[0]).events.filter(pl.col("name") == "ncclAllReduce")
    assert ev.height == 3
    assert set(ev["kind"]) == {"annotation"}
    assert set(ev["coll_op"]) == {"all_reduce"}


def test_kernel_runtime_correlation_is_preserved():
    ev = read_nsys(CONSTRUCTED[1]).events
    gpu = ev.filter(pl.col("kind").is_in(["kernel", "comm", "memcpy", "memset", "sync"]))
    launches = ev.filter(pl.col("kind") == "runtime").select(
        "correlation", api=pl.col("name").cast(pl.String), api_ts="ts", api_tid="tid"
    )
    linked = gpu.join(launches, on="correlation", how="left")
    assert linked.height == gpu.height
    assert linked["api"].null_count() == 0
    assert (linked["api_ts"] < linked["ts"]).all()
    apis = dict(linked.group_by(pl.col("kind").cast(pl.String)).agg(pl.col("api").unique().sort()).iter_rows())
    assert apis == {
        "kernel": ["cudaLaunchKernel_v7000"],
        "comm": ["cudaLaunchKernel_v7000"],
        "memcpy": ["cudaMemcpyAsync_v3020"],
        "memset": ["cudaMemsetAsync_v3020"],
        "sync": ["cudaStreamSynchronize_v3020"],
    }
    # launched from the main thread of the same process
    assert set(linked["api_tid"]) == set(linked["pid"]) == {4243}


def test_constructed_absolute_time(tmp_path):
    db = plain_copy(CONSTRUCTED[1], tmp_path)
    ((epoch,),) = query(db, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    rows = query(db, "SELECT correlationId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY correlationId")

    ev = read_nsys(CONSTRUCTED[1]).events.filter(pl.col("kind").is_in(["kernel", "comm"])).sort("correlation")

    assert ev.select("correlation", "ts", "dur").rows() == [(c, epoch + s, e - s) for c, s, e in rows]
    assert epoch == 1_796_000_000_001_500_000  # rank 1 started 1.5 ms after rank 0


def test_no_session_start_gives_relative_time_and_a_warning(tmp_path):
    db = plain_copy(CONSTRUCTED[0], tmp_path)
    con = sqlite3.connect(db)
    con.execute("DELETE FROM TARGET_INFO_SESSION_START_TIME")
    con.commit()
    con.close()
    ((first,),) = query(db, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME")

    trace = read_nsys(db)

    assert trace.meta.time_base == "relative"
    assert len(trace.meta.warnings) == 1
    assert "TARGET_INFO_SESSION_START_TIME" in trace.meta.warnings[0]
    assert trace.events.filter(pl.col("kind") == "runtime")["ts"].min() == first


# --- rank sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_and_world_size_from_environment_strings(rank):
    trace = read_nsys(CONSTRUCTED[rank])
    assert trace.meta.rank == rank
    assert trace.meta.world_size == 2
    assert set(trace.events["rank"]) == {rank}
    assert trace.meta.warnings == ()


def test_given_rank_wins_over_the_file_with_a_warning():
    trace = read_nsys(CONSTRUCTED[1], rank=5)
    assert trace.meta.rank == 5
    assert set(trace.events["rank"]) == {5}
    assert trace.meta.warnings == ("the file says RANK=1; using rank 5 as given",)


@pytest.mark.parametrize(("key", "expected"), [("OMPI_COMM_WORLD_RANK", 6), ("SLURM_PROCID", 2), ("PMI_RANK", 4)])
def test_other_launchers_rank_variables(tmp_path, key, expected):
    db = plain_copy(CONSTRUCTED[0], tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE StringIds SET value = ? WHERE value = 'RANK=0'", (f"{key}={expected}",))
    con.commit()
    con.close()
    assert read_nsys(db).meta.rank == expected


def test_rank_variable_preference_order(tmp_path):
    db = plain_copy(CONSTRUCTED[0], tmp_path)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO StringIds VALUES (9000, 'SLURM_PROCID=7')")
    con.commit()
    con.close()
    assert read_nsys(db).meta.rank == 0  # RANK before SLURM_PROCID


def test_a_file_with_several_ranks_is_an_error(tmp_path):
    db = plain_copy(CONSTRUCTED[0], tmp_path)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO StringIds VALUES (9000, 'RANK=1')")
    con.commit()
    con.close()
    with pytest.raises(RankError) as e:
        read_nsys(db)
    assert_one_line_error(e.value, db)
    assert "RANK=0, RANK=1" in str(e.value)
    # a rank given by the caller is taken, with a warning
    assert read_nsys(db, rank=1).meta.warnings == ("the file says RANK=0, RANK=1; using rank 1 as given",)


# --- bad input ------------------------------------------------------------------------------------


def _text(tmp_path: Path) -> Path:
    p = tmp_path / "notes.sqlite"
    p.write_text("this is not a database\n")
    return p


def _empty(tmp_path: Path) -> Path:
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    return p


def _truncated_sqlite(tmp_path: Path) -> Path:
    data = gzip.decompress(CONSTRUCTED[0].read_bytes())
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[: len(data) // 2])
    return p


def _truncated_gzip(tmp_path: Path) -> Path:
    data = CONSTRUCTED[0].read_bytes()
    p = tmp_path / "cut.sqlite.gz"
    p.write_bytes(data[: len(data) // 2])
    return p


def _gzipped_text(tmp_path: Path) -> Path:
    p = tmp_path / "text.sqlite.gz"
    p.write_bytes(gzip.compress(b"hello\n" * 50))
    return p


def _other_sqlite(tmp_path: Path) -> Path:
    p = tmp_path / "other.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    return p


def _unknown_schema(tmp_path: Path) -> Path:
    p = tmp_path / "future.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, finish INTEGER, eventType INTEGER)")
    con.commit()
    con.close()
    return p


def _text_in_an_integer_column(tmp_path: Path) -> Path:
    p = plain_copy(CONSTRUCTED[0], tmp_path)
    con = sqlite3.connect(p)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE correlationId = 102")
    con.commit()
    con.close()
    return p


BAD = {
    "text file": (_text, "not a trace: content is not SQLite"),
    "empty file": (_empty, "empty file"),
    "truncated sqlite": (_truncated_sqlite, "truncated SQLite file"),
    "truncated gzip": (_truncated_gzip, "corrupt gzip data"),
    "gzipped text": (_gzipped_text, "not a trace: content is not SQLite"),
    "other sqlite": (_other_sqlite, "not a trace: SQLite without the Nsight Systems StringIds table"),
    "unknown schema": (_unknown_schema, "NVTX_EVENTS lacks column(s) end"),
    "wrong value type": (_text_in_an_integer_column, "unexpected value type in the export"),
}


@pytest.mark.parametrize("case", list(BAD), ids=str)
def test_bad_input_is_a_one_line_trace_error(tmp_path, case):
    make, problem = BAD[case]
    path = make(tmp_path)
    with pytest.raises(TraceError) as e:
        read_nsys(path, rank=0)
    assert_one_line_error(e.value, path)
    assert problem in str(e.value)


# --- .nsys-rep ------------------------------------------------------------------------------------


def test_nsys_rep_without_nsys_gives_the_export_command(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    rep = tmp_path / "run_rank0.nsys-rep"
    rep.write_bytes(b"report")
    with pytest.raises(TraceError) as e:
        read_nsys(rep, rank=0)
    assert_one_line_error(e.value, rep)
    out = tmp_path / "run_rank0.sqlite"
    assert str(e.value).endswith(f"nsys export --type sqlite -o {out} {rep}")


def _fake_nsys(tmp_path: Path, monkeypatch, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text("#!/bin/sh\n" + f'echo "$@" >> "{tmp_path}/calls"\n' + body)
    nsys.chmod(nsys.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "calls"


def test_nsys_rep_is_exported_beside_the_input_and_cached(tmp_path, monkeypatch):
    export = plain_copy(CONSTRUCTED[1], tmp_path)
    calls = _fake_nsys(
        tmp_path,
        monkeypatch,
        'while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n' + f'cp "{export}" "$out"\n',
    )
    rep = tmp_path / "reports" / "job.nsys-rep"
    rep.parent.mkdir()
    rep.write_bytes(b"report")

    trace = read_nsys(rep)

    assert (tmp_path / "reports" / "job.sqlite").exists()
    assert trace.meta.path == str(rep)
    assert trace.meta.rank == 1
    assert trace.events.height == read_nsys(export).events.height
    assert export_nsys_rep(rep) == tmp_path / "reports" / "job.sqlite"
    assert len(calls.read_text().splitlines()) == 1  # the second call reused the cache
    assert calls.read_text().startswith("export --type sqlite")


def test_failed_nsys_export_is_a_one_line_error(tmp_path, monkeypatch):
    _fake_nsys(tmp_path, monkeypatch, 'echo "some progress" >&2\necho "ERROR: not a report" >&2\nexit 1\n')
    rep = tmp_path / "broken.nsys-rep"
    rep.write_bytes(b"junk")
    with pytest.raises(TraceError) as e:
        export_nsys_rep(rep)
    assert_one_line_error(e.value, rep)
    assert str(e.value).endswith("failed: ERROR: not a report")


def test_single_export_without_rank_is_rank_0_with_warning_through_read_file() -> None:
    """One file alone may omit its rank (taken as 0, with a warning); several files may not."""
    from tracediag.ingest.read import read_file

    real = next(p for p in sorted((ROOT / "fixtures/nsys").glob("*lazytrue*.sqlite.gz")))
    ft = read_file(real, default_rank=0)
    assert ft.meta.rank == 0
    assert any("taken as rank 0" in w for w in ft.meta.warnings)
    with pytest.raises(RankError):
        read_file(real)


SAXPY = ROOT.parent / "shared" / "trace-samples" / "gpu-public" / "formats" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"


@pytest.mark.skipif(not SAXPY.exists(), reason="../shared is not on this machine (the public saxpy Nsight sample)")
def test_a_real_nsys_trace_without_steps_is_one_line_not_an_internal_error(runner):
    """The public saxpy MPI+CUDA Nsight sample (no ProfilerStep markers; some kernels with several launch
    links): analyze says what is missing in one line, exit 2; it crashed with a ShapeError in
    `derive.steps.assign_steps` (a row counted once per link)."""
    from tracediag.cli import cli

    result = runner.invoke(cli, ["analyze", str(SAXPY), "--rank-from-filename", r"perlmutter(\d+)"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("Error: no ProfilerStep#N markers in the traces; pass --step-regex REGEX")
