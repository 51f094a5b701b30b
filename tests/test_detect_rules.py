"""Detector rules on hand-made step tables: noise is not a cause, the pattern is (issue 3)."""

from __future__ import annotations

import polars as pl

from tracediag.analysis import STEP_SCHEMA
from tracediag.detect import Facts, detect_all

MS = 1_000_000


def _steps(compute: dict[tuple[int, int], float], wait: dict[tuple[int, int], float], *, exposed: float = 10) -> Facts:
    """4 ranks x 8 steps of 100 ms with 70 ms compute, overridden per (rank, step); the rank with
    the most compute in a step arrives last."""
    rows = []
    for step in range(8):
        slow = max(range(4), key=lambda r: compute.get((r, step), 70))
        for rank in range(4):
            c = compute.get((rank, step), 70)
            rows.append(
                {
                    "rank": rank,
                    "step": step,
                    "start_ns": step * 100 * MS,
                    "dur_ns": int(max(100, 30 + max(compute.get((r, step), 70) for r in range(4))) * MS),
                    "compute_ns": int(c * MS),
                    "comm_ns": int(30 * MS),
                    "exposed_comm_ns": int(exposed * MS),
                    "wait_ns": int(wait.get((rank, step), 0) * MS),
                    "idle_ns": 0,
                    "host_gap_ns": 0,
                    "input_ns": 0,
                    "device": -1,
                    "exposed_p2p_ns": 0,
                    "stall_ns": 0,
                    "late_n": int(rank == slow),
                    "coll_n": 2,
                }
            )
    steps = pl.DataFrame(rows, schema={**STEP_SCHEMA, "late_n": pl.Int32, "coll_n": pl.Int32})
    empty = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32})
    return Facts(steps=steps, collectives=pl.DataFrame({"busbw_gbps": [40.0]}), p2p=empty)


def _waits_for(rank: int, steps: range | list[int], ms: float) -> dict[tuple[int, int], float]:
    return {(r, s): ms for s in steps for r in range(4) if r != rank}


def test_single_noisy_step_at_1_5x_is_healthy():
    facts = _steps({(1, 3): 105}, _waits_for(1, [3], 35))
    assert [f.cause for f in detect_all(facts)] == ["healthy"]


def test_persistent_slow_rank_with_waiting_peers_is_a_straggler():
    facts = _steps({(3, s): 100 for s in range(8)}, _waits_for(3, range(8), 30))
    (f,) = detect_all(facts)
    assert (f.cause, f.ranks, f.steps) == ("compute_straggler", (3,), tuple(range(8)))
    assert f.time_lost_ns == 8 * 30 * MS


def test_slow_rank_whose_peers_do_not_wait_is_not_a_straggler():
    facts = _steps({(3, s): 100 for s in range(8)}, {})
    assert [f.cause for f in detect_all(facts)] == ["healthy"]


def test_exposed_comm_on_every_rank_is_comm_bound_with_bandwidth_verdict():
    facts = _steps({}, {}, exposed=60)
    facts = Facts(steps=facts.steps, collectives=facts.collectives, p2p=facts.p2p, link_gbps=50.0)
    (f,) = detect_all(facts)
    assert f.cause == "comm_bound" and f.ranks == (0, 1, 2, 3) and f.steps == tuple(range(8))
    assert f.evidence["busbw_share_of_peak"] == 0.8
    assert "too much traffic" in f.evidence["bandwidth_verdict"]
