"""The what-if replay on real pipelines (gloo, send/recv): compute changes carry through the waits.

On gloo a send or recv is closed where its rank waits for it, so its observed duration holds the
wait for the peer and, for a send waited for at the end of the forward, the rank's own compute
meanwhile: a replay that kept those durations could not shorten a step by shortening compute.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import ROOT

import tracediag
from tracediag.reduce import derive_facts
from tracediag.whatif import graph_of
from tracediag.whatif.replay import replay, step_times

RUNS = ROOT / "fixtures" / "runs"
PIPELINES = ("pipeline_gpipe_m8", "stage_imbalance")


@pytest.fixture(scope="module", params=PIPELINES)
def pipeline(request):
    path = RUNS / request.param
    derived = derive_facts(tracediag.load(path, jobs=1))
    facts = derived.facts
    details = json.loads((path / "manifest.json").read_text())["details"]
    return facts, graph_of(facts, derived.replay), details


def _scaled(facts, factor: float) -> pl.DataFrame:
    return facts.steps.select("rank", "step", cat=pl.lit("compute"), factor=pl.lit(factor))


def test_observed_durations_replay_the_observed_steps(pipeline):
    _facts, graph, _ = pipeline
    base = step_times(replay(graph))
    err = ((base["replay_ns"] - base["dur_ns"]).abs() / base["dur_ns"]).to_list()
    assert graph.ops.filter(pl.col("kind") == "p2p").height > 0
    assert max(err) <= 0.05


def test_halving_compute_shortens_every_step_by_the_schedule_bound(pipeline):
    """GPipe over p stages and m micro-batches: the heaviest stage computes its m micro-batches one
    after the other, and the others wait for it in at least m of the m + p - 1 slots of the schedule,
    so halving every stage's compute saves at least half its compute times m / (m + p - 1), every step."""
    facts, graph, details = pipeline
    m, p = details["n_microbatches"], details["num_stages"]
    heaviest = facts.steps.group_by("step").agg(pl.col("compute_ns").max())
    base = step_times(replay(graph))
    half = step_times(replay(graph, factors=_scaled(facts, 0.5)))
    t = base.join(half.select("step", half="replay_ns"), on="step").join(heaviest, on="step")
    assert t.height == facts.steps["step"].n_unique()
    bound = 0.5 * t["compute_ns"] * m / (m + p - 1)
    saved = t["replay_ns"] - t["half"]
    assert (saved >= bound).all(), t.with_columns(saved=saved, bound=bound)


def test_doubling_compute_lengthens_every_step(pipeline):
    """The same bound the other way: twice the compute costs at least the heaviest stage's compute
    times m / (m + p - 1) more, every step (no step is held at its observed length)."""
    facts, graph, details = pipeline
    m, p = details["n_microbatches"], details["num_stages"]
    heaviest = facts.steps.group_by("step").agg(pl.col("compute_ns").max())
    base = step_times(replay(graph))
    double = step_times(replay(graph, factors=_scaled(facts, 2.0)))
    t = base.join(double.select("step", double="replay_ns"), on="step").join(heaviest, on="step")
    assert ((t["double"] - t["replay_ns"]) >= t["compute_ns"] * m / (m + p - 1)).all()
