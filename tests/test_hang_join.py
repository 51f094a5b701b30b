"""Profiler traces joined to Flight Recorder dumps (issue 25, item 3), on the real gloo run
fixtures/hang/host_stuck_traced (rank 2 in record_function ``save_checkpoint`` for 7 s after all_reduce #8,
the others waiting in #9) and its Kineto traces: the late rank's host op in the sentence, the join method
and counts said, and traces that cannot be joined a note with a count, never a guess or a traceback."""

from __future__ import annotations

import dataclasses
import pickle
import re

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

import tracediag
from tracediag.cli import cli
from tracediag.desync.join import join_rank, trace_calls
from tracediag.errors import TracediagError
from tracediag.ingest import flight, frscan
from tracediag.ingest.read import read_file

HANG = FIXTURES / "hang"
DUMPS = HANG / "host_stuck_traced"
TRACES = HANG / "host_stuck_traced_kineto"


def _shifted(tmp_path, rank: int, seconds: float) -> str:
    """Rank `rank`'s real trace with its clock moved by `seconds` (as on a host whose clock is off)."""
    doc = orjson.loads((TRACES / f"rank_{rank}.pt.trace.json").read_bytes())
    doc["baseTimeNanoseconds"] += int(seconds * 1e9)
    out = tmp_path / f"rank_{rank}_shifted.json"
    out.write_bytes(orjson.dumps(doc))
    return str(out)


def test_the_sentence_names_the_late_rank_and_its_host_op():
    r = tracediag.hang(DUMPS, traces=TRACES)
    assert r.culprit_ranks == (2,)
    assert (
        "rank 2's last completed collective there is #8 (all_reduce); rank 2's host is in `save_checkpoint` (7.00 s "
        "of the 7.00 s from the end of #8 to its next collective call; profiler trace joined by time)"
    ) in r.sentence
    (a,) = r.activity
    assert (a.rank, a.after_seq, a.until, a.method) == (2, 8, "next_collective", "time")
    assert a.ops[0].name == "save_checkpoint"
    assert a.ops[0].kind == "annotation"
    assert 6.9e9 < a.ops[0].inside_ns <= a.window_ns < 7.1e9  # the fixture's 7 s sleep, as recorded
    assert [op.name for op in a.ops[1:3]] == ["aten::mm", "aten::ones"]  # the step's tail before the call


def test_every_rank_is_joined_by_time_and_counted():
    r = tracediag.hang(DUMPS, traces=TRACES)
    assert [(j.rank, j.method, j.matched, j.dump_entries, j.trace_calls) for j in r.joins] == [
        (0, "time", 9, 9, 9),
        (1, "time", 9, 9, 9),
        (2, "time", 8, 8, 9),  # its 9th call came after the dump
        (3, "time", 9, 9, 9),
    ]
    assert all(-1_000_000 < j.offset_ns < 0 for j in r.joins)  # the entry is created just after its call starts
    assert "profiler traces: 4 read, 4 joined to their dumps (by sequence id: 0, by time: 4), 0 not joined" in r.notes


def test_without_traces_nothing_changes():
    r = tracediag.hang(DUMPS)
    assert (r.joins, r.activity) == ((), ())
    assert "host is in" not in r.sentence


def test_other_files_of_a_trace_directory_are_skipped_and_counted(tmp_path):
    for name in ("rank_0.pt.trace.json", "rank_2.pt.trace.json"):
        (tmp_path / name).write_bytes((TRACES / name).read_bytes())
    (tmp_path / "README.md").write_text("notes")
    r = tracediag.hang(DUMPS, traces=tmp_path)
    assert [j.rank for j in r.joins] == [0, 2]
    assert (
        "profiler traces: 2 read, 2 joined to their dumps (by sequence id: 0, by time: 2), 0 not joined; "
        "1 other file of the trace directories skipped"
    ) in r.notes


def test_dumps_without_traces_are_named():
    r = tracediag.hang(DUMPS, traces=[TRACES / "rank_0.pt.trace.json", TRACES / "rank_2.pt.trace.json"])
    assert [j.rank for j in r.joins] == [0, 2]
    assert "no profiler trace of ranks 1, 3 (dumped)" in r.notes
    assert "profiler traces: 2 read, 2 joined to their dumps (by sequence id: 0, by time: 2), 0 not joined" in r.notes
    assert "rank 2's host is in `save_checkpoint`" in r.sentence


def test_traces_of_another_job_and_of_a_rank_without_dump_are_not_joined():
    # the killed job's dumps (ranks 0-2, another run) against host_stuck_traced's traces (ranks 0-3)
    r = tracediag.hang(HANG / "killed", traces=TRACES)
    assert [(j.rank, j.method) for j in r.joins] == [(0, "none"), (1, "none"), (2, "none"), (3, "none")]
    assert r.joins[3].why == "no dump of rank 3"
    assert "outside the trace's span (another job, or another clock)" in r.joins[0].why
    assert "profiler traces: 4 read, 0 joined to their dumps (by sequence id: 0, by time: 0), 4 not joined" in r.notes
    assert sum(n.startswith("profiler trace of rank") and "not joined" in n for n in r.notes) == 4
    assert r.activity == ()
    assert "host is in" not in r.sentence


def test_a_trace_on_another_clock_is_not_joined_by_time(tmp_path):
    r = tracediag.hang(DUMPS, traces=[_shifted(tmp_path, 2, 3600), TRACES / "rank_0.pt.trace.json"])
    j2 = next(j for j in r.joins if j.rank == 2)
    assert (j2.method, j2.matched) == ("none", 0)
    # 3,600 s less the span between the trace's first call and the dump's last entry
    assert re.fullmatch(
        r"no sequence ids in the trace, and the dump's entries lie 3,59\d\.\d s outside the trace's span "
        r"\(another job, or another clock\)",
        j2.why,
    )
    assert r.activity == ()
    assert "host is in" not in r.sentence


def _with_seq(path, order) -> tracediag.ingest.trace.FileTrace:
    """A real trace whose host collective calls carry group "0" and the sequence ids `order` (as NCCL's
    record_param_comms does; gloo records none)."""
    t = read_file(path)
    ev = t.events
    host = (pl.col("kind") == "cpu_op") & pl.col("coll_op").is_not_null()
    k = pl.when(host).then(host.cast(pl.Int64).cum_sum())
    ev = ev.sort("ts").with_columns(k.alias("_k"))
    mapping = pl.DataFrame(
        {"_k": list(range(1, len(order) + 1)), "_seq": order}, schema={"_k": pl.Int64, "_seq": pl.Int64}
    )
    ev = (
        ev.join(mapping, on="_k", how="left", maintain_order="left")
        .with_columns(
            pl.when(host).then(pl.col("_seq")).otherwise(pl.col("coll_seq")).alias("coll_seq"),
            pl.when(host).then(pl.lit("0")).otherwise(pl.col("coll_group")).alias("coll_group"),
        )
        .drop("_k", "_seq")
    )
    return dataclasses.replace(t, events=ev)


def test_sequence_join_and_its_clock_offset_said():
    dumps = flight.read_dumps([str(DUMPS)])
    mine = dumps.entries.filter(pl.col("rank") == 0)
    t = _with_seq(TRACES / "rank_0.pt.trace.json", list(range(1, 10)))
    assert trace_calls(t.events)["seq"].to_list() == list(range(1, 10))
    j, pairs = join_rank(0, t, mine)
    assert (j.method, j.matched, j.why) == ("seq", 9, None)
    assert pairs["dump_seq"].to_list() == list(range(1, 10))
    shifted = dataclasses.replace(t, events=t.events.with_columns(pl.col("ts") + 3_600_000_000_000))
    j, _ = join_rank(0, shifted, mine)
    assert (j.method, j.matched) == ("seq", 9)
    assert j.why == "the trace's clock is +3,600.0 s off the dump's (another host's clock?): joined by sequence id only"


def test_sequence_ids_that_match_in_number_only_are_refused():
    dumps = flight.read_dumps([str(DUMPS)])
    t = _with_seq(TRACES / "rank_0.pt.trace.json", list(range(9, 0, -1)))  # another job's order of the ids
    j, pairs = join_rank(0, t, dumps.entries.filter(pl.col("rank") == 0))
    assert (j.method, j.matched, pairs.height) == ("none", 0, 0)
    assert j.why == "sequence ids match (9) but their times spread over 0.4 s (a trace of another job?)"


def test_cli_traces_json_and_html(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["hang", str(DUMPS), "--traces", str(TRACES), "--format", "json"])
    assert result.exit_code == 3
    doc = orjson.loads(result.stdout)
    assert doc["schema"] == "tracediag.hang/2"
    assert [j["method"] for j in doc["joins"]] == ["time"] * 4
    assert doc["activity"][0]["ops"][0]["name"] == "save_checkpoint"
    text = runner.invoke(cli, ["hang", str(DUMPS), "--traces", str(TRACES)]).stdout
    assert "profiler traces joined to the dumps:" in text
    assert "host of rank 2 from the end of #8 (group 0) to its next collective call: 7.00 s" in text
    out = tmp_path / "hang.html"
    assert (
        runner.invoke(cli, ["hang", str(DUMPS), "--traces", str(TRACES), "--format", "html", "-o", str(out)]).exit_code
        == 3
    )
    page = out.read_text()
    assert "<h3>Profiler traces joined to the dumps</h3>" in page
    assert "save_checkpoint (annotation)" in page


def test_two_traces_of_one_rank_and_a_bad_trace_are_one_line_errors(tmp_path):
    runner = CliRunner()
    two = [str(TRACES / "rank_2.pt.trace.json"), _shifted(tmp_path, 2, 1)]
    result = runner.invoke(cli, ["hang", str(DUMPS), "--traces", two[0], "--traces", two[1]])
    assert result.exit_code == 2
    assert "two profiler traces of rank 2" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    bad = tmp_path / "rank_1.json"
    bad.write_text('{"traceEvents": [')
    result = runner.invoke(cli, ["hang", str(DUMPS), "--traces", str(bad)])
    assert result.exit_code == 2
    assert "rank_1.json" in result.stderr
    assert "Traceback" not in result.stderr


def _bomb(tmp_path) -> str:
    """A pickle whose 2,000 entries share one memoised input_sizes list of 20,000 sizes: ~100 kB on disk,
    40 million values once written out per entry."""
    shared = [[1] * 20_000]
    entries = [
        {
            "record_id": i,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": i,
            "profiling_name": "gloo:all_reduce",
            "input_sizes": shared,
        }
        for i in range(2_000)
    ]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries}, protocol=4))
    assert path.stat().st_size < 120_000
    return str(path)


@pytest.mark.parametrize("use_c", [True, False], ids=["c", "python"])
def test_shared_sizes_past_the_cap_are_a_pickle_bomb_on_both_paths(tmp_path, monkeypatch, use_c):
    if use_c and not frscan.AVAILABLE:
        pytest.skip("the C scanner is not built (no C compiler)")
    path = _bomb(tmp_path)
    if not use_c:
        monkeypatch.setattr(frscan, "_frscan", None)
    with pytest.raises(TracediagError, match=r"expand to over [0-9]+ values \(a pickle bomb\); not read") as e:
        flight.read_dump(path)
    assert "\n" not in str(e.value)


def test_shared_sizes_under_the_cap_still_read_on_the_python_path(tmp_path, monkeypatch):
    monkeypatch.setattr(frscan, "_frscan", None)
    shared = [[4]]
    entries = [
        {
            "record_id": i,
            "process_group": ["0", "default_pg"],
            "collective_seq_id": i,
            "profiling_name": "gloo:all_reduce",
            "input_sizes": shared,
        }
        for i in range(100)
    ]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": entries}, protocol=4))
    d = flight.read_dump(str(path))
    assert d.entries["input_sizes"].to_list() == [[[4]]] * 100


def test_html_escapes_the_trace_op_names(tmp_path):
    doc = orjson.loads((TRACES / "rank_2.pt.trace.json").read_bytes())
    for e in doc["traceEvents"]:
        if e.get("name") == "save_checkpoint":
            e["name"] = "<script>save</script>"
    trace = tmp_path / "rank_2.pt.trace.json"
    trace.write_bytes(orjson.dumps(doc))
    out = tmp_path / "hang.html"
    result = CliRunner().invoke(cli, ["hang", str(DUMPS), "--traces", str(trace), "--format", "html", "-o", str(out)])
    assert result.exit_code == 3
    page = out.read_text()
    assert "&lt;script&gt;save&lt;/script&gt;" in page
    assert "<script>save" not in page
