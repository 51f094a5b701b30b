"""The method error found by round 10 of the held-out runs (benchmarks/heldout_validation.md): a CPU-only rank late
from many small operators and `.item()` reads is host time, not compute; on fixtures/runs/item_sync
(make_lateness_runs.py) and, for the rule's other side, on a rank late from extra matmuls."""

from __future__ import annotations

import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause


def _analysis(name):
    return tracediag.analyze(tracediag.load(sorted((RUNS / name).glob("*.pt.trace.json.gz")), jobs=1))


@pytest.fixture(scope="module")
def item_sync():
    return _analysis("item_sync")


def test_many_small_operators_are_host_time(item_sync):
    # rank 2 runs ~19x its peers' operators, each a few microseconds (select, mul, sum, item): without the rule its
    # excess window read as compute (a compute_straggler, "more work")
    (f,) = item_sync.findings
    assert f.cause is Cause.HOST_STRAGGLER
    assert f.ranks == (2,)
    assert f.evidence["ops_ratio"] >= 10
    assert f.evidence["small_ops_excess_ms"] >= 0.5 * f.evidence["compute_excess_ms"]
    assert f.evidence["idle_excess_ms"] + f.evidence["small_ops_excess_ms"] >= 0.5 * f.evidence["window_excess_ms"]
    per_step = f.evidence["small_ops_ms_by_step"]  # what the what-if takes out of its compute
    assert per_step
    assert {int(k) for k in per_step} <= set(f.steps)
    assert all(v > 0 for v in per_step.values())
    assert "too small to be arithmetic" in f.summary


def test_extra_matmuls_stay_compute():
    # straggler_persistent's rank 2 runs 1.65x its peers' operators, the extra ones matmuls longer than the mean
    (f,) = [f for f in _analysis("straggler_persistent").findings if f.cause is Cause.COMPUTE_STRAGGLER]
    assert f.evidence["reason"] == "compute"
    assert f.evidence["small_ops_excess_ms"] == 0
