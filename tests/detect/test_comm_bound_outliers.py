"""comm_bound beside a straggler (round 9 of the held-out runs): the waiting the straggler causes is left out
of the exposed share, so a job that is both straggling and communication-bound keeps both findings, and a
straggler alone does not make its waiting peers read communication-bound. Real runs of fixtures/runs:
fsdp2_uneven (FSDP2 on gloo, rank 2's batch 4x) and fsdp2_even (the same job, every batch equal)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause
from tracediag.detect.thresholds import Thresholds


def _analyze(name: str):
    return tracediag.analyze(tracediag.load(sorted((RUNS / name).glob("*.pt.trace.json.gz")), jobs=1))


@pytest.fixture(scope="module")
def uneven():
    return _analyze("fsdp2_uneven")


def _raw_share(a, ranks) -> float:
    """Median over `ranks` of each rank's median exposed collective share, waiting included (the old rule)."""
    s = a.steps.filter(pl.col("rank").is_in(ranks))
    share = (pl.col("exposed_comm_ns") - pl.col("exposed_p2p_ns")) / pl.col("dur_ns")
    return float(s.group_by("rank").agg(share.median())["exposed_comm_ns"].median())


def test_a_straggler_and_exposed_communication_are_both_found(uneven):
    (strag,) = [f for f in uneven.findings if f.cause is Cause.COMPUTE_STRAGGLER]
    (comm,) = [f for f in uneven.findings if f.cause is Cause.COMM_BOUND]
    assert strag.ranks == (2,)
    assert comm.ranks == (0, 1, 2, 3)
    assert "waited for rank 2 taken out" in comm.summary
    # the peers wait for rank 2 inside the collectives: that part is left out of the share they are judged on
    wait = comm.evidence["outlier_wait_ms_median"]
    assert wait > 100
    share = comm.evidence["exposed_comm_share_median"]
    assert Thresholds().comm_share <= share < _raw_share(uneven, [0, 1, 3]) - 0.05


def test_the_same_job_without_the_straggler_is_communication_bound():
    # fsdp2_even: what fsdp2_uneven's job is with rank 2's batch like the others'
    (comm,) = _analyze("fsdp2_even").findings
    assert comm.cause is Cause.COMM_BOUND
    assert "outlier_wait_ms_median" not in comm.evidence


def test_a_straggler_alone_leaves_its_peers_waiting_not_communicating():
    # straggler_persistent: DDP whose all-reduces are small; the peers' exposed time is their wait for rank 2
    a = _analyze("straggler_persistent")
    assert [f.cause for f in a.findings] == [Cause.COMPUTE_STRAGGLER]
    assert _raw_share(a, [0, 1, 3]) >= Thresholds().comm_share  # what the share read with the waiting in
