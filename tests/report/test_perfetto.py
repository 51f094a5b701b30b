"""`tracediag export` / `analyze --perfetto`: the written file read back by a strict Trace Event Format
reader (`tef_checker`), and the analysis drawn on it checked by query against the analysis itself, on
real runs (fixtures/runs) and a real GPU trace (../shared)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import orjson
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import RUNS, SAMPLES, needs_shared
from tef_checker import load

import tracediag
from tracediag.cli import cli
from tracediag.report.perfetto import FINDING_TID, IDLE_TID, LATE_TID, WAIT_TID, quoted
from tracediag.report.perfetto_limits import parse_ranks

if TYPE_CHECKING:
    from pathlib import Path

ANNOTATION_TIDS = {WAIT_TID, LATE_TID, IDLE_TID} | {FINDING_TID + j for j in range(32)}
RUN_NAMES = ("straggler_persistent", "host_late", "slow_link", "mixed_host_compute")
DLRM = SAMPLES / "gpu-public" / "dlrm_v100_8rank"


def _ns(us: float) -> int:
    return round(us * 1000)


def _export(src: Path, out: Path, *args: str):
    result = CliRunner().invoke(cli, ["export", str(src), "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module", params=RUN_NAMES)
def exported(request, tmp_path_factory):
    src = RUNS / request.param
    out = tmp_path_factory.mktemp("pf") / "trace.json"
    _export(src, out)
    run = tracediag.load(src)
    return run, tracediag.analyze(run), load(out, nesting_threads=ANNOTATION_TIDS)


def test_every_event_of_the_run_is_on_the_timeline(exported):
    run, _, trace = exported
    timeline = [e for e in trace.of("X") if e["tid"] < 2**30]
    assert len(timeline) == run.events.height
    assert trace.other["tracediag"]["left_out"]["timeline_events"] == 0


def test_clock_offsets_are_one_per_host(exported):
    """The fixture runs were recorded on one host ("vm"): one clock, no offset on any rank."""
    _, _, trace = exported
    clocks = trace.other["tracediag"]
    assert clocks["host_offset_ns"] == {"vm": 0}
    assert set(clocks["offset_ns"].values()) == {0}


def test_ranks_are_processes_the_waited_for_rank_on_top(exported):
    run, analysis, trace = exported
    names = trace.process_names()
    order = sorted((i, pid) for pid, i in trace.sort_index().items())
    assert names[order[0][1]] == "analysis"
    ranks = [pid for _, pid in order[1:]]
    late = list(analysis.lateness.waited_for) if analysis.lateness else []
    assert ranks == late + [r for r in sorted(run.events["rank"].unique()) if r not in late]
    for r in late:
        assert names[r] == f"rank {r} (everyone waits for it)"


def test_the_late_rank_of_each_collective_is_the_analysis(exported):
    _, analysis, trace = exported
    lasts = trace.of("X", name="arrived last")
    assert lasts
    truth = {
        (c["group"], c["op"], c["seq"], c["step"]): c["last_rank"]
        for c in analysis.collectives.filter(pl.col("skew_ns") > 0).to_dicts()
    }
    drawn = {(e["args"]["group"], e["args"]["op"], e["args"]["seq"], e["args"]["step"]): e["pid"] for e in lasts}
    assert set(drawn.items()) <= set(truth.items())
    # the late arrival slices drawn: every instance anyone waited at
    assert len(drawn) >= 0.9 * len(truth)


def test_flows_go_from_each_waiter_to_the_late_rank(exported):
    _, _, trace = exported
    starts = {e["id"]: e for e in trace.of("s")}
    finishes = {e["id"]: e for e in trace.of("f")}
    assert starts
    assert set(starts) == set(finishes)
    waits = defaultdict(list)
    for e in trace.of("X", tid=WAIT_TID):
        waits[e["pid"]].append(e)
    for fid, s in starts.items():
        f = finishes[fid]
        assert s["tid"] == WAIT_TID
        assert f["tid"] == LATE_TID
        (slice_,) = [w for w in waits[s["pid"]] if w["ts"] == s["ts"]]
        assert slice_["args"]["late_rank"] == f["pid"] != s["pid"]
        assert slice_["name"] == f"waits for rank {f['pid']}"


def test_findings_span_exactly_their_steps_on_their_ranks(exported):
    _, analysis, trace = exported
    origin = trace.other["tracediag"]["origin_ns"]
    starts = {(r, s): (t, d) for r, s, t, d in analysis.steps.select("rank", "step", "start_ns", "dur_ns").iter_rows()}
    for j, finding in enumerate(analysis.findings):
        slices = trace.of("X", tid=FINDING_TID + j)
        drawn = {(e["pid"], _ns(e["ts"]) + origin, _ns(e["dur"])) for e in slices}
        want = {(r, *starts[r, s]) for r in finding.ranks for s in finding.steps if (r, s) in starts}
        assert drawn == want
        assert all(e["name"] == finding.cause.value for e in slices)
        assert slices[0]["args"]["summary"] == finding.summary
        assert slices[0]["args"]["evidence"] == orjson.loads(orjson.dumps(finding.to_dict()["evidence"]))


def test_idle_slices_add_up_to_the_analysis_idle_by_kind(exported):
    _, analysis, trace = exported
    got = defaultdict(int)
    for e in trace.of("X", tid=IDLE_TID):
        got[e["pid"], e["args"]["step"], e["args"]["kind"]] += _ns(e["dur"])
    for row in analysis.steps.to_dicts():
        for kind in ("host", "kernel", "other"):
            # each slice is rounded to the ns it was written in: at most 1 ns per slice
            assert abs(got[row["rank"], row["step"], kind] - row[f"idle_{kind}_ns"]) <= 50


def test_whatif_step_time_is_a_counter(exported):
    _, analysis, trace = exported
    counters = sorted(trace.of("C", name="step time (ms)"), key=lambda e: e["ts"])
    steps = analysis.whatif.steps
    assert [c["args"]["observed"] for c in counters] == [s.observed_ns / 1e6 for s in steps]
    assert [c["args"]["without every cause"] for c in counters] == [s.without_all_ns / 1e6 for s in steps]


def test_timeline_clocks_are_the_analysis_clocks(exported):
    """CPU ranks' steps start at their host marker: the marker drawn on the timeline starts where the
    analysis' aligned step starts."""
    _, analysis, trace = exported
    origin = trace.other["tracediag"]["origin_ns"]
    markers = {(e["pid"], e["name"]): _ns(e["ts"]) + origin for e in trace.of("X", cat="step")}
    checked = 0
    for r, s, start, device in analysis.steps.select("rank", "step", "start_ns", "device").iter_rows():
        if device < 0:
            assert markers[r, f"ProfilerStep#{s}"] == start
            checked += 1
    assert checked


def test_ranks_subset_and_cap_say_what_they_left_out(tmp_path):
    src = RUNS / "slow_link"
    out = tmp_path / "t.json"
    result = _export(src, out, "--ranks", "0,2-3", "--max-events", "300")
    trace = load(out, nesting_threads=ANNOTATION_TIDS)
    run = tracediag.load(src)
    kept = run.events.filter(pl.col("rank").is_in([0, 2, 3]))
    timeline = [e for e in trace.of("X") if e["tid"] < 2**30]
    assert len(timeline) == 300
    assert {e["pid"] for e in timeline} <= {0, 2, 3}
    assert set(trace.process_names().values()) >= {"rank 0", "analysis"}
    assert "rank 1" not in trace.process_names().values()
    left = trace.other["tracediag"]["left_out"]
    assert left["timeline_events"] == kept.height - 300
    assert left["ranks"] == [1]
    assert min(_ns(e["dur"]) for e in timeline) == left["shortest_kept_ns"]
    assert f"{kept.height - 300:,} of {kept.height:,} timeline events left out" in result.stderr
    # the longest are kept
    assert left["shortest_kept_ns"] >= kept["dur"].sort(descending=True)[299]


def test_analyze_perfetto_writes_the_same_annotations(tmp_path):
    src = RUNS / "host_late"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _export(src, a)
    result = CliRunner().invoke(cli, ["analyze", str(src), "--perfetto", str(b), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(a.read_bytes()) == orjson.loads(b.read_bytes())


def test_never_writes_over_an_input(tmp_path):
    src = tmp_path / "rank0.json"
    original = (RUNS / "host_late" / "rank0.pt.trace.json.gz").read_bytes()
    src.write_bytes(original)
    result = CliRunner().invoke(cli, ["export", str(src), "-o", str(src)])
    assert result.exit_code == 2
    assert "refusing to overwrite" in result.output
    result = CliRunner().invoke(cli, ["analyze", str(src), "--perfetto", str(src)])
    assert result.exit_code == 2
    assert src.read_bytes() == original


def test_bad_ranks_is_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["export", str(RUNS / "host_late"), "-o", str(tmp_path / "x"), "--ranks", "3-1"])
    assert result.exit_code == 2
    assert "'3-1' is not a rank or a range" in result.output
    result = CliRunner().invoke(cli, ["export", str(RUNS / "host_late"), "-o", str(tmp_path / "x"), "--ranks", "9"])
    assert result.exit_code == 2
    assert "names none of the run's ranks (0..3)" in result.output
    assert parse_ranks("0,3,5-7") == (0, 3, 5, 6, 7)


def test_names_are_json_encoded_whatever_they_hold():
    hostile = ['a"b', "line\nbreak", "</script><x>", "\\", "\u2028é", "\x00ctl"]
    assert [orjson.loads(q) for q in quoted(pl.Series(hostile)).to_list()] == hostile


@needs_shared(DLRM)
def test_a_real_gpu_trace(tmp_path):
    out = tmp_path / "dlrm.json"
    _export(DLRM, out)
    trace = load(out, nesting_threads=ANNOTATION_TIDS)
    run = tracediag.load(DLRM)
    analysis = tracediag.analyze(run)
    threads = trace.thread_names().values()
    assert any(name.startswith("GPU 0 stream ") for name in threads)
    kernels = trace.of("X", cat="kernel")
    assert len(kernels) == run.events.filter(pl.col("kind") == "kernel").height
    got = defaultdict(int)
    for e in trace.of("X", tid=IDLE_TID):
        got[e["pid"], e["args"]["step"], e["args"]["kind"]] += _ns(e["dur"])
    row = analysis.steps.row(0, named=True)
    assert row["idle_host_ns"] > 0
    assert abs(got[row["rank"], row["step"], "host"] - row["idle_host_ns"]) <= 50
