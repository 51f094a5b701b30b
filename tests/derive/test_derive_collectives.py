"""Collective matching, clock alignment, wait vs transfer and bus bandwidth (issue 3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from _events import events

from tracediag.derive.collectives import align_and_match, collective_instances, summarize_instances, wait_per_step
from tracediag.derive.steps import assign_steps, find_markers, step_spans

if TYPE_CHECKING:
    import polars as pl

MS = 1_000_000
OFFSETS = {0: 0, 1: 5 * MS, 2: -3 * MS}
"""Each rank's clock error: rank 1 runs 5 ms ahead, rank 2 3 ms behind."""
ARRIVALS = {0: [10, 50], 1: [12, 58], 2: [30, 51]}
"""True arrival (ms) at the two all-reduces of one step; the true end is 40 and 70 ms for all."""


def _run(with_seq: bool) -> pl.DataFrame:
    rows = []
    for rank, off in OFFSETS.items():
        rows.append({"rank": rank, "kind": "step", "name": "ProfilerStep#3", "ts": off, "dur": 100 * MS})
        for k, (arrive, end) in enumerate(zip(ARRIVALS[rank], (40, 70))):
            rows.append(
                {
                    "rank": rank,
                    "tid": 2,
                    "kind": "comm",
                    "name": "gloo:all_reduce",
                    "ts": arrive * MS + off,
                    "dur": (end - arrive) * MS,
                    "coll_op": "all_reduce",
                    "coll_bytes": 300 * MS,
                    "coll_group": "0" if with_seq else None,
                    "coll_group_size": 3 if with_seq else None,
                    "coll_seq": 100 + k if with_seq else None,
                }
            )
    return events(rows)


@pytest.mark.parametrize("with_seq", [True, False], ids=["seq", "occurrence"])
def test_offsets_recovered_and_waits_split_from_transfer(with_seq):
    ev = _run(with_seq)
    spans = step_spans(ev, find_markers(ev))
    inst = collective_instances(assign_steps(ev, spans))
    offsets, matched, _ = align_and_match(inst)
    assert dict(offsets.rows()) == OFFSETS
    summary = summarize_instances(matched).sort("first_arrival_ns")
    assert summary["n_ranks"].to_list() == [3, 3]
    assert summary["last_rank"].to_list() == [2, 1]
    assert summary["skew_ns"].to_list() == [20 * MS, 8 * MS]
    assert summary["transfer_ns"].to_list() == [10 * MS, 12 * MS]
    # nccl-tests: algbw = bytes / transfer; all_reduce busbw = algbw * 2(n-1)/n
    assert summary["algbw_gbps"].to_list() == pytest.approx([30.0, 25.0])
    assert summary["busbw_gbps"].to_list() == pytest.approx([40.0, 25.0 * 4 / 3])
    waits = dict(wait_per_step(matched).select("rank", "wait_ns").rows())
    assert waits == {0: (20 + 8) * MS, 1: 18 * MS, 2: 7 * MS}


def test_last_rank_among_simultaneous_arrivals_is_the_lowest_whatever_the_row_order():
    """Ranks 1 and 2 reach the all-reduce at the same (aligned) time, after rank 0: the last rank is
    1 however the matched rows are ordered (a group's rows come in no fixed order)."""
    rows = [{"rank": r, "kind": "step", "name": "ProfilerStep#3", "ts": 0, "dur": 100 * MS} for r in range(3)]
    rows += [
        {
            "rank": r,
            "tid": 2,
            "kind": "comm",
            "name": "gloo:all_reduce",
            "ts": arrive * MS,
            "dur": (40 - arrive) * MS,
            "coll_op": "all_reduce",
            "coll_bytes": 300 * MS,
            "coll_group": "0",
            "coll_group_size": 3,
            "coll_seq": 100,
        }
        for r, arrive in ((0, 10), (1, 30), (2, 30))
    ]
    ev = events(rows)
    _, matched, _ = align_and_match(collective_instances(assign_steps(ev, step_spans(ev, find_markers(ev)))))
    orders = [matched, matched.reverse(), matched.sort("rank", descending=True)]
    assert [summarize_instances(m)["last_rank"].to_list() for m in orders] == [[1], [1], [1]]
