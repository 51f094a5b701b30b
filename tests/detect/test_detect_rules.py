"""Detector rules on hand-made step tables: noise is not a cause, the pattern is (issue 3)."""

from __future__ import annotations

import polars as pl

from tracediag.analysis import STEP_SCHEMA
from tracediag.causes import detect_all
from tracediag.detect import Facts

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
                    "lead_idle_ns": 0,
                    "late_n": int(rank == slow),
                    "coll_n": 2,
                }
            )
    steps = pl.DataFrame(rows, schema={**STEP_SCHEMA, "late_n": pl.Int32, "coll_n": pl.Int32})
    empty = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32})
    collectives = pl.DataFrame(
        {"step": [s for s in range(8) for _ in range(3)], "bytes": [1 << 20] * 24, "busbw_gbps": [40.0] * 24}
    )
    return Facts(steps=steps, collectives=collectives, p2p=empty)


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
    assert f.cause == "comm_bound"
    assert f.ranks == (0, 1, 2, 3)
    assert f.steps == tuple(range(8))
    assert f.evidence["busbw_share_of_peak"] == 0.8
    assert (f.evidence["collectives_per_step_median"], f.evidence["message_bytes_median"]) == (3.0, 1 << 20)
    assert "too much traffic" in f.evidence["bandwidth_verdict"]


def _with(facts: Facts, **columns: dict[tuple[int, int], float]) -> Facts:
    """`facts` with some (rank, step) cells of the named columns replaced (ms, or counts for late_n)."""
    steps = facts.steps
    for col, cells in columns.items():
        scale = 1 if col == "late_n" else MS
        new = pl.DataFrame(
            [(r, s, int(v * scale)) for (r, s), v in cells.items()],
            schema={"rank": pl.Int32, "step": pl.Int32, "_new": pl.Int64},
            orient="row",
        )
        steps = (
            steps.join(new, on=["rank", "step"], how="left")
            .with_columns(pl.coalesce("_new", col).cast(steps.schema[col]).alias(col))
            .drop("_new")
        )
    return Facts(steps=steps, collectives=facts.collectives, p2p=facts.p2p)


def test_mild_rank_last_on_every_step_with_waiting_peers_is_persistent():
    """1.2x compute is under the 1.3x ratio, but last at every step with everyone waiting is the signal."""
    facts = _steps({(2, s): 84 for s in range(8)}, _waits_for(2, range(8), 14))
    (f,) = detect_all(facts)
    assert (f.cause, f.ranks, f.steps, f.evidence["kind"]) == ("compute_straggler", (2,), tuple(range(8)), "persistent")


def test_mild_excess_without_being_last_is_healthy():
    facts = _steps({(2, s): 84 for s in range(8)}, _waits_for(2, range(8), 14))
    facts = _with(facts, late_n={(r, s): int(r == 0) for r in range(4) for s in range(8)})
    assert [f.cause for f in detect_all(facts)] == ["healthy"]


def test_extra_compute_after_the_last_collective_names_the_step_it_happened_in():
    """Rank 0 computes 2.5x in step 4 after the step's all-reduce: its peers wait for it in step 5."""
    facts = _steps({(0, 4): 175}, {})
    waits = {(r, 5): 100 for r in (1, 2, 3)}
    late = {(r, s): int(r == 0 and s == 5) for r in range(4) for s in (4, 5)}
    facts = _with(facts, wait_ns=waits, late_n=late, dur_ns={(r, 5): 200 for r in range(4)})
    (f,) = detect_all(facts)
    assert (f.cause, f.ranks, f.steps, f.evidence["kind"]) == ("compute_straggler", (0,), (4,), "transient")


def test_transient_episode_takes_adjacent_weaker_steps_but_not_isolated_ones():
    """Steps 3 (1.7x) and 4 (2.5x) form one episode of rank 1; an isolated 1.7x step 7 is noise."""
    compute = {(1, 3): 119, (1, 4): 175, (1, 7): 119}
    facts = _steps(compute, {**_waits_for(1, [3, 7], 49), **_waits_for(1, [4], 105)})
    (f,) = detect_all(facts)
    assert (f.cause, f.ranks, f.steps) == ("compute_straggler", (1,), (3, 4))


def test_unnamed_loader_starving_every_rank_is_input_bound_at_half_confidence():
    facts = _with(_steps({}, {}), lead_idle_ns={(r, s): 35 for r in range(4) for s in range(8)})
    (f,) = detect_all(facts)
    assert (f.cause, f.ranks, f.steps) == ("input_bound", (0, 1, 2, 3), tuple(range(8)))
    assert f.evidence["loader_annotated"] is False
    assert f.confidence <= 0.5
    assert "record_function" in f.summary


def _two_ranks(facts: Facts) -> Facts:
    steps = facts.steps.filter(pl.col("rank") < 2)
    return Facts(steps=steps, collectives=facts.collectives, p2p=facts.p2p)


def test_last_on_most_steps_counts_only_when_unlikely_by_chance():
    """Rank 1 at 1.2x, last with its peers waiting on 6 of 8 steps: with 4 ranks that happens by
    chance 0.4% of the time (a straggler); with 2 ranks one of them is always last, 14% (healthy)."""
    slow = [0, 1, 2, 4, 5, 7]
    facts = _steps({(1, s): 84 for s in slow}, _waits_for(1, slow, 14))
    (f,) = detect_all(facts)
    assert (f.cause, f.ranks, f.steps) == ("compute_straggler", (1,), tuple(slow))
    assert [f.cause for f in detect_all(_two_ranks(facts))] == ["healthy"]


def test_comm_bound_on_some_ranks_of_a_larger_job_says_a_slow_untraced_rank_is_possible():
    facts = _steps({}, {}, exposed=60)
    full = detect_all(facts)[0]
    part = detect_all(Facts(steps=facts.steps, collectives=facts.collectives, p2p=facts.p2p, world_size=64))[0]
    assert full.cause == part.cause == "comm_bound"
    assert part.confidence == full.confidence / 2
    assert "only 4 of 64 ranks traced" in part.summary
