"""Per-rank tables: everything the analysis derives from one rank's events alone.

`rank_tables` is the only place that reads the event table. Every table it returns is computed per
rank (each expression is grouped by, or taken over, ``rank``), so the tables of a whole run equal the
concatenation, in rank order, of the tables of each rank computed alone. That is what lets a worker
derive one rank's tables where its file lies and ship only these summaries to the driver, which
then matches collectives across ranks (`reduce.reduce`). The tables are the fields of
`derive.summary.RankSummary`.
"""

from __future__ import annotations

import polars as pl

from tracediag.derive.breakdown import breakdown, device_sweep
from tracediag.derive.collectives import collective_instances
from tracediag.derive.host import host_feed
from tracediag.derive.intervals import in_time_order, time_keys
from tracediag.derive.kernels import kernel_steps
from tracediag.derive.p2p import p2p_per_step
from tracediag.derive.sequences import sequence_work
from tracediag.derive.steps import assign_steps, find_markers, launches, step_spans
from tracediag.derive.summary import RankSummary, concat
from tracediag.derive.sync_segments import segments, sync_ends
from tracediag.derive.windows import rank_windows
from tracediag.same_run import rank_extents
from tracediag.vocab import distinct_names

_NO_OFFSETS = pl.DataFrame(schema={"rank": pl.Int32, "offset_ns": pl.Int64})


GROUP_EVENTS = 200_000
"""About how many events `rank_tables` derives in one go. Its joins, sorts and group-bys cost more per
row once a table outgrows the CPU caches (measured at 2,048 ranks of 2,928 events: 8.9 ms per rank
whole, 6.8 in groups of 128 ranks, as at 256 ranks whole), and every table is per rank, so a large
run is derived in groups of whole ranks and concatenated: the same tables, at a constant cost per rank.
The group's intermediate tables set the analysis' peak memory: on 8 A100 ranks of 75k events, groups
of 400k events (4 ranks) peaked at 214-221 MB, of 200k (2-3 ranks) at 191-194 MB, for the same CPU
within the machine's noise (1.2-1.55 CPU-s each)."""


def rank_tables(
    events: pl.DataFrame,
    *,
    step_regex: str | None = None,
    extents: pl.DataFrame | None = None,
    group_events: int = GROUP_EVENTS,
) -> RankSummary:
    """The `RankSummary` of `events` (one rank or many), on each rank's own clock (its fields say
    what each table holds).

    `extents`: the ``extents`` table of `events`, when the caller has it (`same_run.check_same_run`
    read it). Events sorted by rank are derived in groups of whole ranks of about `group_events`
    events (`GROUP_EVENTS`). Raises ValueError for an invalid `step_regex`.
    """
    groups = rank_groups(events, group_events)
    if len(groups) == 1:
        return _rank_tables(events, step_regex=step_regex, extents=extents)
    return concat([
        _rank_tables(
            events.slice(start, length),
            step_regex=step_regex,
            extents=None if extents is None else extents.filter(pl.col("rank").is_between(lo, hi)),
        )
        for start, length, lo, hi in groups
    ])  # fmt: skip


def rank_groups(events: pl.DataFrame, group_events: int) -> list[tuple[int, int, int, int]]:
    """``(first row, rows, first rank, last rank)`` of each group of whole ranks of about `group_events`
    events, when `events` are sorted by rank (zero-copy slices); else one group of every row."""
    whole = [(0, events.height, 0, 0)]
    rank = events["rank"]
    if events.height <= group_events or rank.null_count() or not rank.is_sorted():
        return whole
    per_rank = events.group_by("rank").agg(n=pl.len()).sort("rank")
    groups = (
        per_rank.with_columns(end=pl.col("n").cum_sum())
        .group_by(((pl.col("end") - pl.col("n")) // group_events).alias("g"), maintain_order=True)
        .agg(rows=pl.col("n").sum(), lo=pl.col("rank").first(), hi=pl.col("rank").last())
        .with_columns(start=pl.col("rows").cum_sum() - pl.col("rows"))
        .select("start", "rows", "lo", "hi")
    )
    return groups.rows() if groups.height > 1 else whole


def _rank_tables(events: pl.DataFrame, *, step_regex: str | None, extents: pl.DataFrame | None) -> RankSummary:
    """`rank_tables` of `events` in one go."""
    names = distinct_names(events)  # the name tests below each match their pattern over these
    ordered = in_time_order(events, "rank", "ts")  # a `Run`'s are: the as-of joins need no sort of the rows
    keys = time_keys(events)  # Int64 keys of (rank, time) when the run's times and ranks fit
    markers = find_markers(events, step_regex=step_regex)
    # device rows to their calls, joined once
    launched = launches(events, markers, names=names, ordered=ordered, keys=keys)
    spans = step_spans(events, markers, names=names, ordered=ordered, launched=launched, keys=keys)
    stepped = assign_steps(events, spans, ordered=ordered, launched=launched, keys=keys)
    op = pl.col("coll_op").cast(pl.String)
    instances = collective_instances(stepped, names=names)
    sync = sync_ends(stepped, instances, names=names)
    device = device_sweep(stepped, spans, sync, names=names, keys=keys)
    kernels, kernel_categories = kernel_steps(
        stepped, spans.group_by("rank").agg(pl.col("device").first()), names=names, ordered=ordered
    )
    return RankSummary(
        spans=spans,
        breakdown=breakdown(
            stepped, spans, names=names, device=device, ordered=ordered, launched=launched, keys=keys
        ).join(sequence_work(stepped), on=["rank", "step"], how="left"),
        instances=instances,
        p2p=p2p_per_step(stepped, _NO_OFFSETS),
        p2p_edges=events.lazy()
        .filter(pl.col("coll_op").is_in(["send", "recv"]))  # on the Enum: no string per row
        .select("rank", op.alias("coll_op"), "coll_peer")
        .unique()
        .sort("rank", "coll_op", "coll_peer", nulls_last=True)
        .collect(engine="in-memory"),
        host=host_feed(stepped, spans, names=names, launched=launched, keys=keys),
        kernels=kernels,
        kernel_categories=kernel_categories,
        extents=rank_extents(events) if extents is None else extents,
        replay_segments=segments(device, spans, sync, keys),
        replay_sync=sync,
        windows=rank_windows(stepped, instances, spans, device, names),
    )
