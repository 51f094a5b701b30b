"""`RankSummary`, the map/reduce seam: written and read back exactly, and a run's summary is the
concatenation of its ranks' summaries computed alone (what lets workers summarise ranks where they lie)."""

from __future__ import annotations

import itertools

import polars as pl
import pytest
from conftest import FIXTURES
from polars.testing import assert_frame_equal

import tracediag
from tracediag.derive.per_rank import rank_groups, rank_tables
from tracediag.derive.summary import RankSummary, concat
from tracediag.reduce import reduce
from tracediag.same_run import check_same_run

CASES = {
    "gloo_pipeline": FIXTURES / "runs" / "pipeline_1f1b_m8",
    "nccl_a100": [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)],
}
"""Point-to-point pipelines (p2p, p2p_edges), and GPU ranks (host feed, NCCL collectives, kernels)."""


@pytest.fixture(scope="module", params=list(CASES))
def run(request):
    return tracediag.load(CASES[request.param], jobs=1)


@pytest.fixture(scope="module")
def whole(run):
    return rank_tables(run.events)


def _assert_same(got: RankSummary, want: RankSummary) -> None:
    for name, table in want.tables().items():
        assert_frame_equal(getattr(got, name), table, check_exact=True)
    assert got.equals(want)


def test_a_summary_has_one_field_per_table_and_the_cases_fill_every_one(whole):
    assert RankSummary.names() == tuple(whole.tables())
    assert all(isinstance(t, pl.DataFrame) for t in whole.tables().values())
    assert whole.spans.height
    assert whole.breakdown.height
    assert whole.replay_segments.height


def test_every_table_has_rows_in_some_case():
    """So that the equalities below compare rows, not only schemas."""
    filled = {
        name
        for path in CASES.values()
        for name, t in rank_tables(tracediag.load(path, jobs=1).events).tables().items()
        if t.height
    }
    assert filled == set(RankSummary.names())


def test_a_summary_round_trips_write_and_read_exactly(whole, tmp_path):
    whole.write(str(tmp_path / "s"))
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(f"{n}.parquet" for n in RankSummary.names())
    _assert_same(RankSummary.read(str(tmp_path / "s")), whole)


def test_ranks_written_apart_read_back_as_the_whole_run(run, whole, tmp_path):
    ranks = sorted(run.meta.ranks)
    folders = [str(tmp_path / f"rank={r}") for r in ranks]
    for r, folder in zip(ranks, folders):
        whole.only_rank(r).write(folder)
    _assert_same(RankSummary.read(folders), whole)


def test_the_concat_of_ranks_summarised_alone_is_the_whole_runs(run, whole):
    ranks = sorted(run.meta.ranks)
    assert len(ranks) > 1
    alone = [rank_tables(run.events.filter(pl.col("rank") == r)) for r in ranks]
    _assert_same(concat(alone), whole)
    for r, one in zip(ranks, alone):
        _assert_same(whole.only_rank(r), one)
        assert set(one.breakdown["rank"].unique()) == {r}


def test_the_reduce_of_the_concat_is_the_in_memory_analysis(run):
    alone = [rank_tables(run.events.filter(pl.col("rank") == r)) for r in sorted(run.meta.ranks)]
    assert reduce(concat(alone), run.meta).to_dict() == tracediag.analyze(run).to_dict()


def test_a_summary_differs_when_one_row_does(whole):
    """`equals` reads the rows: a changed breakdown is not the same summary."""
    import dataclasses

    changed = dataclasses.replace(whole, breakdown=whole.breakdown.with_columns(pl.col("dur_ns") + 1))
    assert not changed.equals(whole)


def test_concat_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no summaries"):
        concat([])


@pytest.mark.parametrize("group_events", [1, 2_000])
def test_a_run_derived_in_groups_of_ranks_is_the_whole_runs(run, whole, group_events):
    """A large run is derived in groups of whole ranks (`rank_groups`): the groups are contiguous, cover
    every row once, never cut a rank, and their concatenated tables are the whole run's (with the
    extents `check_same_run` gives, as `analyze` passes them)."""
    groups = rank_groups(run.events, group_events)
    assert len(groups) > 1
    starts = [g[0] for g in groups]
    assert starts == [0, *itertools.accumulate(g[1] for g in groups)][:-1]
    assert sum(g[1] for g in groups) == run.events.height
    for start, rows, lo, hi in groups:
        assert run.events["rank"].slice(start, rows).unique().sort().to_list() == list(range(lo, hi + 1))
        assert lo <= hi
    _assert_same(rank_tables(run.events, group_events=group_events), whole)
    extents = check_same_run(run)
    _assert_same(rank_tables(run.events, extents=extents, group_events=group_events), whole)


def test_unsorted_events_are_derived_in_one_group(run):
    shuffled = run.events.sample(fraction=1.0, shuffle=True, seed=3)
    assert rank_groups(shuffled, 1) == [(0, run.events.height, 0, 0)]
