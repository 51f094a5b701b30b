"""Interval union and sweep (issue 3: the basis of compute, exposed communication and idle)."""

from __future__ import annotations

import polars as pl

from tracediag.derive.intervals import sweep, union_intervals


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
