"""What-if replay: the replay reproduces observed steps, each cause's edit prices its finding."""

from __future__ import annotations

import re

import polars as pl
import pytest
from conftest import ROOT

import tracediag
from tracediag.analysis import Analysis, Finding
from tracediag.report.html import render_html
from tracediag.whatif.graph import Graph
from tracediag.whatif.replay import replay

RUNS = ROOT / "fixtures" / "runs"
SCENARIOS = sorted(p.name for p in RUNS.iterdir() if (p / "manifest.json").exists())
MS = 1e6


@pytest.fixture(scope="module")
def analyses() -> dict[str, Analysis]:
    return {}


def _analysis(cache: dict[str, Analysis], name: str) -> Analysis:
    if name not in cache:
        cache[name] = tracediag.analyze(tracediag.load(RUNS / name, jobs=1))
    return cache[name]


def _graph() -> Graph:
    """Two ranks, one step, one all-reduce: rank 0 computes 10 ns, rank 1 30 ns, transfer 5 ns.

    Rank 0 waits in the all-reduce from 10 to 35 (its block), rank 1 from 30 to 35.
    """
    segments = pl.DataFrame(
        {"rank": [0, 1], "step": [1, 1], "ts": [0, 0], "end": [10, 30], "compute_ns": [10, 30]},
        schema={"rank": pl.Int32, "step": pl.Int32, "ts": pl.Int64, "end": pl.Int64, "compute_ns": pl.Int64},
    ).with_columns(pl.lit(0, pl.Int64).alias(c) for c in ("input_ns", "idle_ns", "other_ns"))
    ops = pl.DataFrame(
        {
            "op": ["x", "x"],
            "rank": [0, 1],
            "kind": ["collective"] * 2,
            "name": ["all_reduce"] * 2,
            "bytes": [100, 100],
            "n": [2, 2],
            "arrival": [10, 30],
            "end": [35, 35],
            "stream": [None, None],
            "dep": [True, True],
            "transfer_ns": [5, 5],
            "order": [0, 0],
            "prev_op": [None, None],
        },
        schema_overrides={"rank": pl.Int32, "n": pl.Int32, "stream": pl.Int64, "prev_op": pl.String},
    )
    marks = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0, 1, 1, 1, 1],
            "t": [0, 10, 10, 35, 0, 30, 30, 35],
            "t_end": [0, 10, 35, 35, 0, 30, 35, 35],
            "kind": ["boundary", "arrive", "block", "boundary"] * 2,
            "op": [None, "x", "x", None] * 2,
            "lag_ns": [0] * 8,
            "step": [1, 1, 1, 2] * 2,
        },
        schema_overrides={"rank": pl.Int32, "step": pl.Int32, "op": pl.String},
    )
    steps = pl.DataFrame(
        {"rank": [0, 1], "step": [1, 1], "start_ns": [0, 0], "dur_ns": [35, 35]},
        schema={"rank": pl.Int32, "step": pl.Int32, "start_ns": pl.Int64, "dur_ns": pl.Int64},
    )
    return Graph(segments=segments, ops=ops, marks=marks, steps=steps)


def test_replay_rule_last_arrival_plus_transfer():
    g = _graph()
    assert replay(g)["replay_ns"].to_list() == [35, 35]
    half = pl.DataFrame(
        {"rank": [1], "step": [1], "cat": ["compute"], "factor": [0.5]},
        schema={"rank": pl.Int32, "step": pl.Int32, "cat": pl.String, "factor": pl.Float64},
    )
    # rank 1 arrives at 15, the all-reduce ends at 15 + 5 = 20 on both ranks
    assert replay(g, factors=half)["replay_ns"].to_list() == [20, 20]
    fast = pl.DataFrame({"op": ["x", "x"], "rank": [0, 1], "transfer_ns": [1.0, 1.0]}).cast({"rank": pl.Int32})
    assert replay(g, factors=half, transfer=fast)["replay_ns"].to_list() == [16, 16]
    # rank 0's compute does not matter while it waits for rank 1
    slow0 = half.with_columns(rank=pl.lit(0, pl.Int32), factor=pl.lit(2.0))
    assert replay(g, factors=slow0)["replay_ns"].to_list() == [35, 35]


@pytest.mark.parametrize("name", SCENARIOS)
def test_replay_reproduces_observed_steps(analyses, name):
    """Replaying the observed durations gives back each step's time (target: median error <= 5%)."""
    section = _analysis(analyses, name).whatif
    assert section.replay_error_median <= 0.05
    for row in section.steps:
        assert abs(row.replayed_ns - row.observed_ns) <= 0.1 * row.observed_ns


def test_straggler_whatif_removes_its_excess(analyses):
    a = _analysis(analyses, "straggler_persistent")
    f = next(f for f in a.findings if f.cause == "compute_straggler")
    observed = float(a.steps.group_by("step").agg(pl.col("dur_ns").median())["dur_ns"].median())
    peers = f.evidence["peer_compute_ms_median"] * MS
    # without rank 2's extra compute, the step is the peers' compute plus what does not overlap it
    assert peers < f.step_time_without_ns < 0.6 * observed
    # the sentence says what was removed: the rank's compute above its peers', per step
    extra = float(re.match(r"without rank 2's extra compute \(([\d.,]+) ms per step", f.whatif).group(1))
    ev = f.evidence
    assert extra == pytest.approx(ev["compute_ms_median"] - ev["peer_compute_ms_median"], rel=0.1)
    assert f.time_lost_ns > 0.4 * observed * len(f.steps)


def test_input_whatif_subtracts_the_loading(analyses):
    a = _analysis(analyses, "input_bound")
    f = next(f for f in a.findings if f.cause == "input_bound")
    per_step = a.steps.group_by("step").agg(pl.col("dur_ns", "input_ns").median())
    expected = float((per_step["dur_ns"] - per_step["input_ns"]).median())
    assert f.step_time_without_ns == pytest.approx(expected, rel=0.1)


def test_findings_ranked_by_replayed_time_lost_and_combined(analyses):
    a = _analysis(analyses, "straggler_transient")
    lost = [f.time_lost_ns for f in a.findings]
    assert lost == sorted(lost, reverse=True)
    section = a.whatif
    assert section.step_time_without_all_ns <= section.step_time_ns
    # steps 4 and 7 carry the straggler: their what-if is well below what was observed
    by_step = {r.step: r for r in section.steps}
    for s in (4, 7):
        assert by_step[s].without_all_ns < 0.8 * by_step[s].observed_ns


def test_whatif_fields_round_trip_and_render(analyses):
    a = _analysis(analyses, "straggler_persistent")
    back = Analysis.from_dict(a.to_dict())
    assert back.whatif == a.whatif
    assert back.findings[0].step_time_without_ns == a.findings[0].step_time_without_ns
    assert back.findings[0].whatif == a.findings[0].whatif
    assert Finding.from_dict({**a.findings[0].to_dict(), "whatif": "<b>"}).whatif == "<b>"
    html = render_html(back)
    assert 'id="whatif"' in html
    assert "what-if: without rank 2" in html
    hostile = Finding.from_dict({**a.findings[0].to_dict(), "whatif": "<script>x</script>"})
    page = render_html(Analysis(**{**back.__dict__, "findings": (hostile,)}))
    assert "<script>x</script>" not in page


PAIRED = ROOT / "fixtures" / "paired"


@pytest.mark.parametrize(("pair", "cause"), [("straggler_alt_r0", "compute_straggler"), ("data_alt_r1", "input_bound")])
def test_whatif_predicts_the_healthy_steps_of_an_alternating_run(pair, cause):
    """One real run, the cause injected on odd steps only (same machine load on both sides): the
    what-if of the injected steps predicts the healthy steps within 15% (docs/analyze.md, paired runs)."""
    import json

    manifest = json.loads((PAIRED / pair / "run" / "manifest.json").read_text())
    a = tracediag.analyze(tracediag.load(PAIRED / pair / "run", jobs=1))
    f = next(f for f in a.findings if f.cause == cause)
    assert set(f.steps) <= set(manifest["injected_steps"])
    per_step = a.steps.group_by("step").agg(pl.col("dur_ns").median())
    healthy = per_step.filter(pl.col("step").is_in(manifest["healthy_steps"]))["dur_ns"].median()
    injected = per_step.filter(pl.col("step").is_in(manifest["injected_steps"]))["dur_ns"].median()
    assert injected > 1.5 * healthy  # the cause is there
    assert f.step_time_without_ns == pytest.approx(healthy, rel=0.15)


def test_a_replay_bug_is_not_hidden(monkeypatch):
    """No broad except around the replay: a bug in it surfaces as the error it is, not as a warning."""
    import tracediag.reduce as reducing

    def broken(*args, **kwargs):
        msg = "no sync operation can be ordered"
        raise ValueError(msg)

    monkeypatch.setattr(reducing, "graph_of", broken)
    with pytest.raises(ValueError, match="no sync operation can be ordered"):
        tracediag.analyze(tracediag.load(RUNS / "straggler_persistent", jobs=1))


def test_unpaired_pipeline_keeps_the_detectors_estimate(analyses):
    """1F1B traces name no peers and carry no schedule annotations: the stages cannot be linked, so the
    finding is not priced by a replay that would treat them as independent."""
    f = next(f for f in _analysis(analyses, "pipeline_1f1b_m8").findings if f.cause == "pipeline_bubble")
    assert f.step_time_without_ns is None
    assert f.whatif == ""
    assert f.time_lost_ns > 0
    g = next(f for f in _analysis(analyses, "pipeline_gpipe_m8").findings if f.cause == "pipeline_bubble")
    assert g.step_time_without_ns is not None
    assert g.whatif


def test_each_category_of_a_segment_is_edited_on_its_own():
    """Rank 1's 30 ns before the all-reduce are 20 ns of compute and 10 ns idle in one segment: each
    category takes its own factor."""
    g = _graph()
    seg = g.segments.with_columns(
        compute_ns=pl.when(pl.col("rank") == 1).then(20).otherwise(pl.col("compute_ns")),
        idle_ns=pl.when(pl.col("rank") == 1).then(10).otherwise(0),
    )
    g = Graph(segments=seg, ops=g.ops, marks=g.marks, steps=g.steps)
    assert replay(g)["replay_ns"].to_list() == [35, 35]
    schema = {"rank": pl.Int32, "step": pl.Int32, "cat": pl.String, "factor": pl.Float64}
    no_idle = pl.DataFrame({"rank": [1], "step": [1], "cat": ["idle"], "factor": [0.0]}, schema=schema)
    # rank 1 arrives at 20, the all-reduce ends at 20 + 5
    assert replay(g, factors=no_idle)["replay_ns"].to_list() == [25, 25]
    both = pl.DataFrame(
        {"rank": [1, 1], "step": [1, 1], "cat": ["idle", "compute"], "factor": [0.0, 0.5]}, schema=schema
    )
    # 10 ns of compute left on rank 1, rank 0 computes 10 as well: the all-reduce ends at 15
    assert replay(g, factors=both)["replay_ns"].to_list() == [15, 15]
