"""Interval union and sweep (issue 3: the basis of compute, exposed communication and idle)."""

from __future__ import annotations

import polars as pl

from tracediag.derive.intervals import covered, in_time_order, sweep, union_intervals


def test_union_merges_overlapping_and_touching_per_group():
    df = pl.DataFrame({"r": [0, 0, 0, 0, 1], "ts": [0, 5, 12, 30, 0], "end": [10, 12, 20, 31, 4]})
    got = union_intervals(df.lazy(), ["r"]).collect().rows()
    assert got == [(0, 0, 20), (0, 30, 31), (1, 0, 4)]


def test_union_handles_nested_interval_after_long_one():
    df = pl.DataFrame({"r": [0, 0, 0], "ts": [0, 2, 50], "end": [100, 3, 60]})
    assert union_intervals(df.lazy(), ["r"]).collect().rows() == [(0, 0, 100)]


def test_sweep_counts_each_category_per_segment():
    df = pl.DataFrame({"r": [0, 0, 0], "ts": [0, 4, 6], "end": [10, 8, 7], "cat": ["compute", "comm", "comm"]})
    segs = sweep(df.lazy(), ["r"], ["compute", "comm"]).collect()
    assert segs.rows() == [(0, 0, 4, 1, 0), (0, 4, 6, 1, 1), (0, 6, 7, 1, 2), (0, 7, 8, 1, 1), (0, 8, 10, 1, 0)]
    exposed = segs.filter(pl.col("n_comm") > 0, pl.col("n_compute") == 0)
    assert exposed.height == 0


def test_sweep_keeps_gaps_with_zero_counts():
    df = pl.DataFrame({"r": [0, 0], "ts": [0, 10], "end": [5, 15], "cat": ["a", "a"]})
    segs = sweep(df.lazy(), ["r"], ["a"]).collect()
    assert segs.rows() == [(0, 0, 5, 1), (0, 5, 10, 0), (0, 10, 15, 1)]


def test_sweep_marks_the_cuts_of_the_marked_intervals_only():
    # "a" intervals are marked; the unmarked "b" interval adds cuts at 3 and 6 inside a's segment [0, 8)
    df = pl.DataFrame(
        {"r": [0, 0, 0], "ts": [0, 3, 8], "end": [8, 6, 9], "cat": ["a", "b", "a"], "m": [True, False, True]}
    )
    segs = sweep(df.lazy(), ["r"], ["a"], mark="m").collect()
    assert segs.rows() == [(0, 0, 3, 1, True), (0, 3, 6, 1, False), (0, 6, 8, 1, False), (0, 8, 9, 1, True)]
    # the marked points alone give back the sweep of the marked intervals
    whole = sweep(df.filter("m").lazy(), ["r"], ["a"]).collect()
    merged = segs.group_by(pl.col("m").cum_sum().alias("g"), maintain_order=True).agg(
        pl.col("r").first(), pl.col("ts").first(), pl.col("end").last(), pl.col("n_a").first()
    )
    assert merged.select("r", "ts", "end", "n_a").rows() == whole.rows()


def test_covered_is_the_union_inside_each_window_per_group():
    schema = {"r": pl.Int32, "ts": pl.Int64, "end": pl.Int64}
    # group 0: [0, 10) and [5, 12) merge, [20, 25) apart, [21, 22) nested; group 1: [0, 4)
    lf = pl.DataFrame({"r": [0, 0, 0, 0, 1], "ts": [0, 5, 20, 21, 0], "end": [10, 12, 25, 22, 4]}, schema=schema)
    windows = pl.DataFrame(
        {"r": [0, 0, 0, 1, 1, 2], "ts": [8, 12, 0, 2, 4, 0], "end": [22, 20, 30, 3, 9, 5], "id": [0, 1, 2, 3, 4, 5]},
        schema={**schema, "id": pl.Int64},
    )
    for ordered in (False, True):
        got = covered(lf.sort("r", "ts").lazy(), windows.lazy(), "r", ordered=ordered).collect().sort("id")
        # [8, 22): 4 of [0, 12) and 2 of [20, 25); [12, 20): none; [0, 30): 12 + 5; group 1: 1 and 0; group 2: none
        assert got["covered"].to_list() == [6, 0, 17, 1, 0, 0]
        assert got.columns == ["r", "ts", "end", "id", "covered"]


def test_in_time_order_wants_rank_then_time_without_nulls():
    assert in_time_order(pl.DataFrame({"r": [0, 0, 1, 1], "t": [1, 2, 0, 5]}), "r", "t")
    assert not in_time_order(pl.DataFrame({"r": [0, 0, 1, 1], "t": [1, 2, 5, 0]}), "r", "t")
    assert not in_time_order(pl.DataFrame({"r": [0, 1, 0], "t": [1, 2, 3]}), "r", "t")
    assert not in_time_order(pl.DataFrame({"r": [0, 0], "t": [1, None]}), "r", "t")
