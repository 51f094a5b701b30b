"""Collectives run by the host over device tensors (gloo on CUDA): when each one's data was ready.

gloo runs a collective of CUDA tensors on a worker thread of the host (``gloo:all_reduce``): the work
first blocks in a device synchronisation until the tensors it reads are computed (the rank's own
backward still running on its GPU), copies them to the host, exchanges them over TCP, and copies the
result back. Its row opens when the host enqueues it, long before the data exists (a host runs ahead of
its device), so its start says nothing of when the rank reached the collective: the end of that leading
synchronisation does. From there the work is communication: a peer that waits there waits for the last
rank; before it, the rank is still computing its input.

`ready_times` gives each such row its ready time (its start where no synchronisation opens it, as on
CPU-only ranks); `inside_host_comm` marks the host rows that lie inside one (the work's own
synchronisations are not the program's: `derive.host`).
"""

from __future__ import annotations

import polars as pl

from tracediag.vocab import SYNC_OP, name_matches

READY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "tid": pl.Int64(),
    "ts": pl.Int64(),
    "end": pl.Int64(),
    "coll_op": pl.String(),
    "ready": pl.Int64(),
}
"""`ready_times`' rows."""


def _work(events: pl.DataFrame) -> pl.DataFrame:
    """The host's collective work rows (``kind == "comm"`` on no device: ``gloo:*``) with a thread, as
    ``rank, tid, ts, end, coll_op``: none on NCCL traces, whose collectives are device kernels."""
    return (
        events.lazy()
        .filter(pl.col("device") == -1, pl.col("kind") == "comm", pl.col("tid").is_not_null())
        .select("rank", "tid", "ts", end=pl.col("ts") + pl.col("dur"), coll_op=pl.col("coll_op").cast(pl.String))
        .collect(engine="in-memory")
    )


def ready_times(events: pl.DataFrame, names: pl.Series) -> pl.DataFrame:
    """Per host collective work row: `READY_SCHEMA`.

    ``ready`` is the end of the first synchronisation (`vocab.SYNC_OP`: ``cudaStreamSynchronize``, ...)
    that starts inside the row on its thread, capped at the row's end; the row's start where none does.
    `names`: `vocab.distinct_names` of `events`.
    """
    work = _work(events)
    if not work.height:
        return pl.DataFrame(schema=READY_SCHEMA)
    syncs = (
        events.lazy()
        .filter(pl.col("device") == -1, pl.col("tid").is_not_null(), name_matches(names, SYNC_OP))
        .select("rank", "tid", _sts="ts", _send=pl.col("ts") + pl.col("dur"))
        .sort("_sts")
    )
    return (
        work.lazy()
        .sort("ts")
        .join_asof(syncs, left_on="ts", right_on="_sts", by=["rank", "tid"], strategy="forward", check_sortedness=False)
        .with_columns(
            ready=pl.when(pl.col("_sts") < pl.col("end"))
            .then(pl.min_horizontal("_send", "end"))
            .otherwise(pl.col("ts"))
        )
        .select(list(READY_SCHEMA))
        .collect(engine="in-memory")
        .cast(READY_SCHEMA)
    )


def inside_host_comm(rows: pl.LazyFrame, events: pl.DataFrame) -> pl.LazyFrame:
    """`rows` (``rank, tid, ts`` and any other columns) with ``in_comm``: true where the row starts inside
    a host collective work row of `events` on its thread."""
    work = _work(events)
    if not work.height:
        return rows.with_columns(in_comm=pl.lit(False))
    return (
        rows.sort("ts")
        .join_asof(
            work.lazy().select("rank", "tid", _cts="ts", _cend="end").sort("_cts"),
            left_on="ts",
            right_on="_cts",
            by=["rank", "tid"],
            strategy="backward",
            check_sortedness=False,
        )
        .with_columns(in_comm=(pl.col("ts") < pl.col("_cend")).fill_null(False))
        .drop("_cts", "_cend")
    )
