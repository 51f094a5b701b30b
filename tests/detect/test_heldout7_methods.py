"""Method errors found by round 7 of the held-out runs (benchmarks/heldout_validation.md), each on a real run
of fixtures/runs adopted from the held-out rounds (`adopt_heldout_run.py`)."""

from __future__ import annotations

import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause


@pytest.fixture(scope="module")
def analyses():
    return {
        name: tracediag.analyze(tracediag.load(sorted((RUNS / name).glob("*.pt.trace.json.gz")), jobs=1))
        for name in ("mix_strag_input_gen", "gil_thread", "throttled", "input_bound")
    }


def _one(analysis, cause):
    (f,) = [f for f in analysis.findings if f.cause is cause]
    return f


def test_a_loader_under_a_straggler_is_input_bound_against_the_steps_own_time(analyses):
    # every rank's unannotated loader idles it ~300 ms before each step; rank 1's extra compute stretches the
    # steps to ~1.3 s, 18-23% of which the loader is: against the step less the waiting for the straggler
    # (median over the ranks) it is 25-42% on every rank
    f = _one(analyses["mix_strag_input_gen"], Cause.INPUT_BOUND)
    assert (f.ranks, f.steps) == ((0, 1, 2, 3), tuple(range(2, 10)))
    assert min(f.evidence["input_share_by_rank"].values()) >= 0.3
    assert f.evidence["loader_annotated"] is False


def test_a_loader_with_no_straggler_reads_as_before(analyses):
    # no rank waits for another much there: the same shares as against the whole step (0.596-0.612 by rank)
    f = _one(analyses["input_bound"], Cause.INPUT_BOUND)
    assert f.evidence["input_share_median"] == pytest.approx(0.605, abs=0.005)


def test_framework_time_between_operators_is_host_time_not_compute(analyses):
    # rank 1's busy Python thread holds the GIL: its ATen operators take no longer than its peers' (0.96x), the
    # excess is the own time of autograd engine nodes (evaluate_function: AddmmBackward0 470 vs 6 ms), host time
    f = _one(analyses["gil_thread"], Cause.HOST_STRAGGLER)
    assert f.ranks == (1,)
    assert f.evidence["reason"] == "host"
    assert f.evidence["framework_excess_ms"] >= 0.5 * f.evidence["compute_excess_ms"]
    assert not [g for g in analyses["gil_thread"].findings if g.cause is Cause.COMPUTE_STRAGGLER]


def test_a_throttled_rank_stays_a_compute_straggler(analyses):
    # a CPU quota stretches the operators themselves: no framework excess, compute is the reason
    f = _one(analyses["throttled"], Cause.COMPUTE_STRAGGLER)
    assert f.ranks == (1,)
    assert f.evidence["reason"] == "compute"
    assert f.evidence["framework_excess_ms"] < 0.05 * f.evidence["compute_excess_ms"]


@pytest.mark.parametrize(("name", "least_ms"), [("input_bound", 100), ("mix_strag_input_gen", 250)])
def test_the_tail_of_the_previous_steps_work_is_no_activity_of_the_next(analyses, name, least_ms):
    # every rank's loader sleeps before each step's first operator (120 / 300 ms); on 4 rank-steps of each run a
    # gloo all-reduce's worker row of the step before ends tens of µs after the next step's marker begins, which
    # made those steps' lead idle 0 (round 7's mix_strag_gen_w3 lost a step of its input_bound that way)
    lead = analyses[name].steps["lead_idle_ns"]
    assert lead.min() >= least_ms * 1_000_000


def test_the_host_stragglers_whatif_takes_its_framework_time_out_too(analyses):
    # the kernel table is gone by the pricing: the finding carries the framework time per step, and the what-if
    # takes it out of the rank's compute besides cutting its idle to its peers'
    f = _one(analyses["gil_thread"], Cause.HOST_STRAGGLER)
    per_step = f.evidence["framework_ms_by_step"]
    assert set(per_step) == {str(s) for s in f.steps}
    assert sum(per_step.values()) == pytest.approx(f.evidence["framework_excess_ms"], rel=0.01)
    assert "ms of framework time between its operators" in f.whatif
