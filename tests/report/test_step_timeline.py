"""The report's per-rank, per-stream timelines (issue 30 item 2), on real runs: the slow node's two ranks
drawn first, their late arrivals marked, their peers' waits naming them, the cap saying what it left out."""

from __future__ import annotations

import re

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import RUNS, SAMPLES, needs_shared

import tracediag
from tracediag.cli import cli
from tracediag.report import step_timeline
from tracediag.report.html import render_html
from tracediag.report.perfetto_tracks import derive_tracks

SLOW_NODE = RUNS / "slow_node_6"
DLRM = SAMPLES / "gpu-public" / "dlrm_v100_8rank"


@pytest.fixture(scope="module")
def slow_node():
    run = tracediag.load(SLOW_NODE)
    return run, tracediag.analyze(run)


def _trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def test_slowest_step_shows_the_slow_node_first_with_its_late_arrivals_and_the_waits_for_it(slow_node):
    run, analysis = slow_node
    views = step_timeline.views(analysis)
    slowest = views[0]
    assert slowest.anchor == "timeline-slowest"
    assert slowest.ranks[:2] == (4, 5)  # the ranks everyone waits for come first
    assert sorted(slowest.ranks) == [0, 1, 2, 3, 4, 5]
    fig = step_timeline.draw(run, derive_tracks(run, analysis), analysis, slowest).figure
    late = _trace(fig, "arrives last")
    assert set(late.y) == {"rank 5 · collectives"}  # rank 5 is last at every all-reduce of the run
    waits = _trace(fig, "waiting for the last rank")
    waiters = {y.split(" · ")[0] for y in waits.y}
    assert {"rank 0", "rank 1", "rank 2", "rank 3"} <= waiters
    assert all(h.endswith("for rank 5, the last to arrive") for h in waits.hovertext)
    # the waits drawn are the analysis' own: rank 0 waits in this step as the step table says (±1 µs per wait)
    in_step = analysis.steps.filter((pl.col("step") == slowest.step) & (pl.col("rank") == 0))
    drawn = sum(x for y, x in zip(waits.y, waits.x) if y == "rank 0 · collectives")
    assert drawn == pytest.approx(in_step["wait_ns"][0] / 1e6, abs=0.01)
    rows = list(fig.layout.yaxis.categoryarray)
    assert rows[0] == "rank 4 · collectives"
    assert tuple(fig.layout.yaxis.range) == (len(rows) - 0.5, -0.5)  # every row shown, empty ones too
    assert any(re.fullmatch(r"rank 5 · thread \d+", r) for r in rows)
    assert any(re.fullmatch(r"rank 5 · thread \d+ ·2", r) for r in rows)  # operators inside operators
    ops = _trace(fig, "operator")
    assert all(b >= 0 and b + x <= fig.layout.xaxis.range[1] + 1e-3 for b, x in zip(ops.base, ops.x))


def test_a_finding_has_its_own_timeline_of_its_ranks_and_peers_and_its_card_links_to_it(slow_node):
    run, analysis = slow_node
    finding = step_timeline.views(analysis)[1]
    assert finding.anchor == "timeline-finding-1"
    assert set(finding.ranks[:2]) == {4, 5}
    assert len(finding.ranks) == 4  # the two ranks, a typical peer and the fastest
    assert finding.step in analysis.findings[0].steps
    page = render_html(analysis, run=run)
    assert '<div id="timeline-finding-1">' in page
    assert 'href="#timeline-finding-1"' in page
    assert 'id="fig-slowest-streams"' in page
    assert 'id="fig-finding-1-streams"' in page


def test_the_bar_cap_keeps_the_longest_and_says_what_it_left_out(slow_node, monkeypatch):
    run, analysis = slow_node
    view = step_timeline.views(analysis)[0]
    tracks = derive_tracks(run, analysis)
    monkeypatch.setattr(step_timeline, "MAX_BARS", 100_000)
    full = step_timeline.draw(run, tracks, analysis, view)
    assert "left out" not in full.caption
    monkeypatch.setattr(step_timeline, "MAX_BARS", 100)
    capped = step_timeline.draw(run, tracks, analysis, view)
    kinds = ("operator", "annotation", "communication")
    n_full = sum(len(t.x) for t in full.figure.data if t.name in kinds)
    n_capped = sum(len(t.x) for t in capped.figure.data if t.name in kinds)
    assert n_capped == 100
    assert f"{n_full - 100:,} of {n_full:,} bars left out" in capped.caption
    longest = sorted((x for t in full.figure.data if t.name in kinds for x in t.x), reverse=True)[:100]
    kept = sorted((x for t in capped.figure.data if t.name in kinds for x in t.x), reverse=True)
    assert kept == longest


def test_a_saved_analysis_says_where_the_timelines_come_from(slow_node):
    _, analysis = slow_node
    page = render_html(analysis)
    assert "streams" not in re.findall(r'id="fig-([a-z0-9-]+)"', page)
    assert "write the report with analyze --html" in page


def test_analyze_html_draws_the_timelines(tmp_path):
    out = tmp_path / "r.html"
    done = CliRunner().invoke(cli, ["analyze", str(SLOW_NODE), "--html", str(out)])
    assert done.exit_code == 0, done.output
    assert 'id="fig-slowest-streams"' in out.read_text()


@needs_shared(DLRM)
def test_a_gpu_run_draws_device_streams_with_kernels_and_nccl():
    run = tracediag.load(DLRM)
    analysis = tracediag.analyze(run)
    view = step_timeline.views(analysis)[0]
    fig = step_timeline.draw(run, derive_tracks(run, analysis), analysis, view).figure
    kernels, comm = _trace(fig, "kernel"), _trace(fig, "communication")
    assert any(re.fullmatch(r"rank \d+ · stream \d+", y) for y in kernels.y)
    assert any("nccl" in h.lower() for h in comm.text)


def test_a_findings_perfetto_pointer_names_the_track_the_export_writes(slow_node, tmp_path):
    from tef_checker import load

    from tracediag.report.perfetto import FINDING_TID, IDLE_TID, LATE_TID, WAIT_TID, write_perfetto

    run, analysis = slow_node
    out = tmp_path / "t.json"
    write_perfetto(str(out), run, analysis)
    trace = load(out, nesting_threads={WAIT_TID, LATE_TID, IDLE_TID, FINDING_TID})
    page = render_html(analysis, run=run)
    line = page.split('<div id="finding-1">')[1].split('<p class="perfetto">')[1].split("</p>")[0]
    track = re.search(r"on the track <i>(.+?)</i>", line).group(1)
    slices = trace.of("X", name="compute_straggler")
    on_track = {e["pid"] for e in slices if trace.thread_names()[(e["pid"], e["tid"])] == track}
    assert on_track == {4, 5}
    assert "ranks 4–5" in line
    assert {trace.thread_names()[(r, LATE_TID)] for r in (4, 5)} == {"collectives: arrived last"}
    assert "<i>collectives: arrived last</i>" in line


@needs_shared(DLRM)
def test_a_host_bound_gpu_run_shows_its_device_waiting_on_the_host(monkeypatch):
    """DLRM V100 is host_bound (the device idle 58% of the step, 93% of it with nothing queued): each GPU
    rank's ``device idle`` row draws the analysis' own idle gaps of the step, split as the breakdown."""
    run = tracediag.load(DLRM)
    analysis = tracediag.analyze(run)
    assert analysis.findings[0].cause == "host_bound"
    tracks = derive_tracks(run, analysis)
    view = step_timeline.views(analysis)[1]
    assert "device idle gaps left out, the shortest" in step_timeline.draw(run, tracks, analysis, view).caption
    monkeypatch.setattr(step_timeline, "MAX_IDLE_BARS", 100_000)
    fig = step_timeline.draw(run, tracks, analysis, view).figure
    host = _trace(fig, "device idle: waiting on the host")
    assert {y for y in host.y} <= {f"rank {r} · device idle" for r in view.ranks}
    r = view.ranks[0]
    drawn = sum(x for y, x in zip(host.y, host.x) if y == f"rank {r} · device idle")
    mine = tracks.idle.filter((pl.col("rank") == r) & (pl.col("step") == view.step) & (pl.col("kind") == "host"))
    assert drawn == pytest.approx((mine["end"] - mine["ts"]).sum() / 1e6, rel=1e-3)
    row = list(fig.layout.yaxis.categoryarray)
    assert row.index(f"rank {r} · device idle") == row.index(f"rank {r} · collectives") + 1


def _shuffled(run, seed: int):
    from dataclasses import replace

    return replace(run, events=run.events.sample(fraction=1.0, shuffle=True, seed=seed))


@needs_shared(DLRM)
def test_the_timeline_does_not_depend_on_the_order_of_the_events():
    """DLRM's host threads have operators of the same span (an op and its only child, to the nanosecond):
    which is drawn outer, and the order of the bars, once depended on the order polars returned them in,
    and two runs of `analyze --html` wrote different pages."""
    run = tracediag.load(DLRM)
    analysis = tracediag.analyze(run)
    tracks = derive_tracks(run, analysis)
    view = step_timeline.views(analysis)[0]
    pages = {step_timeline.draw(_shuffled(run, seed), tracks, analysis, view).figure.to_json() for seed in range(4)}
    assert len(pages) == 1


def test_events_of_the_same_span_take_their_levels_by_name_whatever_their_order():
    rows = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0],
            "device": [-1] * 4,
            "thr": [7] * 4,
            "kind": ["cpu_op"] * 4,
            "name": ["outer", "b", "a", "after"],
            "ts": [0, 10, 10, 50],
            "end": [100, 20, 20, 60],
        }
    )
    for seed in range(6):
        out = step_timeline._levels(rows.sample(fraction=1.0, shuffle=True, seed=seed), ["rank", "device", "thr"])
        levels = dict(zip(out["name"], out["level"]))
        assert levels == {"outer": 0, "a": 1, "b": 2, "after": 1}
