"""`RankSummary`: what the analysis keeps of each rank's events, the seam between map and reduce.

`derive.per_rank.rank_tables` turns events into a `RankSummary`; `reduce.reduce` turns the summary
of every rank (and the files' metadata) into an `Analysis`. Every table is computed per rank, so the
summary of a whole run equals the `concat`, in rank order, of the summaries of its ranks computed
alone, and `only_rank` of it is that rank's own. That is what lets a worker summarise a rank where
its file lies, `write` the summary there (one Parquet file per table) and the driver `read` only the
summaries back (`tracediag.execute`).

All times are in ns on the rank's own clock (the reduce aligns the clocks); every table has a
``rank`` column (Int32) and is sorted by rank.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import polars as pl

from tracediag.parquet import join, read_parquet, write_parquet

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True, eq=False)
class RankSummary:
    """The per-rank tables of one rank or many (see the module docstring); compare with `equals`."""

    spans: pl.DataFrame
    """Step spans, `derive.steps.STEP_SPAN_SCHEMA`: ``rank, step, tid, host_start, host_end`` (the
    marker on the host), ``device, start, end`` (the device work it launched; null when none) and
    ``partial`` (the step is cut by the recorded window). Empty when the rank has no step markers."""
    breakdown: pl.DataFrame
    """Where each (rank, step) went, `derive.breakdown.breakdown`, partial steps included: ``rank,
    step, device, start_ns, dur_ns`` and the parts ``compute_ns, comm_ns, exposed_comm_ns,
    exposed_p2p_ns, copy_ns, idle_ns, idle_host_ns, idle_kernel_ns, idle_other_ns, host_gap_ns,
    input_ns, stall_ns, lead_idle_ns`` (Int64), and ``seq_sq`` (Int64: the step's Σ sequence length² where
    the trace records input shapes, `derive.sequences`; else null)."""
    instances: pl.DataFrame
    """Collective instances, `derive.collectives.INSTANCE_SCHEMA`, one row per collective per rank:
    ``rank, group, op, seq, step, bytes, group_size, ts, end``."""
    p2p: pl.DataFrame
    """Point-to-point per (rank, step), `derive.p2p.p2p_per_step` with no clock offset: ``rank, step,
    sends, recvs`` (Int32) and ``first_send_ns`` (own clock)."""
    p2p_edges: pl.DataFrame
    """The pipeline topology: ``rank, coll_op`` ("send"/"recv"), ``coll_peer`` (Int32) of the
    point-to-point rows, distinct, sorted."""
    host: pl.DataFrame
    """How the host feeds the device per (rank, step) of GPU ranks, `derive.host.HOST_SCHEMA`."""
    kernels: pl.DataFrame
    """Device time per (rank, step, kernel or operator), `derive.kernels.KERNEL_STEP_SCHEMA`:
    ``rank, step, name, category, count, total_ns, wall_ns`` (summed over the analysed steps by
    `derive.kernels.kernel_view`)."""
    kernel_categories: pl.DataFrame
    """Wall time per (rank, step, category) of those rows, `derive.kernels.CATEGORY_STEP_SCHEMA`."""
    extents: pl.DataFrame
    """What the run checks read, `same_run.rank_extents`: ``rank, lo, hi`` (the recorded window) and
    ``coll_ops`` (List(String), the collective operations the rank runs, sorted)."""
    replay_segments: pl.DataFrame
    """The what-if replay's timeline pieces, `derive.sync_segments.segments`: ``rank, step, ts, end, exposed,
    compute_ns, input_ns, idle_ns, other_ns``."""
    replay_sync: pl.DataFrame
    """The what-if replay's sync ends, `derive.sync_segments.sync_ends`: ``rank, kind, ts, dur, stream, dir,
    peer, fwd, bytes``."""
    windows: pl.DataFrame
    """What the rank did in the window before each of its collectives (why a late rank is late),
    `derive.windows.WINDOW_SCHEMA`: ``rank, ts`` (the instance's own start), ``window_ns,
    compute_ns, op_n, busy_ns, input_ns, gc_ns, sync_ns, checkpoint_ns``."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The tables, by name (field names; the file names of a written summary)."""
        return tuple(f.name for f in fields(cls))

    def tables(self) -> dict[str, pl.DataFrame]:
        """Name -> table, in field order."""
        return {name: getattr(self, name) for name in self.names()}

    def only_rank(self, rank: int) -> RankSummary:
        """The summary of `rank` alone (as `rank_tables` of its events alone gives it)."""
        return RankSummary(**{n: t.filter(pl.col("rank") == rank) for n, t in self.tables().items()})

    def equals(self, other: RankSummary) -> bool:
        """Every table equal, schema and rows."""
        return all(
            t.equals(getattr(other, n)) and t.schema == getattr(other, n).schema for n, t in self.tables().items()
        )

    def write(self, folder: str, storage_options: dict[str, Any] | None = None) -> None:
        """One ``<table>.parquet`` per table under `folder` (a local path or an object-store URL),
        each written whole or not at all (`parquet.write_parquet`)."""
        for name, table in self.tables().items():
            write_parquet(table, join(folder, f"{name}.parquet"), storage_options)

    @classmethod
    def read(cls, folders: str | Sequence[str], storage_options: dict[str, Any] | None = None) -> RankSummary:
        """The summaries `write` left in `folders` (one or several, in rank order), concatenated."""
        folders = [folders] if isinstance(folders, str) else list(folders)
        return cls(
            **{n: read_parquet([join(d, f"{n}.parquet") for d in folders], storage_options) for n in cls.names()}
        )


def concat(summaries: Sequence[RankSummary]) -> RankSummary:
    """The summary of several ranks from theirs (given in rank order)."""
    if not summaries:
        msg = "no summaries to concatenate"
        raise ValueError(msg)
    if len(summaries) == 1:
        return summaries[0]
    return RankSummary(**{n: pl.concat([getattr(s, n) for s in summaries]) for n in RankSummary.names()})
