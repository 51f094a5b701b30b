"""The analysis's cheaper paths give what the plain ones give: the sweep's packed running count
(`derive.intervals.count_fields`), the one-column key of (rank, correlation) of the launch links
(`derive.steps.call_key`), the steps and the breakdown of rows in time order
(`derive.steps.assign_steps`, `derive.breakdown.breakdown`), the per-rank extents of rows in
rank order (`same_run.rank_extents`) and the groups on one (rank, step) key (`derive.grouping`)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES
from polars.testing import assert_frame_equal

import tracediag
import tracediag.derive.intervals as intervals
import tracediag.derive.per_rank as per_rank
import tracediag.derive.steps as steps
from tracediag.derive.breakdown import breakdown
from tracediag.derive.grouping import per_rank_step
from tracediag.derive.intervals import _sweep_columns, count_fields, sweep, time_keys
from tracediag.derive.steps import assign_steps, call_key, find_markers, launches, step_spans
from tracediag.same_run import rank_extents

CASES = {
    "nccl_a100": [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)],
    "gloo_straggler": FIXTURES / "runs" / "straggler_persistent",
    "pipeline_1f1b": FIXTURES / "runs" / "pipeline_1f1b_m8",
}


@pytest.fixture(scope="module", params=list(CASES))
def events(request):
    return tracediag.load(CASES[request.param], jobs=1).events


def _same_tables(events: pl.DataFrame, monkeypatch, module, name: str, plain) -> None:
    """The rank tables of `events` equal those made with `module.name` replaced by `plain`."""
    markers = find_markers(events)  # shared: both paths read the same markers
    monkeypatch.setattr(per_rank, "find_markers", lambda ev, step_regex=None: markers)
    fast = per_rank.rank_tables(events)
    monkeypatch.setattr(module, name, plain)
    slow = per_rank.rank_tables(events)
    for table, frame in fast.tables().items():
        assert_frame_equal(frame, getattr(slow, table), check_exact=True)
    assert fast.breakdown.height > 0
    assert fast.replay_segments.height > 0


def test_rank_tables_are_the_same_with_the_packed_and_the_per_category_counts(events, monkeypatch):
    """Every per-rank table of a real run (the breakdown and the replay pieces read the sweep's
    counts), with the counts packed in one running sum and with one running sum per category."""
    packed = []

    def spy(totals, bits=intervals.PACK_BITS):
        fields = count_fields(totals, bits)
        packed.append(fields is not None)
        return fields

    monkeypatch.setattr(intervals, "count_fields", spy)
    _same_tables(events, monkeypatch, intervals, "count_fields", lambda totals, bits=62: None)
    assert any(packed)  # the fast path did run on this run's device (or host) timeline


def test_rank_tables_are_the_same_with_and_without_the_call_key(events, monkeypatch):
    """The launch links joined on the one Int64 key of (rank, correlation) and on the two columns
    (a run with no correlations, as gloo's, has no key and takes the columns in both)."""
    assert (call_key(events) is not None) == events.get_column("correlation").is_not_null().any()
    _same_tables(events, monkeypatch, steps, "call_key", lambda ev: None)


def test_packed_fields_are_the_bit_lengths_of_the_totals_and_refuse_past_the_bits():
    assert count_fields({"compute": 68064, "comm": 480, "p2p": 0, "copy": 7056}) == {
        "compute": (0, 17),
        "comm": (17, 9),
        "p2p": (26, 0),
        "copy": (26, 13),
    }
    assert count_fields({"a": 2**31 - 1, "b": 2**31 - 1}) == {"a": (0, 31), "b": (31, 31)}  # 62 bits
    assert count_fields({"a": 2**31, "b": 2**31 - 1}) is None  # 63


def test_a_count_at_the_top_of_its_field_reads_back_exactly():
    """Seven nested ``a`` intervals (a 3-bit field, full at 7) beside ``b`` intervals ending and
    starting at the same times: the packed sweep counts what the per-category one does."""
    a = [(i, 100 - i, "a", True) for i in range(7)]
    b = [(3, 50, "b", False), (50, 50, "b", True), (50, 97, "b", False), (0, 0, "b", False)]
    df = pl.DataFrame(
        [(0, *row) for row in a + b] + [(1, 5, 9, "a", True)],
        schema={"r": pl.Int32, "ts": pl.Int64, "end": pl.Int64, "cat": pl.String, "m": pl.Boolean},
        orient="row",
    )
    got = sweep(df.lazy(), ["r"], ["a", "b"], mark="m").collect()
    want = _sweep_columns(df.lazy(), ["r"], ["a", "b"], mark="m").collect()
    assert_frame_equal(got, want)
    assert got["n_a"].max() == 7
    assert got.filter(pl.col("ts") == 6)["n_a"].item() == 7
    assert got.filter(pl.col("r") == 0, pl.col("ts") == 50)["n_b"].item() == 1


def test_call_key_is_one_value_per_pair_and_refuses_what_would_overflow():
    df = pl.DataFrame(
        {"rank": [0, 0, 1, 1, 0], "correlation": [7, 9, 7, None, 7]},
        schema={"rank": pl.Int32, "correlation": pl.Int64},
    )
    key = df.select(call_key(df)).to_series().to_list()
    assert key[0] == key[4]
    assert len({key[0], key[1], key[2]}) == 3
    assert key[3] is None
    # ranks 0 and 1 leave 62 bits to the correlations' span: 2**61 - 1 takes 61, 2**61 takes 62
    wide = pl.DataFrame({"rank": [0, 1], "correlation": [5, 5 + 2**61 - 1]}, schema=df.schema)
    top = wide.select(call_key(wide)).to_series().to_list()
    assert top == [0, 2**61 + 2**61 - 1]
    assert call_key(wide.with_columns(correlation=pl.Series([5, 5 + 2**61]))) is None
    assert call_key(df.with_columns(rank=pl.Series([-1, 0, 1, 1, 0], dtype=pl.Int32))) is None


def test_extents_of_rows_in_rank_order_equal_those_of_shuffled_rows(events):
    """`rank_extents` groups rows in rank order as runs (no hashing): the same extents as of the
    same rows in another order."""
    assert events.get_column("rank").is_sorted()
    shuffled = events.sample(fraction=1.0, shuffle=True, seed=3)
    assert not shuffled.get_column("rank").is_sorted()
    assert_frame_equal(rank_extents(events), rank_extents(shuffled))


def test_steps_of_rows_in_time_order_equal_those_found_without_the_order(events):
    """`assign_steps` told the rows are in (rank, ts) order takes every host row's step in place;
    the same steps as when it sorts and puts them back by row, host and device rows alike."""
    keys = time_keys(events)
    markers = find_markers(events)
    spans = step_spans(events, markers, ordered=True, keys=keys)
    fast = assign_steps(events, spans, ordered=True, keys=keys)
    slow = assign_steps(events, spans, ordered=False, keys=keys)
    assert_frame_equal(fast, slow, check_exact=True)
    assert fast.filter(pl.col("device") == -1)["step"].is_not_null().any()


def test_breakdown_of_rows_in_time_order_equals_the_one_that_does_not_know_it(events):
    """`breakdown` told the rows are in (rank, ts) order groups the device work by its sorted
    (rank, start) key and takes the host rows as runs per rank; the same breakdown as without."""
    keys = time_keys(events)
    markers = find_markers(events)
    launched = launches(events, markers, ordered=True, keys=keys)
    assert launched.links.get_column("_row").is_sorted()  # the event table's order
    spans = step_spans(events, markers, ordered=True, launched=launched, keys=keys)
    stepped = assign_steps(events, spans, ordered=True, launched=launched, keys=keys)
    fast = breakdown(stepped, spans, ordered=True, launched=launched, keys=keys)
    slow = breakdown(stepped, spans, ordered=False, launched=launched, keys=keys)
    assert_frame_equal(fast, slow, check_exact=True)
    assert fast.height > 0
    assert fast["host_gap_ns"].sum() > 0


def test_per_rank_step_groups_like_the_two_columns_at_the_ends_of_the_int32_range():
    """One Int64 key per (rank, step): steps at both ends of Int32 on neighbouring ranks stay apart;
    rows with no rank or no step form no group (the callers join on (rank, step))."""
    lo, hi = -(2**31), 2**31 - 1
    df = pl.DataFrame(
        {
            "rank": [0, 0, 1, 1, 0, 1, 2**31 - 1, None, 0],
            "step": [hi, hi, lo, lo, lo, hi, 3, 1, None],
            "v": [1, 2, 3, 4, 5, 6, 7, 8, 9],
        },
        schema={"rank": pl.Int32, "step": pl.Int32, "v": pl.Int64},
    )
    got = per_rank_step(df.lazy(), pl.col("v").sum(), pl.len().alias("n")).collect().sort("rank", "step")
    want = (
        df.drop_nulls(["rank", "step"]).group_by("rank", "step").agg(pl.col("v").sum(), n=pl.len()).sort("rank", "step")
    )
    assert_frame_equal(got, want)
    assert got.height == 5
