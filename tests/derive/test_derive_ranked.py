"""The join-free per-rank helpers (`derive.ranked.keep_ranked`, `derive.intervals.asof_by_rank`)
keep and match the same rows as the joins they replace, on real runs."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES
from polars.testing import assert_frame_equal

import tracediag
from tracediag.derive import ranked
from tracediag.derive.intervals import asof_by_rank
from tracediag.derive.ranked import keep_ranked, rank_slices, rank_value
from tracediag.derive.steps import find_markers
from tracediag.report.analyses import analyses_json

CASES = {
    "nccl_a100": [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)],
    "gloo_straggler": FIXTURES / "runs" / "straggler_persistent",
}


@pytest.fixture(scope="module", params=list(CASES))
def events(request) -> pl.DataFrame:
    return tracediag.load(CASES[request.param], jobs=1).events


def _semi(events: pl.DataFrame, table: pl.DataFrame, column: str) -> pl.DataFrame:
    return events.join(table.select("rank", column).unique(), on=["rank", column], how="semi", maintain_order="left")


def test_keep_ranked_keeps_the_rows_of_the_semi_join(events):
    """One value per rank (each rank's busiest device, its marker thread), several values for a rank
    (every thread of rank 0), a rank with none (only the last rank's value) and no row at all."""
    busiest = events.filter(pl.col("device") >= 0).group_by("rank").agg(pl.col("device").mode().min())
    threads = find_markers(events).select("rank", "tid").unique()
    several = events.filter(pl.col("rank") == events["rank"].min()).select("rank", "tid").unique()
    last = threads.filter(pl.col("rank") == pl.col("rank").max())
    cases = [(busiest, "device"), (threads, "tid"), (several, "tid"), (last, "tid"), (threads.head(0), "tid")]
    assert several.height > 1
    assert threads.height >= 2
    for table, column in cases:
        got = keep_ranked(events.lazy(), table, column).collect()
        assert_frame_equal(got, _semi(events, table, column))
    assert rank_value(several, "tid") is None
    assert rank_value(threads, "tid") is not None
    assert 0 < keep_ranked(events.lazy(), threads, "tid").collect().height < events.height


def test_asof_by_rank_matches_the_as_of_join_by_rank(events):
    """Each host row to the last step marker of its rank starting at or before it (backward), and to
    the first starting after it (forward): the rows of another rank are never matched."""
    markers = find_markers(events).lazy().select("rank", "step", _ms="host_start")
    host = events.lazy().filter(pl.col("device") == -1).select("rank", "ts")
    for strategy in ("backward", "forward"):
        want = (
            host.sort("ts")
            .join_asof(
                markers.sort("_ms"), left_on="ts", right_on="_ms", by="rank", strategy=strategy, check_sortedness=False
            )
            .sort("rank", "ts", "step", nulls_last=True)
            .collect()
        )
        got = asof_by_rank(host, markers, "ts", "_ms", strategy=strategy, ordered=True).collect()
        assert_frame_equal(got.sort("rank", "ts", "step", nulls_last=True), want)
        assert want["step"].null_count() > 0
        assert want["step"].drop_nulls().len() > 0
    with pytest.raises(ValueError, match="nearest"):
        asof_by_rank(host, markers, "ts", "_ms", strategy="nearest")


def test_rank_slices_cut_at_rank_boundaries(events):
    """Every slice holds whole ranks, at least `rows` rows but the last, and the slices are the table."""
    table = events.select("rank", "ts")
    rows = table.height // 5
    slices = rank_slices(table, rows)
    assert len(slices) > 1
    assert all(s.height >= rows for s in slices[:-1])
    ranks = [set(s["rank"].unique().to_list()) for s in slices]
    assert all(a.isdisjoint(b) for i, a in enumerate(ranks) for b in ranks[i + 1 :])
    assert_frame_equal(pl.concat(slices), table)
    assert rank_slices(table, table.height) == [table]


def test_the_analysis_is_the_same_a_rank_slice_at_a_time(monkeypatch):
    """The reduce's per-rank work a slice at a time (the kernel view, the lateness evidence, the replay
    graph; 7.2 million kernel rows at 16,384 ranks) gives the analysis of the whole tables: slices of a
    few rows here, so that each table is cut at every rank."""
    run = tracediag.load(CASES["gloo_straggler"], jobs=1)
    whole = analyses_json([("", tracediag.analyze(run))])
    monkeypatch.setattr(ranked, "SLICE_ROWS", 3)
    assert len(rank_slices(run.events.select("rank"))) == run.events["rank"].n_unique()
    assert analyses_json([("", tracediag.analyze(run))]) == whole
