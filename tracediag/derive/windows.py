"""What each rank did right before each of its collectives: the window before an arrival.

Per rank and collective instance (`collectives.collective_instances`), the *window* runs from the
end of the rank's previous collective (the latest end of any earlier one, so concurrent buckets
nest) to this one's start; before the rank's first collective, from its first step's start. When a
rank arrives late, its window is longer than its peers' windows of the same instance, and what
fills the difference says why (`detect.lateness`): more compute, a device idle while its host is
busy elsewhere (Python, a sleep, a busy thread, CPU contention), data loading, a garbage-collection
pause, synchronisations or a checkpoint/logging write. The window of a step's first collective
starts in the previous step, so work after a step's last collective lands in the next step's first
window, where the peers wait for it.

Everything here is one rank's own timeline (own clock), computed where its file lies
(`per_rank.rank_tables`); the comparison across ranks is the reduce's.
"""

from __future__ import annotations

import polars as pl

from tracediag.derive.host_comm import inside_host_comm
from tracediag.derive.intervals import covered, rank_time
from tracediag.vocab import CHECKPOINT_OP, GC_OP, SYNC_OP, name_matches

WINDOW_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "ts": pl.Int64(),
    "window_ns": pl.Int64(),
    "compute_ns": pl.Int64(),
    "op_n": pl.Int64(),
    "busy_ns": pl.Int64(),
    "input_ns": pl.Int64(),
    "gc_ns": pl.Int64(),
    "sync_ns": pl.Int64(),
    "checkpoint_ns": pl.Int64(),
}
"""Per rank and collective instance (``rank, ts``: the instance's own start, as in
`collectives.INSTANCE_SCHEMA`): ``window_ns`` (the window's length), ``compute_ns`` (compute in it:
device kernels; on CPU-only ranks the host's operator time outside communication and loading),
``op_n`` (compute kernels or operators starting in it), ``busy_ns`` (compute, communication or
copies: the rest of the window is idle), ``input_ns`` (data loading), ``gc_ns``, ``sync_ns`` and
``checkpoint_ns`` (host rows named as garbage collection, device synchronisations, checkpoint or
logging writes: `vocab.GC_OP`, `vocab.SYNC_OP`, `vocab.CHECKPOINT_OP`)."""


def rank_windows(
    events: pl.DataFrame, instances: pl.DataFrame, spans: pl.DataFrame, device: pl.DataFrame, names: pl.Series
) -> pl.DataFrame:
    """`WINDOW_SCHEMA` rows: one per row of `instances`, from the stepped `events`, their `spans`
    (`steps.step_spans`), the `device` timeline (`breakdown.device_sweep`) and their distinct `names`."""
    if not instances.height:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    first = spans.lazy().filter(pl.col("start").is_not_null()).group_by("rank").agg(_first=pl.col("start").min())
    windows = (
        instances.lazy()
        .select("rank", "ts", "end")
        .unique(["rank", "ts"])
        .sort("rank", "ts")
        .with_columns(_prev=pl.col("end").cum_max().shift(1).over("rank"))
        .join(first, on="rank", how="left")
        .with_columns(_start=pl.coalesce("_prev", "_first", "ts"))
        .select("rank", "ts", _ws=pl.min_horizontal("_start", "ts"))
    )
    w = windows.select("rank", _key="ts", ts="_ws", end="ts").collect(engine="in-memory")

    def cover(intervals: pl.LazyFrame, col: str) -> pl.LazyFrame:
        # each coverage on its own plan: one plan sharing the windows' row index between several
        # coverages mixed them up (polars' common-subplan elimination)
        got = covered(intervals.select("rank", "ts", "end"), w.lazy(), "rank").collect(engine="in-memory")
        return got.lazy().select("rank", "_key", pl.col("covered").alias(col))

    active = (pl.col("n_compute") > 0) | (pl.col("n_comm") > 0) | (pl.col("n_p2p") > 0) | (pl.col("n_copy") > 0)
    length = pl.col("end") - pl.col("ts")
    # the device timeline's segments and the compute ops that start in each window, as running sums per
    # rank read at the window's two edges (window edges are cuts of the sweep: instance starts and ends,
    # step starts): two as-of lookups of the few windows into the sorted rows, no join of every row
    swept = _in_windows(
        device.lazy().select(
            "rank",
            "ts",
            compute_ns=pl.when(pl.col("n_compute") > 0).then(length).otherwise(0),
            busy_ns=pl.when(active).then(length).otherwise(0),
            input_ns=pl.when(pl.col("n_input") > 0).then(length).otherwise(0),
        ),
        w,
    )
    end = pl.col("ts") + pl.col("dur")
    named = {"gc_ns": GC_OP, "sync_ns": SYNC_OP, "checkpoint_ns": CHECKPOINT_OP}
    # the host rows of every pattern in one query, each pattern's a column of the rows that match any
    tests = {col: name_matches(names, rx) for col, rx in named.items()}
    # a host collective's own synchronisation (gloo waiting for its CUDA input) is the collective's, not
    # the program's: `host_comm.inside_host_comm`
    host = (
        inside_host_comm(
            events.lazy()
            .filter(pl.col("device") == -1, pl.any_horizontal(tests.values()))
            .select("rank", "tid", "ts", end=end, **tests),
            events,
        )
        .filter(~pl.col("in_comm"))
        .collect(engine="in-memory")
    )
    parts = [swept]
    have = set()
    for col in named:
        rows = host.filter(pl.col(col))
        if rows.height:  # usually none: no coverage plan to run
            parts.append(cover(rows.lazy(), col))
            have.add(col)
    counts = _in_windows(_compute_ops(events).select("rank", "ts", op_n=pl.lit(1, pl.Int64)), w)
    out = w.lazy().select("rank", "_key", window_ns=pl.col("end") - pl.col("ts"))
    for p in [*parts, counts]:
        out = out.join(p, on=["rank", "_key"], how="left")
    return (
        out.rename({"_key": "ts"})
        .with_columns(pl.lit(0, pl.Int64).alias(c) for c in named if c not in have)
        .with_columns(pl.col(c).fill_null(0) for c in WINDOW_SCHEMA if c not in ("rank", "ts"))
        .select(list(WINDOW_SCHEMA))
        .sort("rank", "ts")
        .collect(engine="in-memory")
        .cast(WINDOW_SCHEMA)
    )


def _in_windows(rows: pl.LazyFrame, windows: pl.DataFrame) -> pl.LazyFrame:
    """Per window (``rank, _key, ts, end``): the sums of `rows`' value columns over the rows of its
    rank starting in it (``ts <= row.ts < end``). Ordered by one (rank, time) key (a `Run`'s events are
    already; other orders are sorted first), a window's rows are the range between its
    two edges' positions in that key (binary searches), its sums differences of running sums: one
    query for the edges and one for every column's sums."""
    values = [c for c in rows.collect_schema().names() if c not in ("rank", "ts")]
    df = rows.select(rank_time("ts").alias("_k"), *values).collect(engine="in-memory")
    if not df.get_column("_k").is_sorted():  # events not in (rank, time) order: the general path
        df = df.sort("_k")
    edges = windows.select(lo=rank_time("ts"), hi=rank_time("end"))
    key = pl.col("_k").set_sorted()
    lo, hi = (
        key.search_sorted(edges.get_column("lo"), side="left"),
        key.search_sorted(edges.get_column("hi"), side="left"),
    )
    running = {c: pl.lit(0, pl.Int64).append(pl.col(c).cast(pl.Int64).cum_sum()) for c in values}
    sums = df.select(**{c: r.gather(hi) - r.gather(lo) for c, r in running.items()})
    return windows.lazy().select("rank", "_key").with_columns(sums.get_columns())


def _compute_ops(events: pl.DataFrame) -> pl.LazyFrame:
    """Compute work, in the events' order (rank, then time): device kernels on GPU ranks, else host
    operators that are no collective (nested operators count each: the same on every rank of one
    program)."""
    lf = events.lazy()
    gpu = lf.filter(pl.col("kind") == "kernel").select("rank").unique()
    return lf.filter(
        (pl.col("kind") == "kernel")
        | (
            (pl.col("kind") == "cpu_op")
            & pl.col("coll_op").is_null()
            & ~pl.col("rank").is_in(gpu.collect(engine="in-memory").get_column("rank").implode())
        )
    ).select("rank", "ts")
