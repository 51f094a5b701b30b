"""Warm-up steps, small samples and what a pipeline is (issue 11), on real runs."""

from __future__ import annotations

import polars as pl
from conftest import FIXTURES, KINETO

import tracediag
from tracediag.detect import Thresholds, straggler
from tracediag.detect.warmup import warmup_steps, without_steps
from tracediag.reduce import derive_facts

TWO_RANK = sorted(KINETO.glob("gen_torch2.13cpu_gloo_2rank_rank*.pt.trace.json.gz"))


def test_one_ranks_slow_first_step_is_a_straggler_not_warmup_nor_a_pipeline():
    """The generated 2-rank job: step 2 takes 33 ms on both ranks, but only rank 1 is slow in it (it
    computes 33x rank 0); rank 0 spends 25 ms of it waiting for rank 1 in collectives, so its own
    time is no more than in step 3. Warm-up is every rank slow on its own (issue 24), so step 2 is
    rank 1 straggling. It sends one tensor per step and idles 21% against a 2-stage ideal of 50%:
    not a pipeline bubble."""
    run = tracediag.load(TWO_RANK, jobs=1)
    facts = derive_facts(run).facts
    s = facts.steps
    # every rank's step is >= 1.5x its later one: the old rule (step time alone) called it warm-up
    slow = s.pivot(on="step", index="rank", values="dur_ns").select(pl.col("2") / pl.col("3"))
    assert slow.min().item() >= Thresholds().warmup_ratio
    own = s.filter(pl.col("rank") == 0).select(pl.col("dur_ns") - pl.col("wait_ns"))["dur_ns"].to_list()
    assert own[0] < own[1]  # rank 0 alone, less its wait: step 2 is not slower than step 3
    assert warmup_steps(s, Thresholds()) == []
    a = tracediag.analyze(run)
    causes = [f.cause for f in a.findings]
    assert "pipeline_bubble" not in causes
    assert not any("warm-up" in w for w in a.warnings)
    (straggler_finding,) = [f for f in a.findings if f.cause == "compute_straggler"]
    assert straggler_finding.ranks == (1,)
    assert straggler_finding.steps == (2,)
    assert a.step_numbers == [2, 3]
    assert a.pipelines[0].expected_bubble_share == 0.5


def test_persistent_needs_enough_steps():
    """The real persistent straggler (rank 2, 2.3x on 8 of 8 steps) seen on one step is not called
    persistent (the pattern on 1 of 1 or 1 of 2 steps says nothing about persistence); on 2 steps it is."""
    facts = derive_facts(tracediag.load(sorted((FIXTURES / "runs" / "straggler_persistent").glob("rank*.gz")))).facts
    th = Thresholds()
    steps = sorted(facts.steps["step"].unique().to_list())
    full = straggler.detect(facts, thresholds=th)
    assert [(f.ranks, f.evidence["kind"]) for f in full] == [((2,), "persistent")]
    one = without_steps(facts, steps[1:])
    assert one.steps["step"].n_unique() == 1
    assert all(f.evidence["kind"] != "persistent" for f in straggler.detect(one, thresholds=th))
    two = without_steps(facts, steps[2:])
    assert [f.evidence["kind"] for f in straggler.detect(two, thresholds=th)] == ["persistent"]


def test_no_warmup_on_the_fixture_runs():
    """The fixture runs start at their steady pace (first analysed step ≤ 1.3x the later ones)."""
    for d in sorted((FIXTURES / "runs").glob("*/manifest.json")):
        facts = derive_facts(tracediag.load(sorted(d.parent.glob("*.pt.trace.json.gz")), jobs=1)).facts
        assert warmup_steps(facts.steps, Thresholds()) == [], d.parent.name
    steps = pl.DataFrame({"rank": [0, 1] * 3, "step": [1, 1, 2, 2, 3, 3], "dur_ns": [30, 31, 10, 11, 10, 12]})
    assert warmup_steps(steps, Thresholds()) == [1]
