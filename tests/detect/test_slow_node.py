"""A slow node (fixtures/runs/slow_node_6: ranks 4 and 5 both run 2x36 extra matmuls, the manifest's
culprits; real gloo run on one host): on the host's one clock rank 5 is the last arrival at every all-reduce
and rank 4 within the tie margin of it at 4 of 6, so the blame of the last arrivers already names both; the
counterfactual (had rank 5 arrived with the others, they would still wait for rank 4) says the same, and the
node is explained and priced as one finding."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause
from tracediag.causes import price
from tracediag.derive import lateness
from tracediag.detect.thresholds import Thresholds
from tracediag.reduce import derive_facts
from tracediag.whatif import graph_of

RUN = RUNS / "slow_node_6"


@pytest.fixture(scope="module")
def run() -> tracediag.Run:
    return tracediag.load(RUN, jobs=1)


@pytest.fixture(scope="module")
def rows(run) -> pl.DataFrame:
    return derive_facts(run).facts.late


def test_the_last_arrival_alone_explains_little_counterfactually(rows) -> None:
    blamed = lateness.per_rank(rows)
    assert blamed["rank"].to_list()[:2] == [5, 4]  # the blame of the last arrivers: the node's two ranks
    assert blamed.filter(pl.col("rank") == 5)["last_n"].item() == 6  # last at every all-reduce
    assert blamed.filter(pl.col("rank") == 4)["last_n"].item() == 4  # tied with it at 4 of 6
    assert blamed.filter(pl.col("rank").is_in([4, 5]))["share"].sum() == pytest.approx(1.0)
    assert blamed.filter(pl.col("rank") == 5)["share"].item() > 2 * blamed.filter(pl.col("rank") == 4)["share"].item()
    alone, both = lateness.explained(rows, [5]), lateness.explained(rows, [4, 5])
    assert alone < Thresholds().lateness_share  # fixed alone, the others still wait for rank 4
    assert both > 3 * alone  # ... together they explain most of it
    assert both > Thresholds().lateness_share
    assert lateness.explained(rows, []) == 0.0
    assert lateness.explained(rows, sorted(rows["rank"].unique())) == pytest.approx(1.0)


def test_rank_4_is_late_together_with_rank_5(rows) -> None:
    th = Thresholds()
    late = lateness.late_at(rows, [4, 5], th.lateness_late_share)
    assert late[4] == late[5] == set(rows["iid"].unique())
    assert lateness.with_masked(
        rows, (5,), share=th.lateness_share, most=th.lateness_masked, late_share=th.lateness_late_share,
        together=th.lateness_together,
    ) == (4, 5)  # fmt: skip
    # no masked rank to add: the set is left as it is
    assert lateness.with_masked(rows, (4, 5), share=0.5, most=8, late_share=0.5, together=0.5) == (4, 5)
    assert lateness.with_masked(rows, (5,), share=0.5, most=0, late_share=0.5, together=0.5) == (5,)


def test_the_node_is_one_finding_priced_as_one(run) -> None:
    a = tracediag.analyze(run)
    assert a.lateness.waited_for == (4, 5)
    (f,) = [f for f in a.findings if f.cause is Cause.COMPUTE_STRAGGLER]
    assert f.ranks == (4, 5)
    assert f.summary.startswith("ranks 4, 5 compute ")
    assert "(persistent, late together)" in f.summary
    assert f.evidence["late_arrivals"] == a.lateness.instances  # instances, not rank-instances
    # named by the blame itself on the host's clock: the masked-rank step is not needed here
    assert tracediag.analyze(run, thresholds=Thresholds(lateness_masked=0)).lateness.waited_for == (4, 5)
    # priced together: removing both ranks' extra compute saves most of the peers' wait, more than either alone
    d = derive_facts(run)
    graph = graph_of(d.facts, d.replay)
    for one in (4, 5):
        (g,), _ = price((dataclasses.replace(f, ranks=(one,)),), d.facts, graph)
        assert f.time_lost_ns > 2 * g.time_lost_ns
        assert f.step_time_without_ns < g.step_time_without_ns
