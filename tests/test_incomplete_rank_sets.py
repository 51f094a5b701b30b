"""A rank set that is not complete (some ranks of the stated world size have no trace), on the real gloo
host_late run (rank 1's host is late every step): the verdict says it is judged among the traced ranks,
names the untraced ones, lowers its confidence by what the collectives could hide, and a missing late
rank is not replaced by a traced one."""

from __future__ import annotations

import pytest
from conftest import RUNS

import tracediag
from tracediag.analysis import Cause

RUN = RUNS / "host_late"


def _analysis(drop: int | None) -> tracediag.Analysis:
    files = sorted(str(p) for p in RUN.glob("rank*.pt.trace.json.gz") if drop is None or f"rank{drop}." not in p.name)
    return tracediag.analyze(tracediag.load(files))


@pytest.fixture(scope="module")
def complete() -> tracediag.Analysis:
    return _analysis(None)


@pytest.fixture(scope="module")
def without_3() -> tracediag.Analysis:
    return _analysis(3)


def _host(a: tracediag.Analysis):
    (f,) = [f for f in a.findings if f.cause is Cause.HOST_STRAGGLER]
    return f


def test_a_complete_run_has_no_untraced_note(complete) -> None:
    f = _host(complete)
    assert f.ranks == (1,)
    assert "of all waiting" in f.summary
    assert "no trace" not in f.summary
    assert "untraced_ranks" not in f.evidence
    assert not [w for w in complete.warnings if "no trace" in w]


def test_the_verdict_is_scoped_to_the_traced_ranks(without_3) -> None:
    f = _host(without_3)
    assert f.ranks == (1,)
    assert "causes 100% of the waiting among the 3 traced ranks" in f.summary
    late = without_3.lateness
    assert late.untraced == (3,)
    assert f.summary.endswith(
        f"; rank 3 of world size 4 has no trace, and the collectives run on {late.after_last_ns / 1e6:,.1f} ms past "
        "the last traced arrivals, which may hide waits for it"
    )
    assert f.evidence["traced_ranks"] == 3
    assert f.evidence["untraced_ranks"] == 1
    assert f.evidence["after_last_traced_ms"] == pytest.approx(late.after_last_ns / 1e6, abs=1e-3)
    assert "1 rank of world size 4 has no trace (3): waits are judged among the 3 traced" in " ".join(
        without_3.warnings
    )


def test_the_confidence_counts_what_the_collectives_could_hide(complete, without_3) -> None:
    late = without_3.lateness
    expected = late.share * late.wait_ns / (late.wait_ns + 3 * late.after_last_ns)
    assert late.after_last_ns > 0
    assert _host(without_3).confidence == pytest.approx(expected, abs=1e-4)
    assert _host(without_3).confidence < _host(complete).confidence


def test_a_missing_late_rank_is_not_replaced_by_a_traced_one() -> None:
    a = _analysis(1)
    assert a.lateness.waited_for == ()
    assert a.lateness.reason.startswith("possibly untraced rank 1: 3 of 4 ranks traced")
    assert not [f for f in a.findings if f.cause in (Cause.HOST_STRAGGLER, Cause.COMPUTE_STRAGGLER)]
    assert "1 rank of world size 4 has no trace (1)" in " ".join(a.warnings)


def test_ranks_imply_a_world_no_trace_states(tmp_path) -> None:
    """Traces without distributedInfo, given as ranks 0 and 3: a world of at least 4, ranks 1 and 2 untraced."""
    from conftest import FIXTURES

    from tracediag.reduce import untraced_warning

    src = (FIXTURES / "kineto" / "hta_backward_thread.json").read_bytes()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(src)
    b.write_bytes(src)
    run = tracediag.load([a, b], rank_map={str(a): 0, str(b): 3})
    assert [f.world_size for f in run.meta.files] == [None, None]
    assert run.meta.world_size == 4
    assert untraced_warning(run.meta) == (
        "2 ranks of world size 4 have no trace (1, 2): waits are judged among the 2 traced; a rank they wait for "
        "may be untraced",
    )
