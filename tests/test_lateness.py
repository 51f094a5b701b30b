"""Who everyone waits for, per collective instance (issue 24), on real runs."""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import FIXTURES, SAMPLES, needs_shared

import tracediag
from tracediag.analysis import Analysis
from tracediag.derive import lateness
from tracediag.derive.lateness import per_rank
from tracediag.detect import Thresholds
from tracediag.detect import lateness as lateness_detect
from tracediag.detect.warmup import without_steps
from tracediag.reduce import derive_facts
from tracediag.report.text import render_text

RUNS = FIXTURES / "runs"
DLRM = SAMPLES / "gpu-public" / "dlrm_v100_8rank"


def _facts(name: str):
    return derive_facts(tracediag.load(sorted((RUNS / name).glob("rank*.pt.trace.json.gz")), jobs=1)).facts


def test_blame_adds_up_to_the_waiting_and_goes_to_the_last_arrivers():
    """On the real transient-straggler run: every instance's waiting is blamed on its last arrivers
    only, and the blame over the run sums to the waiting (to rounding)."""
    facts = _facts("straggler_transient")
    rows = facts.late
    assert rows.height == 16 * 4  # 2 all-reduces per step x 8 steps, on 4 ranks
    assert rows.filter(~pl.col("is_last"))["caused_ns"].sum() == 0
    per_inst = rows.group_by("iid").agg(pl.col("wait_ns").sum(), pl.col("caused_ns").sum())
    assert (per_inst["wait_ns"] - per_inst["caused_ns"]).abs().max() <= 4  # rounding, per rank
    # a last arriver arrives after the instance's median arrival
    assert (rows.filter("is_last")["late_ns"] >= 0).all()
    t = per_rank(rows)
    assert t["share"].sum() == pytest.approx(1.0, abs=1e-6)
    assert t["rank"][0] == 1  # the injected straggler causes the most


def test_one_step_is_enough_evidence():
    """The persistent straggler (rank 2) of the real run: the evidence is the instances, not the
    steps. One step holds only 2 all-reduces (last at 2 of 2 happens 6% of the time by chance with 4
    ranks): no one; 4 steps (8 of 8, 0.002%) and the full run (16 of 16) name rank 2."""
    facts = _facts("straggler_persistent")
    th = Thresholds()
    steps = sorted(facts.steps["step"].unique().to_list())
    full = lateness_detect.assess(facts, th)
    assert full.waited_for == (2,)
    assert full.share == pytest.approx(1.0)
    one = lateness_detect.assess(without_steps(facts, steps[1:]), th)
    assert one.instances == 2
    assert one.waited_for == ()
    assert "chance" in one.reason
    assert one.ranks["rank"][0] == 2
    assert one.ranks["last_n"][0] == 2
    four = lateness_detect.assess(without_steps(facts, steps[4:]), th)
    assert four.waited_for == (2,)
    assert four.chance < th.lateness_chance


@pytest.mark.parametrize("name", ["healthy_ddp", "healthy_tp_dp", "input_bound"])
def test_no_one_on_runs_without_a_late_rank(name):
    late = lateness_detect.assess(_facts(name), Thresholds())
    assert late.waited_for == ()
    assert late.reason
    assert late.share < Thresholds().lateness_share or late.gap < Thresholds().lateness_gap


def test_load_noise_taking_turns_is_no_one():
    """comm_bound (one host, one clock; no rank slowed): ranks 0 and 2 cause most of the waiting (share and gap
    pass) and one of them is last at each of the 8 all-reduces, 0.5^8 = 0.4% by chance for a given pair; but
    they are late at different all-reduces (5 and 3 of 8), two claims picked as the top 2 of 4 ranks: over the
    6 pairs that could have been picked, 2.3% (> 1%): no one. A slow node's ranks, late at the same
    all-reduces, stay one claim."""
    th = Thresholds()
    facts = _facts("comm_bound")
    late = lateness_detect.assess(facts, th)
    assert late.waited_for == ()
    assert late.reason == "ranks 0, 2 are last this often by chance"
    assert late.share >= th.lateness_share
    assert late.gap >= th.lateness_gap
    assert lateness._chance(8, 8, 2 / 4) < th.lateness_chance  # what the pair passed as one claim
    assert late.chance == pytest.approx(6 * 0.5**8)
    assert late.chance > th.lateness_chance
    kw = {"late_share": th.lateness_late_share, "together": th.lateness_together}
    assert lateness.groups(facts.late, [0, 2], **kw) == [(0,), (2,)]
    node = _facts("slow_node_6").late
    assert lateness.groups(node, [5, 4], **kw) == [(4, 5)]
    assert lateness.set_chance(node, (4, 5), 6, **kw) == pytest.approx((2 / 6) ** 6)  # one claim: not multiplied


def test_in_the_analysis_json_and_text():
    run = tracediag.load(sorted((RUNS / "straggler_transient").glob("rank*.pt.trace.json.gz")), jobs=1)
    a = tracediag.analyze(run)
    assert a.lateness.waited_for == (1,)
    doc = json.loads(json.dumps(a.to_dict()))
    assert doc["lateness"]["waited_for"] == [1]
    assert doc["lateness"]["ranks"][0]["rank"] == 1
    back = Analysis.from_dict(doc)
    assert back.lateness.ranks.equals(a.lateness.ranks)
    assert back.lateness.waited_for == (1,)
    text = render_text(a)
    assert f"waited for: rank 1, {a.lateness.share:.0%} of the" in text


@needs_shared(DLRM)
def test_dlrm_8_gpus_no_one_is_waited_for_over_its_8_collectives():
    """The real 8xV100 DLRM step: 3 all-reduces and the 5 all_to_all of its embedding exchange (NCCL runs
    them as `ncclKernel_SendRecv_…` kernels, matched by the `c10d::alltoall_base_` they are launched in)
    are matched on every rank. Rank 7 arrives last at the first four exchanges and the first all-reduce,
    ranks 4 and 5 at the rest: rank 7 causes 37% of the waiting, below the 50% that names a rank — every
    rank's device waits on its host (host_bound), no one is the straggler."""
    facts = derive_facts(tracediag.load(sorted(DLRM.glob("*.pt.trace.json")), jobs=1)).facts
    rows = facts.late
    late = lateness_detect.assess(facts, Thresholds())
    assert late.instances == 8
    ops = facts.collectives.group_by("op").len()
    assert dict(zip(ops["op"], ops["len"])) == {"all_reduce": 3, "all_to_all": 5}
    top = late.ranks.row(0, named=True)
    assert top["rank"] == 7
    assert top["last_n"] == 5
    assert 0.3 < top["share"] < 0.5
    assert late.waited_for == ()
    assert late.reason == "the waiting is spread over the ranks"
    assert rows["rank"].n_unique() == 8


@pytest.mark.parametrize(
    ("name", "reason"),
    [("host_late", "host"), ("gc_pause", "gc"), ("checkpoint_every4", "host"), ("straggler_persistent", "compute")],
)
def test_why_the_waited_for_rank_is_late(name, reason):
    """Read from the late rank's windows against its peers' of the same instances, on real runs:
    a sleep and Python between forward and backward is idle with the host busy or absent (host); a
    gc.collect() pause the profiler records as `gc` events is gc; a torch.save the trace records no
    op for is host time again (it is named a checkpoint only when the trace names it); 36 extra
    matmuls are compute, with more ops than the peers (more work)."""
    facts = _facts(name)
    th = Thresholds()
    late = lateness_detect.assess(facts, th)
    manifest = json.loads((RUNS / name / "manifest.json").read_text())
    assert list(late.waited_for) == manifest["ranks"]
    steps = lateness_detect.late_steps(facts, late.waited_for, th)
    assert list(steps) == manifest["steps"]
    ex = lateness_detect.window_excess(facts, late.waited_for).filter(pl.col("step").is_in(list(steps)))
    got, nums = lateness_detect.reason_of(ex, th)
    assert got == reason
    if reason == "compute":
        assert nums["compute_kind"] == "more_ops"
        assert nums["ops_ratio"] > 1.5
        assert nums["compute_excess_ms"] >= th.lateness_reason_share * nums["window_excess_ms"]
    else:
        assert nums["idle_excess_ms"] >= th.lateness_reason_share * nums["window_excess_ms"]
        assert nums["compute_excess_ms"] < 0.5 * nums["idle_excess_ms"]
    if reason == "gc":
        assert nums["gc_ms"] >= th.lateness_reason_share * nums["window_excess_ms"]


def test_windows_are_per_rank_and_add_up():
    """The windows table is computed per rank: one rank's events alone give the same rows; compute
    and busy time lie inside the window."""
    from tracediag.derive.per_rank import rank_tables

    run = tracediag.load(sorted((RUNS / "gc_pause").glob("rank*.pt.trace.json.gz")), jobs=1)
    whole = rank_tables(run.events).windows
    alone = rank_tables(run.events.filter(pl.col("rank") == 3)).windows
    assert alone.equals(whole.filter(pl.col("rank") == 3))
    assert whole.height == rank_tables(run.events).instances.height
    assert (whole["compute_ns"] <= whole["busy_ns"]).all()
    assert (whole["busy_ns"] <= whole["window_ns"]).all()
    assert (whole.filter(pl.col("rank") == 3)["gc_ns"] > 0).sum() >= 2  # its two collections
    assert whole.filter(pl.col("rank") != 3)["gc_ns"].sum() == 0


def test_a_straggler_rules_finding_keeps_its_shape_and_gains_the_why():
    """The persistent straggler found by the straggler rules keeps its evidence keys and gains why
    it is late: it runs 1.65x its peers' compute ops (the 36 extra matmuls), measured on the steps'
    own op counts."""
    run = tracediag.load(sorted((RUNS / "straggler_persistent").glob("rank*.pt.trace.json.gz")), jobs=1)
    (f,) = tracediag.analyze(run).findings
    assert f.cause == "compute_straggler"
    assert f.ranks == (2,)
    for key in ("kind", "compute_ratio_median", "compute_ratio_by_step", "peer_wait_ms_median", "last_arrivals"):
        assert key in f.evidence
    assert f.evidence["kind"] == "persistent"
    assert f.evidence["reason"] == "compute"
    assert f.evidence["compute_kind"] == "more_ops"
    assert 1.5 < f.evidence["ops_ratio"] < 1.8
    assert "more work" in f.summary


def test_a_rank_set_without_the_late_rank_says_it_may_be_the_untraced_one():
    """host_late without rank 1 (its host late ~0.7 s every step): the traced ranks hardly wait for each
    other, the collectives end long after the last of them arrives; the answer is the untraced rank,
    not a traced one. With every rank, rank 1 is named and nothing is untraced."""
    run_dir = RUNS / "host_late"
    part = tracediag.analyze(tracediag.load([run_dir / f"rank{r}.pt.trace.json.gz" for r in (0, 2, 3)], jobs=1))
    late = part.lateness
    assert late.waited_for == ()
    assert late.untraced == (1,)
    assert late.after_last_ns > 5 * late.wait_ns
    assert late.reason.startswith("possibly untraced rank 1: 3 of 4 ranks traced")
    assert "waited for: possibly untraced rank 1" in render_text(part)
    whole = tracediag.analyze(tracediag.load(run_dir, jobs=1)).lateness
    assert whole.waited_for == (1,)
    assert whole.untraced == ()
    assert whole.after_last_ns < whole.wait_ns
