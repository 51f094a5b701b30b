"""Op-timeline tables (tracediag/ingest/timeline.py, docs/formats/timeline.md).

The evidence that the reader works: tables made from two real runs of fixtures/runs by
fixtures/timeline/make_timeline.py get the verdict the original traces get. Small hand-written
tables test one mapping or input rule each.
"""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.cli import cli
from tracediag.errors import TraceError
from tracediag.ingest.read import read_file, read_traces
from tracediag.ingest.timeline import STREAMS, table_format

TABLES = FIXTURES / "timeline"
RUNS = FIXTURES / "runs"
SOURCES = ("straggler_persistent", "pipeline_1f1b_m8")
FORMATS = ("parquet", "csv.gz", "jsonl.gz")


@pytest.fixture(scope="module")
def originals() -> dict[str, tracediag.Analysis]:
    return {name: tracediag.analyze(tracediag.load(RUNS / name, jobs=1)) for name in SOURCES}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", SOURCES)
def test_a_real_run_as_a_table_gets_the_verdict_of_its_traces(originals, name, fmt):
    original = originals[name]
    analysis = tracediag.analyze(tracediag.load(TABLES / f"{name}.{fmt}", jobs=1))
    manifest = json.loads((RUNS / name / "manifest.json").read_text())
    assert [f.cause for f in analysis.findings] == [f.cause for f in original.findings] == [manifest["cause"]]
    (got,), (want,) = analysis.findings, original.findings
    assert list(got.ranks) == list(want.ranks) == (manifest["ranks"] or manifest["affected_ranks"])
    assert list(got.steps) == list(want.steps) == manifest["steps"]
    assert got.time_lost_ns == pytest.approx(want.time_lost_ns, rel=0.05)
    assert analysis.step_numbers == original.step_numbers
    # the same steps: a marker spans its step's ops, not the profiler's whole step, so a step may be a
    # little shorter or longer (work outside every op), never by much
    both = analysis.steps.join(original.steps, on=["rank", "step"], suffix="_traces")
    assert both.height == original.steps.height
    off = (both["dur_ns"] - both["dur_ns_traces"]).abs() / both["dur_ns_traces"]
    assert off.median() < 0.002
    assert off.max() < 0.03


def test_the_straggler_table_shows_who_everyone_waits_for():
    analysis = tracediag.analyze(tracediag.load(TABLES / "straggler_persistent.parquet", jobs=1))
    last = analysis.collectives["last_rank"].value_counts().sort("count")["last_rank"][-1]
    assert last == 2
    ev = analysis.findings[0].evidence
    assert ev["peer_wait_ms_median"] > 10 * max(ev["own_wait_ms_median"], 1.0)


def test_the_three_forms_give_the_same_event_table():
    runs = {fmt: tracediag.load(TABLES / f"straggler_persistent.{fmt}", jobs=1) for fmt in FORMATS}
    parquet, csv, jsonl = (runs[f].events for f in FORMATS)
    assert parquet.equals(jsonl)
    # the CSV: times in µs from the first row, no kind (derived from the names) and no group
    t0 = parquet.filter(pl.col("kind") != "step")["ts"].min()
    assert csv["dur"].equals(parquet["dur"])
    assert csv["ts"].equals(parquet["ts"] - t0)
    assert csv["kind"].equals(parquet["kind"])
    assert csv["coll_op"].equals(parquet["coll_op"])
    assert parquet["coll_group"].drop_nulls().unique().to_list() == ["0"]
    assert csv["coll_group"].null_count() == csv.height
    assert {f.time_base for f in runs["parquet"].meta.files} == {"epoch"}
    assert {f.time_base for f in runs["csv.gz"].meta.files} == {"relative"}


def test_one_file_holds_every_rank_with_its_coordinates():
    run = tracediag.load(TABLES / "pipeline_1f1b_m8.parquet", jobs=1)
    assert run.meta.ranks == [0, 1, 2, 3]
    assert {f.format for f in run.meta.files} == {"timeline"}
    assert [f.coords for f in run.meta.files] == [{"pp": r} for r in range(4)]
    (pp,) = run.meta.process_groups.values()
    assert (pp.name, pp.ranks, pp.size) == ("pp:0", (0, 1, 2, 3), 4)
    sends = run.events.filter(pl.col("coll_op") == "send")
    assert sends.height == run.events.filter(pl.col("coll_op") == "recv").height > 0
    assert (sends["stream"] % len(STREAMS) == STREAMS["send"] % len(STREAMS)).all()


def test_several_table_files_are_one_run_and_a_table_of_several_ranks_is_not_one_file(tmp_path):
    table = pl.read_parquet(TABLES / "straggler_persistent.parquet")
    table.filter(pl.col("rank") < 2).write_parquet(tmp_path / "a.parquet")
    table.filter(pl.col("rank") >= 2).write_csv(tmp_path / "b.csv")
    run = tracediag.load([tmp_path / "a.parquet", tmp_path / "b.csv"], jobs=1)
    assert run.meta.ranks == [0, 1, 2, 3]
    with pytest.raises(TraceError, match=r"a\.parquet: an op-timeline table of 2 ranks is read whole"):
        read_file(tmp_path / "a.parquet")
    one = tmp_path / "one.csv"
    table.filter(pl.col("rank") == 3).write_csv(one)
    (trace,) = read_traces(one, rank=7)
    assert trace.meta.rank == 7
    assert trace.events["rank"].unique().to_list() == [7]
    assert "the table says rank=3; using rank 7 as given" in trace.meta.warnings


def test_html_and_json_reports_of_a_table(runner, tmp_path):
    html = tmp_path / "r.html"
    src = str(TABLES / "straggler_persistent.parquet")
    out = tmp_path / "r.json"
    result = runner.invoke(cli, ["analyze", src, "--format", "json", "-o", str(out), "--html", str(html)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert [f["cause"] for f in doc["findings"]] == ["compute_straggler"]
    assert html.stat().st_size > 10_000


# --- one mapping rule each (hand-written tables) ------------------------------------------------


def _csv(tmp_path, text: str, name: str = "t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _events(tmp_path, text: str) -> pl.DataFrame:
    return tracediag.load(_csv(tmp_path, text), jobs=1).events.with_columns(pl.col("name").cast(pl.String))


def test_kinds_map_to_device_and_host_rows(tmp_path):
    ev = _events(
        tmp_path,
        "rank,step,name,start_ns,dur_ns,kind,peer\n"
        "0,5,load,0,10,data,\n0,5,fwd,10,100,compute,\n0,5,grads,110,50,reduce_scatter,\n"
        "0,5,act,160,20,send,1\n0,5,log,180,5,host,\n0,5,misc,185,5,other,\n",
    )
    rows = {r["name"]: r for r in ev.iter_rows(named=True)}
    assert rows["DataLoader#load"]["kind"] == "cpu_op"
    assert rows["DataLoader#load"]["device"] == -1
    assert (rows["fwd"]["kind"], rows["fwd"]["device"], rows["fwd"]["stream"]) == ("kernel", 0, STREAMS["compute"])
    g = rows["grads"]
    want = ("comm", "reduce_scatter", STREAMS["collective"], None)
    assert (g["kind"], g["coll_op"], g["stream"], g["coll_peer"]) == want
    assert (rows["act"]["coll_op"], rows["act"]["coll_peer"], rows["act"]["stream"]) == ("send", 1, STREAMS["send"])
    assert (rows["log"]["kind"], rows["log"]["device"]) == ("cpu_op", -1)
    assert (rows["misc"]["kind"], rows["misc"]["device"]) == ("other", -1)
    marker = rows["ProfilerStep#5"]
    assert (marker["kind"], marker["device"], marker["ts"], marker["dur"]) == ("step", -1, 0, 190)


def test_kind_is_derived_from_the_name_when_absent(tmp_path):
    names = [
        "forward-compute", "forward-send", "backward-recv", "grads-all-reduce", "allgather_params",
        "ncclDevKernel_ReduceScatter_Sum_f32", "gloo:broadcast", "batch-generator", "DataLoader.__next__",
        "scatter_add", "sendmail_hook",
    ]  # fmt: skip
    rows = "".join(f"0,1,{n},{i * 10},5\n" for i, n in enumerate(names))
    ev = _events(tmp_path, "rank,step,name,start_ns,dur_ns\n" + rows).filter(pl.col("kind") != "step")
    got = {r["name"]: (str(r["kind"]), r["coll_op"]) for r in ev.iter_rows(named=True)}
    assert got == {
        "forward-compute": ("kernel", None),
        "forward-send": ("comm", "send"),
        "backward-recv": ("comm", "recv"),
        "grads-all-reduce": ("comm", "all_reduce"),
        "allgather_params": ("comm", "all_gather"),
        "ncclDevKernel_ReduceScatter_Sum_f32": ("comm", "reduce_scatter"),
        "gloo:broadcast": ("comm", "broadcast"),
        "DataLoader#batch-generator": ("cpu_op", None),
        "DataLoader.__next__": ("cpu_op", None),
        "scatter_add": ("kernel", None),
        "sendmail_hook": ("kernel", None),
    }


def test_group_members_share_the_kth_instance_per_group_step_and_name(tmp_path):
    # rank 1 lists its ops in another order and one more group; instances still line up
    ev = _events(
        tmp_path,
        "rank,step,name,start_ns,dur_ns,kind,group\n"
        "0,1,ar,0,5,all_reduce,dp\n0,1,ar,10,5,all_reduce,dp\n0,2,ar,20,5,all_reduce,dp\n"
        "1,1,ag,1,2,all_gather,tp\n1,1,ar,3,5,all_reduce,dp\n1,1,ar,12,5,all_reduce,dp\n1,2,ar,22,5,all_reduce,dp\n"
        "2,1,ag,1,2,all_gather,tp\n",
    ).filter(pl.col("kind") == "comm")
    seq = {(r["rank"], r["ts"]): r["coll_seq"] for r in ev.iter_rows(named=True)}
    assert seq[(0, 0)] == seq[(1, 3)] != seq[(0, 10)] == seq[(1, 12)] != seq[(0, 20)] == seq[(1, 22)]
    assert seq[(1, 1)] == seq[(2, 1)]
    sizes = dict(ev.select("coll_group", "coll_group_size").unique().iter_rows())
    assert sizes == {"dp": 2, "tp": 2}


def test_overlapping_ops_of_one_kind_go_on_streams_of_their_own(tmp_path):
    ev = _events(
        tmp_path,
        "rank,step,name,start_ns,dur_ns,kind\n"
        "0,1,a,0,100,all_reduce\n0,1,b,50,100,all_reduce\n0,1,c,60,10,all_reduce\n"
        "0,1,d,150,10,all_reduce\n0,1,e,200,0,all_reduce\n0,1,f,200,5,all_reduce\n0,1,g,100,1,compute\n",
    )
    streams = dict(ev.filter(pl.col("device") == 0).select("name", "stream").iter_rows())
    base, step = STREAMS["collective"], len(STREAMS)
    # in flight at the start: c (a and b) lane 2; d starts as b ends: lane 0; f after a zero-length e
    assert streams == {"a": base, "b": base + step, "c": base + 2 * step, "d": base, "e": base, "f": base,
                       "g": STREAMS["compute"]}  # fmt: skip


def test_coordinates_become_process_groups(tmp_path):
    rows = "".join(f"{r},1,fwd,0,5,{r % 2},{r // 2}\n" for r in range(4))
    run = tracediag.load(_csv(tmp_path, "rank,step,name,start_ns,dur_ns,tp,pp\n" + rows), jobs=1)
    groups = {g.name: g.ranks for g in run.meta.process_groups.values()}
    assert groups == {"tp:0": (0, 1), "tp:1": (2, 3), "pp:0": (0, 2), "pp:1": (1, 3)}
    assert run.meta.files[3].coords == {"tp": 1, "pp": 1}


def test_table_format_is_told_by_content():
    assert table_format(b"rank,step,name,start_us,dur_us\n0,1,a,0,1\n") == "csv"
    assert table_format(b'{"rank": 0, "step": 1, "name": "a", "start_ns": 0, "dur_ns": 1}\n') == "jsonl"
    assert table_format(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1}]}') is None
    assert table_format(b'{\n  "traceEvents": [\n') is None
    assert table_format(b"step,name,x\n") is None


# --- bad input: one line naming the file and the column, or counted skips --------------------------


def _analyze(runner, path):
    result = runner.invoke(cli, ["analyze", str(path)])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("header", "missing"),
    [
        ("step,name,start_ns,dur_ns", "rank"),
        ("rank,name,start_ns,dur_ns", "step"),
        ("rank,step,start_ns,dur_ns", "name"),
        ("rank,step,name,start_ns", "dur_ns"),
        ("rank,step,name,start_us", "dur_us"),
        ("rank,step,name,start_ns,dur_us", "dur_ns"),
    ],
)
def test_a_missing_column_is_named(runner, tmp_path, header, missing):
    row = ",".join("1" if c != "name" else "a" for c in header.split(","))
    path = _csv(tmp_path, f"{header}\n{row}\n")
    code, out = _analyze(runner, path)
    if missing == "rank":  # without a rank the file is no op timeline: refused as not a trace
        assert code == 2
        assert "t.csv: not a trace" in out
        return
    assert code == 2
    assert f"t.csv: the op-timeline table has no column {missing}" in out
    assert len(out.strip().splitlines()) == 1
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ('{"rank": "0", "step": 1, "name": "a", "start_ns": 0, "dur_ns": 5}\n', "rank"),
        ('{"rank": 0, "step": 1.5, "name": "a", "start_ns": 0, "dur_ns": 5}\n', "step"),
        ('{"rank": 0, "step": 1, "name": 7, "start_ns": 0, "dur_ns": 5}\n', "name"),
        ('{"rank": 0, "step": 1, "name": "a", "start_us": "0", "dur_us": 5}\n', "start_us"),
        ('{"rank": 0, "step": 1, "name": "a", "start_ns": 0, "dur_ns": 5, "peer": "x"}\n', "peer"),
    ],
)
def test_a_column_of_the_wrong_type_is_named(runner, tmp_path, text, column):
    code, out = _analyze(runner, _csv(tmp_path, text, "t.jsonl"))
    assert code == 2, out
    assert f"t.jsonl: column {column} holds" in out, out
    assert len(out.strip().splitlines()) == 1


def test_a_csv_value_of_the_wrong_type_is_named(runner, tmp_path):
    code, out = _analyze(runner, _csv(tmp_path, "rank,step,name,start_ns,dur_ns\n0,1,a,0,5\nx,1,a,5,5\n"))
    assert code == 2, out
    assert "t.csv: cannot read the CSV op-timeline table" in out, out
    assert "rank" in out, out
    assert len(out.strip().splitlines()) == 1


def test_unknown_kinds_are_named(runner, tmp_path):
    path = _csv(tmp_path, "rank,step,name,start_ns,dur_ns,kind\n0,1,a,0,5,fwd\n0,1,b,5,5,compute\n0,1,c,9,5,fwd\n")
    code, out = _analyze(runner, path)
    assert code == 2
    assert "t.csv: column kind: 2 row(s) of unknown kind ('fwd')" in out


def test_bad_rows_are_skipped_and_counted(tmp_path):
    path = _csv(
        tmp_path,
        "rank,step,name,start_ns,dur_ns\n0,1,a,0,5\n1,1,a,0,5\n,1,a,0,5\n1,1,b,5,-3\n1,,c,5,3\n0,1,,5,3\n0,1,d,,3\n",
    )
    traces = read_traces(path)
    assert [t.meta.rank for t in traces] == [0, 1]
    assert [t.meta.skipped for t in traces] == [{"malformed": 3}, {"malformed": 2}]  # no-rank rows with rank 0
    assert [t.meta.events_in for t in traces] == [4, 3]
    warnings = traces[0].meta.warnings
    for why in ("1 row(s) with no rank", "1 row(s) with a negative duration", "1 row(s) with no step",
                "1 row(s) with no name", "1 row(s) with no start"):  # fmt: skip
        assert any(w.startswith(why) for w in warnings), (why, warnings)
    assert all(t.events.filter(pl.col("kind") != "step").height == 1 for t in traces)


def test_empty_and_rowless_tables_are_one_line(runner, tmp_path):
    empty = _csv(tmp_path, "", "empty.csv")
    code, out = _analyze(runner, empty)
    assert code == 2
    assert "empty.csv: empty file" in out
    header = _csv(tmp_path, "rank,step,name,start_ns,dur_ns\n", "header.csv")
    code, out = _analyze(runner, header)
    assert code == 2
    assert "header.csv: the op-timeline table has no rows" in out
    bad = _csv(tmp_path, "rank,step,name,start_ns,dur_ns\n0,1,a,0,-1\n", "bad.csv")
    code, out = _analyze(runner, bad)
    assert code == 2
    assert "bad.csv: none of the op-timeline table's 1 rows is usable" in out
    pq = tmp_path / "empty.parquet"
    pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "name": pl.String, "start_ns": pl.Int64,
                         "dur_ns": pl.Int64}).write_parquet(pq)  # fmt: skip
    code, out = _analyze(runner, pq)
    assert code == 2
    assert "empty.parquet: the op-timeline table has no rows" in out


def test_a_gzipped_table_and_a_rank_out_of_range(runner, tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"rank": 4294967296, "step": 1, "name": "a", "start_ns": 0, "dur_ns": 5}\n'))
    code, out = _analyze(runner, path)
    assert code == 2
    assert "t.jsonl.gz: column rank: rank 4294967296 is out of range" in out


def test_a_rank_with_two_coordinates_is_named(runner, tmp_path):
    path = _csv(tmp_path, "rank,step,name,start_ns,dur_ns,pp\n0,1,a,0,5,0\n0,1,b,5,5,1\n")
    code, out = _analyze(runner, path)
    assert code == 2
    assert "t.csv: column pp: rank 0 has several values" in out


@pytest.mark.parametrize("fmt", ["parquet", "csv.gz"])
def test_the_executor_refuses_a_table_of_several_ranks_in_one_line(runner, fmt):
    src = TABLES / f"straggler_persistent.{fmt}"
    result = runner.invoke(cli, ["analyze", "--executor", "local", "-j", "1", str(src)])
    assert result.exit_code == 2
    assert "op-timeline table" in result.output
    assert "without --executor" in result.output
    assert "Traceback" not in result.output
