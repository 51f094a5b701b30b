"""Issue 24 item 3: stage_imbalance and sequence_imbalance on real gloo runs, and the lateness heat map.

The runs are fixtures/runs/stage_imbalance (a 4-stage GPipe pipeline whose last stage also computes
4096-class logits and the loss) and fixtures/runs/sequence_imbalance (4 DDP ranks, a different rank
drawing the long sequences on most steps), made by fixtures/runs/make_imbalance_runs.py.
"""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest
from conftest import FIXTURES

import tracediag
from tracediag.causes import detect_all
from tracediag.detect import Thresholds
from tracediag.reduce import derive_facts
from tracediag.report import figures
from tracediag.report.html import render_html
from tracediag.whatif import causes, graph_of

RUNS = FIXTURES / "runs"


def _load(name: str) -> tracediag.Run:
    return tracediag.load(sorted(RUNS.glob(f"{name}/rank*.pt.trace.json.gz")), jobs=1)


def _manifest(name: str) -> dict:
    return json.loads((RUNS / name / "manifest.json").read_text())


@pytest.fixture(scope="module")
def stage_run():
    return _load("stage_imbalance")


@pytest.fixture(scope="module")
def seq_run():
    return _load("sequence_imbalance")


@pytest.fixture(scope="module")
def stage(stage_run):
    return tracediag.analyze(stage_run)


@pytest.fixture(scope="module")
def seq(seq_run):
    return tracediag.analyze(seq_run)


def test_heavy_last_stage_is_named_with_the_ops_that_make_the_difference(stage):
    (f,) = stage.findings
    assert f.cause == "stage_imbalance"
    assert f.ranks == (3,)
    ev = f.evidence
    assert (ev["stage"], ev["p"], ev["m"]) == (3, 4, 8)
    assert ev["stage_ranks"] == (0, 1, 2, 3)
    by_stage = ev["compute_ms_per_microbatch_by_stage"]
    assert by_stage["3"] == max(by_stage.values())
    assert ev["compute_ratio"] >= 1.8  # the validation measured >= 2x on every step
    # the loss runs only on the last stage; the matrix products make most of the difference
    ops = {o["name"]: o for o in ev["ops_difference"]}
    assert ops["aten::_log_softmax"]["only_this_stage"]
    assert {"aten::mm", "aten::addmm"} <= set(ops)
    assert not ops["aten::mm"]["only_this_stage"]
    # the bubble is the effect: its numbers are in this finding, not a second one
    assert ev["idle_share_by_stage"]["3"] < min(ev["idle_share_by_stage"][s] for s in "012")
    assert ev["expected_bubble_share"] == pytest.approx(3 / 11, abs=1e-3)
    assert stage.pipelines
    assert stage.pipelines[0].ranks == (0, 1, 2, 3)
    assert "mean stage compute" in f.whatif


def test_without_the_heavy_stage_the_same_pipeline_is_a_bubble(stage_run):
    """The precedence rule: a pipeline whose stages pass the balance test keeps pipeline_bubble."""
    facts = derive_facts(stage_run).facts
    (f,) = detect_all(facts, thresholds=Thresholds(stage_ratio=10.0))
    assert f.cause == "pipeline_bubble"
    assert f.ranks == (0, 1, 2, 3)
    (g,) = detect_all(facts)
    assert g.cause == "stage_imbalance"


def test_balanced_pipelines_stay_below_the_stage_ratio():
    for name in ("pipeline_gpipe_m8", "pipeline_1f1b_m8", "pipeline_gpipe_m1"):
        facts = derive_facts(_load(name)).facts
        per_rank = facts.steps.group_by("rank").agg(pl.col("compute_ns").median())["compute_ns"].sort()
        light = per_rank[:-1].median()
        assert per_rank[-1] / light < Thresholds().stage_ratio, name
        assert [f.cause for f in detect_all(facts)] == ["pipeline_bubble"], name


def test_changing_slowest_rank_is_sequence_imbalance(seq):
    (f,) = seq.findings
    assert f.cause == "sequence_imbalance"
    assert f.ranks == (0, 1, 2, 3)
    ev = f.evidence
    assert ev["distinct_slowest_ranks"] >= 3
    assert ev["most_steps_one_rank"] <= len(ev["imbalanced_steps"]) / 2
    assert ev["compute_ratio_median"] >= 1.5
    # the slowest rank of each step is the one the script gave the long sequences
    longs = _manifest("sequence_imbalance")["details"]["long_rank_by_step"]
    named = ev["slowest_rank_by_step"]
    agree = sum(named[s] == longs[s] for s in named)
    assert agree >= len(named) - 1
    assert set(ev["imbalanced_steps"]) <= set(f.steps)
    assert "balanced batches" in f.whatif
    assert 0 < f.step_time_without_ns < seq.steps["dur_ns"].median()


def test_one_persistent_straggler_is_not_uneven_batches():
    """The straggler run's rank 2 is slowest on every step: compute_straggler, not sequence_imbalance,
    even with the persistent rule switched off (then its steps are transient ones of one rank)."""
    facts = derive_facts(_load("straggler_persistent")).facts
    off = Thresholds(straggler_persistent_ratio=100.0, straggler_pattern_share=1.01)
    for th in (Thresholds(), off):
        assert "sequence_imbalance" not in {f.cause for f in detect_all(facts, thresholds=th)}


def test_balanced_edit_keeps_the_work_and_evens_it(seq_run):
    derived = derive_facts(seq_run)
    facts = derived.facts
    graph = graph_of(facts, derived.replay)
    edit = causes.balance(graph, facts.steps, (0, 1, 2, 3), ())
    after = facts.steps.join(edit.factors.select("rank", "step", "factor"), on=["rank", "step"]).with_columns(
        new=pl.col("compute_ns") * pl.col("factor")
    )
    per_step = after.group_by("step").agg(
        before=pl.col("compute_ns").sum(), after=pl.col("new").sum(), spread=pl.col("new").max() - pl.col("new").min()
    )
    assert (per_step["after"] - per_step["before"]).abs().max() < 1e-6 * per_step["before"].max()
    assert per_step["spread"].max() < 1.0  # ns: every rank at the mean
    assert after["factor"].max() > 1.5
    assert after["factor"].min() < 0.7


def _z(fig: figures.Figure) -> list[list[float]]:
    return [list(row) for row in fig.figure.data[0].z]


def test_lateness_heat_map_shows_spot_stripe_and_scatter(seq, stage):
    spot = tracediag.analyze(_load("straggler_persistent"))
    for analysis, hot_rows in ((spot, {2}), (stage, {3})):
        z = _z(figures.lateness(analysis.steps))
        hottest = {max(range(len(z)), key=lambda r: z[r][c]) for c in range(len(z[0]))}
        assert hottest == hot_rows  # one row every step: a hot spot (a worker) or a stripe (a stage)
    z = _z(figures.lateness(seq.steps))
    hottest = [max(range(len(z)), key=lambda r: z[r][c]) for c in range(len(z[0]))]
    assert len(set(hottest)) >= 3  # scatter
    assert min(min(row) for row in z) >= 0
    page = render_html(seq)
    assert 'id="fig-lateness"' in page
    assert page.index('id="fig-compute"') < page.index('id="fig-lateness"') < page.index('<section id="breakdown">')


def test_the_effects_are_absorbed_not_reported(seq_run, stage_run):
    """Alone, the straggler rule sees single slow steps of the ranks that drew the long sequences, and
    the bubble rule sees the heavy stage's bubble; with the causes found, they are not reported."""
    from tracediag.detect import pipeline, straggler

    th = Thresholds()
    facts = derive_facts(seq_run).facts
    transient = straggler.detect(facts, thresholds=th)
    assert transient
    assert all(f.evidence["kind"] == "transient" for f in transient)
    (seq,) = detect_all(facts)
    assert seq.cause == "sequence_imbalance"
    assert all(set(f.steps) <= set(seq.steps) for f in transient)
    facts = derive_facts(stage_run).facts
    assert [f.cause for f in pipeline.detect(facts, thresholds=th)] == ["pipeline_bubble"]
    assert [f.cause for f in detect_all(facts)] == ["stage_imbalance"]


def test_recorded_shapes_that_rule_uneven_batches_out(seq_run):
    """The uneven-batch run with its recorded Σ sequence length² replaced: made equal on every rank-step
    (the batches are balanced), or shuffled across rank-steps (the compute no longer follows them) — the
    changing slowest rank is then not uneven batches. Left as recorded, it is (r 0.86)."""
    facts = derive_facts(seq_run).facts
    th = Thresholds()

    def causes(steps: pl.DataFrame) -> set[str]:
        return {f.cause for f in detect_all(dataclasses.replace(facts, steps=steps), thresholds=th)}

    steps = facts.steps
    assert steps["seq_sq"].null_count() == 0
    assert steps["seq_sq"].n_unique() > 1
    assert "sequence_imbalance" in causes(steps)
    assert "sequence_imbalance" not in causes(steps.with_columns(seq_sq=pl.lit(4 * 512**2, pl.Int64)))
    # the compute of each rank-step against another's batch: a fixed shuffle (seeded) keeps the values
    shuffled = steps["seq_sq"].shuffle(seed=7)
    r = (
        pl.DataFrame({"c": steps["compute_ns"].cast(pl.Float64), "q": shuffled.cast(pl.Float64)})
        .select(pl.corr("c", "q"))
        .item()
    )
    assert r < th.seq_min_corr
    assert "sequence_imbalance" not in causes(steps.with_columns(seq_sq=shuffled))
