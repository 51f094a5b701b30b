"""Int64 keys of (rank, time) (`derive.intervals.time_keys`): where a run's times and ranks fit,
the per-rank tables equal those of the Int128 keys, and the range check refuses what would overflow."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES
from polars.testing import assert_frame_equal

import tracediag
import tracediag.derive.per_rank as per_rank
from tracediag.derive.intervals import TimeKeys, rank_time, time_keys, time_order
from tracediag.derive.steps import find_markers

CASES = {
    "nccl_a100": [FIXTURES / "kineto" / f"hta_a100_nccl_rank{r}.json.gz" for r in (0, 1)],
    "gloo_straggler": FIXTURES / "runs" / "straggler_persistent",
    "pipeline_1f1b": FIXTURES / "runs" / "pipeline_1f1b_m8",
}


@pytest.mark.parametrize("case", list(CASES))
def test_rank_tables_are_the_same_with_int64_and_int128_keys(case, monkeypatch):
    """Every per-rank table (spans, breakdown, host feed, replay segments, ...) of a real run, with
    the Int64 keys and with the Int128 ones (time_keys refused): the same rows in the same order."""
    events = tracediag.load(CASES[case], jobs=1).events
    assert time_keys(events) is not None
    markers = find_markers(events)  # shared: both paths read the same markers
    monkeypatch.setattr(per_rank, "find_markers", lambda ev, step_regex=None: markers)
    fast = per_rank.rank_tables(events)
    monkeypatch.setattr(per_rank, "time_keys", lambda ev: None)
    slow = per_rank.rank_tables(events)
    for name, frame in fast.tables().items():
        assert_frame_equal(frame, getattr(slow, name), check_exact=True)
    assert fast.breakdown.height > 0
    assert fast.replay_segments.height > 0


def _run(ranks: list[int], lo: int, span: int) -> pl.DataFrame:
    """Rows at the first and the last time of `span` on each of `ranks` (end = ts + dur)."""
    return pl.DataFrame(
        {"rank": ranks * 2, "ts": [lo] * len(ranks) + [lo + span] * len(ranks), "dur": [0] * (2 * len(ranks))},
        schema={"rank": pl.Int32, "ts": pl.Int64, "dur": pl.Int64},
    )


def test_time_keys_refuse_exactly_where_the_int64_key_would_overflow():
    """With ranks up to 2**20 - 1, the time part may take 42 bits: a span of 2**41 - 2 ns fits
    (2 * span + 3 < 2**42), one more ns does not; ranks up to 2**31 - 2 fit 32 bits of time, the
    largest Int32 rank does not. Negative or null ranks and a table without times take Int128."""
    lo = 1_700_000_000_000_000_000  # an epoch time in ns, as Kineto's
    r = 2**20 - 1
    assert time_keys(_run([0, r], lo, 2**41 - 2)) == TimeKeys(base=lo, shift=42)
    assert time_keys(_run([0, r], lo, 2**41 - 1)) is None
    assert time_keys(_run([0, 2**31 - 2], lo, 2**30)) == TimeKeys(base=lo, shift=32)
    assert time_keys(_run([0, 2**31 - 1], lo, 2**30)) is None
    assert time_keys(_run([-1, 0], lo, 10)) is None
    assert time_keys(_run([0, 1], lo, 10).with_columns(rank=pl.when(pl.col("ts") > lo).then("rank"))) is None
    assert time_keys(_run([0], lo, 10).clear()) is None
    # an end before the start (negative duration) widens the range below the least start
    early = _run([0, 1], lo, 10).with_columns(dur=pl.Series([0, -5, 0, 0]))
    assert time_keys(early).base == lo - 5


def test_int64_keys_at_the_limit_order_and_match_like_the_pairs():
    """At the largest span that fits, the keys of the extreme ranks and times (and null times, first)
    sort as (rank, time, tiebreak) and are equal only where the pairs are: no overflow, no wrap."""
    lo, span, r = 1_700_000_000_000_000_000, 2**41 - 2, 2**20 - 1
    keys = time_keys(_run([0, r], lo, span))
    assert keys is not None
    times = [None, lo, lo + 1, lo + span // 2, lo + span - 1, lo + span]
    rows = [(rank, t, bit) for rank in (0, 1, r - 1, r) for t in times for bit in (False, True)]
    df = pl.DataFrame(rows, schema={"rank": pl.Int32, "t": pl.Int64, "bit": pl.Boolean}, orient="row")
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=7)
    want = df.sort("rank", "t", "bit", nulls_last=False)
    got = shuffled.sort(time_order("rank", "t", pl.col("bit"), keys), maintain_order=True)
    assert_frame_equal(got, want)
    assert_frame_equal(shuffled.sort(time_order("rank", "t", pl.col("bit"))), want)  # the Int128 key
    packed = df.with_columns(k=time_order("rank", "t", pl.col("bit"), keys))
    assert packed["k"].dtype == pl.Int64
    assert packed["k"].is_unique().all()
    assert (packed.sort("rank", "t", "bit", nulls_last=False)["k"].diff().drop_nulls() > 0).all()
    pairs = df.filter(pl.col("t").is_not_null()).unique(["rank", "t"]).sort("rank", "t")
    k64 = pairs.select(rank_time("t", keys)).to_series()
    k128 = pairs.select(rank_time("t")).to_series()
    assert k64.dtype == pl.Int64
    assert k64.is_sorted()
    assert k64.n_unique() == pairs.height
    assert k128.is_sorted()
    assert k128.n_unique() == pairs.height
