"""Method errors found by round 8 of the held-out runs (benchmarks/heldout_validation.md), each on a real run
of fixtures/runs adopted from the held-out rounds (`adopt_heldout_run.py`)."""

from __future__ import annotations

import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause


@pytest.fixture(scope="module")
def analysis():
    return tracediag.analyze(tracediag.load(sorted((RUNS / "mix_strag_host_same").glob("*.pt.trace.json.gz")), jobs=1))


def test_a_straggler_behind_another_cause_keeps_only_its_own_steps(analysis):
    # rank 1 computes 1.5-2.8x every step and is last on 2, 4, 6; on 3 and 5 rank 2's 1.5 s sleep makes it last,
    # and rank 1 (1.55x, 2.06x there) waits 1.4 s and 1.1 s for it: the peers waited for rank 2, so those steps
    # are not rank 1's though its ratio reaches that of its own steps
    (f,) = [f for f in analysis.findings if f.cause is Cause.COMPUTE_STRAGGLER]
    assert (f.ranks, f.steps) == ((1,), (2, 4, 6))
    (h,) = [f for f in analysis.findings if f.cause is Cause.HOST_STRAGGLER]
    assert h.ranks == (2,)
    assert not set(f.steps) & set(h.steps)
