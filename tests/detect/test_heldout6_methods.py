"""Method errors found by round 6 of the held-out runs (benchmarks/heldout_validation.md), each on a real run
of fixtures/runs adopted from it (`adopt_heldout_run.py`)."""

from __future__ import annotations

import json

import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause


@pytest.fixture(scope="module")
def analyses():
    return {
        name: tracediag.analyze(tracediag.load(sorted((RUNS / name).glob("*.pt.trace.json.gz")), jobs=1))
        for name in ("gil_thread", "moving_straggler", "sequence_imbalance")
    }


def test_a_rank_waited_for_step_after_step_keeps_its_smaller_steps(analyses):
    # rank 1 (a GIL-holding Python thread) causes all the waiting of steps 3-8, 21-75% of the median step per
    # waiting rank: half its worst step would keep only 4-6 and call it transient
    (f,) = [f for f in analyses["gil_thread"].findings if 1 in f.ranks]
    assert f.steps == (3, 4, 5, 6, 7, 8)
    assert f.cause is Cause.HOST_STRAGGLER  # round 7: its excess compute is framework time (test_heldout7_methods)


def test_a_straggler_moving_between_ranks_is_a_transient_straggler_per_rank(analyses):
    manifest = json.loads((RUNS / "moving_straggler" / "manifest.json").read_text())
    want = {(tuple(e["ranks"]), tuple(e["steps"])) for e in [manifest, *manifest["also"]]}
    found = analyses["moving_straggler"].findings
    assert {f.cause for f in found} == {Cause.COMPUTE_STRAGGLER}
    assert {(f.ranks, f.steps) for f in found} == want
    # the slow rank-steps run more operators than their peers: extra work, not a longer batch
    assert all(f.evidence["slowest_ops_ratio"] >= 1.1 and f.evidence["kind"] == "transient" for f in found)


def test_uneven_batches_run_the_same_operators(analyses):
    (f,) = analyses["sequence_imbalance"].findings
    assert f.cause is Cause.SEQUENCE_IMBALANCE
    assert f.evidence["slowest_ops_ratio"] == pytest.approx(1.0, abs=0.02)
