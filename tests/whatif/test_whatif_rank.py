"""The what-if's per-rank half (`derive.sync_segments`): small tables that each rank gives alone, from which the
driver builds the same replay graph as from the whole run."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES
from polars.testing import assert_frame_equal

import tracediag
from tracediag.derive.intervals import in_time_order
from tracediag.derive.per_rank import rank_tables
from tracediag.reduce import derive_facts
from tracediag.whatif import graph_of

RUNS = FIXTURES / "runs"
GPU_PAIR = [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)]
REPLAY = ("replay_segments", "replay_sync")
CASES = {
    "gloo_pipeline": RUNS / "pipeline_gpipe_m8",
    "gloo_straggler": RUNS / "straggler_persistent",
    "nccl_a100": GPU_PAIR,
}


@pytest.fixture(scope="module", params=list(CASES))
def run(request):
    return tracediag.load(CASES[request.param], jobs=1)


def test_a_runs_replay_tables_are_its_ranks_tables_alone(run):
    whole = rank_tables(run.events)
    alone = [rank_tables(run.events.filter(pl.col("rank") == r)) for r in sorted(run.meta.ranks)]
    for name in REPLAY:
        assert getattr(whole, name).height > 0
        assert_frame_equal(getattr(whole, name), pl.concat([getattr(t, name) for t in alone]))


def test_pieces_partition_the_complete_steps_and_are_few(run):
    """Per complete step, the pieces cover the step's span exactly and carry the breakdown's compute;
    they grow with the sync points, not with the events (cut at sync points and blocks, not at kernels)."""
    tables = rank_tables(run.events)
    pieces = tables.replay_segments
    assert (pieces["end"] - pieces["ts"]).to_list() == pieces.select(
        pl.sum_horizontal("compute_ns", "input_ns", "idle_ns", "other_ns")
    ).to_series().to_list()
    per_step = pieces.group_by("rank", "step").agg(
        dur_ns=(pl.col("end") - pl.col("ts")).sum(), compute_ns=pl.col("compute_ns").sum()
    )
    complete = tables.breakdown.join(tables.spans.filter(~pl.col("partial")), on=["rank", "step"], how="semi")
    got = complete.select("rank", "step").join(per_step, on=["rank", "step"], how="left").sort("rank", "step")
    want = complete.select("rank", "step", "dur_ns", "compute_ns").sort("rank", "step")
    assert_frame_equal(got, want)
    assert pieces.height * 10 < run.events.height
    assert pieces.height <= 10 * (tables.replay_sync.height + tables.spans.height)


def test_every_mark_lies_on_a_local_segment_edge(run):
    """The replay reads a rank's progress only at segment edges, so summing categories per piece loses
    nothing."""
    derived = derive_facts(run)
    g = graph_of(derived.facts, derived.replay)
    seg = g.segments.select("rank", _ts="ts", _end="end").sort("_ts")
    inside = (
        g.marks.sort("t")
        .join_asof(seg, left_on="t", right_on="_ts", by="rank", check_sortedness=False)
        .filter(pl.col("t") > pl.col("_ts"), pl.col("t") < pl.col("_end"))
    )
    assert g.marks.height > 0
    assert inside.height == 0


def test_the_sorted_fast_path_gives_the_tables_of_unsorted_events(run):
    """A `Run`'s events are sorted by rank and time, and `rank_tables` then skips its sorts of the
    host rows (`intervals.in_time_order`); the same events in another order take the general path.
    Every per-rank table must come out the same either way."""
    shuffled = run.events.sample(fraction=1.0, shuffle=True, seed=7)
    assert in_time_order(run.events, "rank", "ts")
    assert not in_time_order(shuffled, "rank", "ts")
    fast, general = rank_tables(run.events), rank_tables(shuffled)
    assert fast.breakdown.height > 0
    assert fast.host.height + fast.kernels.height > 0
    for name, table in fast.tables().items():
        assert_frame_equal(table, getattr(general, name))
