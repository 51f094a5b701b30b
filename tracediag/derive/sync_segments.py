"""The per-rank half of the replay graph: what one rank's events give the what-if, as two small tables.

- `sync_ends`: the rank's ends of sync operations — each collective instance's start and stream, and
  each send/recv with its peer (or the forward/backward annotation around it, from which the
  driver names the peer once it knows the pipeline's stage order);
- `segments`: the rank's device timeline over its complete steps, cut at step boundaries, at the
  edges of exposed communication and at every sync end's start, each *piece* carrying how long each
  local category (`LOCAL_CATEGORIES`) covers inside it.

Both are computed per rank (every expression grouped by ``rank``), on the rank's own clock, so the
tables of a run equal the concatenation of each rank's: a worker derives them where the rank's file
lies (`derive.per_rank`) and only they travel. Their size grows with the rank's steps and sync
operations, not with its events: between two cuts the categories are summed. The replay needs no
finer grain, because every point where it reads a rank's local progress (a step boundary, the start
of a sync operation, the edges of a block) is a cut. `whatif.graph.build` joins them across ranks.
"""

from __future__ import annotations

import polars as pl

from tracediag.derive.intervals import TimeKeys, asof_by_rank, rank_time
from tracediag.vocab import FORWARD_ANNOTATION, PHASE_ANNOTATION, distinct_names, name_matches

SYNC_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "kind": pl.String(),
    "ts": pl.Int64(),
    "dur": pl.Int64(),
    "stream": pl.Int64(),
    "dir": pl.String(),
    "peer": pl.Int32(),
    "fwd": pl.Boolean(),
    "bytes": pl.Int64(),
}
"""Per rank and sync end, own clock: ``kind`` collective (one row per collective instance start and
duration, ``stream``: the device stream, on host traces the thread running gloo's work) or p2p (a send or recv:
``dir``, ``peer`` as the trace names it, ``fwd``: inside a forward (true) or backward (false) schedule
annotation, null outside both, ``dur``, ``bytes``, ``stream``)."""

SEGMENT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "ts": pl.Int64(),
    "end": pl.Int64(),
    "exposed": pl.Boolean(),
    "compute_ns": pl.Int64(),
    "input_ns": pl.Int64(),
    "idle_ns": pl.Int64(),
    "other_ns": pl.Int64(),
}
"""Per rank, pieces of the device timeline of its complete steps, own clock: ``exposed``
(communication active, no compute: a block candidate) and the time of each local category inside."""

BLOCK_TOLERANCE_NS = 1_000_000
BLOCK_TOLERANCE_SHARE = 0.5
"""A block belongs to the operation in flight on the rank (arrived before the block ends, ends after
it starts) whose own end lies nearest the block's end, within `BLOCK_TOLERANCE_NS` or this share of
the block's length, whichever is larger (a rank may resume a little before its own part of a gloo
collective is closed); otherwise the exposed time stays local (``other``)."""

LOCAL_CATEGORIES = ("compute", "input", "idle", "other")
"""What a rank does between sync points, each edited on its own by a cause (`causes`)."""
LOCAL_COLUMNS = tuple(f"{c}_ns" for c in LOCAL_CATEGORIES)


def _category_tests() -> dict[str, pl.Expr]:
    """The local category of an elementary segment, one test per category of `LOCAL_CATEGORIES`:
    computing, else loading data, else communicating or copying without compute (``other``), else
    idle (exactly one holds)."""
    compute = pl.col("n_compute") > 0
    loading = pl.col("n_input") > 0
    busy = (pl.col("n_comm") + pl.col("n_p2p") + pl.col("n_copy")) > 0
    return {
        "compute": compute,
        "input": ~compute & loading,
        "other": ~compute & ~loading & busy,
        "idle": ~compute & ~loading & ~busy,
    }


def sync_ends(events: pl.DataFrame, instances: pl.DataFrame, *, names: pl.Series | None = None) -> pl.DataFrame:
    """The rank's sync ends (`SYNC_SCHEMA`) from its events and its collective instances
    (`derive.collectives.collective_instances`). `names`:
    `vocab.distinct_names` of `events`, when the caller has them."""
    lf = events.lazy()
    names = distinct_names(events) if names is None else names
    streams = (
        lf.filter(pl.col("kind") == "comm")
        .select("rank", "ts", stream=pl.coalesce("stream", "tid"))
        .sort("rank", "ts", "stream", nulls_last=True)
        .unique(["rank", "ts"], keep="first")
    )
    coll = (
        instances.lazy()
        .select("rank", "ts", dur=pl.col("end") - pl.col("ts"))
        .unique()
        .join(streams, on=["rank", "ts"], how="left")
        .select("rank", "ts", "dur", "stream", kind=pl.lit("collective"))
    )
    op = pl.col("coll_op").cast(pl.String)
    source = pl.when(pl.col("device") >= 0).then(0).when(pl.col("kind") == "comm").then(1).otherwise(2)
    rows = (
        lf.filter(pl.col("coll_op").is_in(["send", "recv"]), pl.col("kind").is_in(["comm", "cpu_op"]))
        .with_columns(_src=source)
        .filter(pl.col("_src") == pl.col("_src").min().over("rank"))
        .select("rank", "tid", "ts", "dur", "stream", dir=op, peer=pl.col("coll_peer"), bytes=pl.col("coll_bytes"))
    )
    phases = (
        lf.filter(pl.col("device") == -1, pl.col("kind") == "annotation", name_matches(names, PHASE_ANNOTATION))
        .select(
            "rank", "tid", _pts="ts", _pend=pl.col("ts") + pl.col("dur"), _fwd=name_matches(names, FORWARD_ANNOTATION)
        )
        .sort("_pts")
    )
    p2p = (
        rows.sort("ts")
        .join_asof(phases, left_on="ts", right_on="_pts", by=["rank", "tid"], check_sortedness=False)
        .select(
            "rank",
            "ts",
            "dur",
            "stream",
            "dir",
            "peer",
            "bytes",
            kind=pl.lit("p2p"),
            fwd=pl.when(pl.col("ts") < pl.col("_pend")).then(pl.col("_fwd")),
        )
    )
    cols = list(SYNC_SCHEMA)
    both = pl.concat([coll, p2p], how="diagonal_relaxed").select(cols).collect(engine="in-memory").cast(SYNC_SCHEMA)
    return both.sort("rank", "ts", "kind", "dir", "peer", "dur", "stream", "bytes", nulls_last=True)


def _prev(col: str) -> pl.Expr:
    """`col` of the previous row of the same rank (null on a rank's first row), on a frame sorted by
    rank: a shift and a comparison, cheaper than a window over ``rank``."""
    return pl.when(pl.col("rank") == pl.col("rank").shift(1)).then(pl.col(col).shift(1))


def _without_lone_exposed(segs: pl.LazyFrame, sync: pl.DataFrame) -> pl.LazyFrame:
    """`segs` (elementary, sorted by rank and ts; so is the result) with ``exposed`` cleared on the exposed stretches no
    sync operation of the rank can be waited for in: within one step, and no end of the rank's sync
    ends within the block tolerance of the stretch's end. The driver could never make them blocks
    (`graph._assign_blocks` asks for more), so they stay local and the pieces stay few: exposed
    fragments between compute (gloo's thread working while the host is between operators) are many.
    A stretch over a step boundary is kept: the driver cuts it where a step is not kept everywhere."""
    joined = (pl.col("ts") == _prev("end")) & _prev("exposed")
    segs = segs.with_columns(
        # ids unique over the whole frame (a running count over all ranks, new at each rank's first
        # row): one key for the group_by and the join back, each stretch within one rank
        _stretch=pl.when("exposed").then((~joined).fill_null(True).cast(pl.UInt32).cum_sum())
    )
    stretches = (
        segs.filter("exposed")
        .group_by("_stretch")
        .agg(pl.col("rank").first(), _ts=pl.col("ts").min(), _end=pl.col("end").max(), _steps=pl.col("step").n_unique())
        .sort("_end")
    )
    ends = sync.lazy().select("rank", _e=pl.col("ts") + pl.col("dur")).filter(pl.col("_e").is_not_null()).sort("_e")
    tol = pl.max_horizontal(
        pl.lit(BLOCK_TOLERANCE_NS), (BLOCK_TOLERANCE_SHARE * (pl.col("_end") - pl.col("_ts"))).cast(pl.Int64)
    )
    waited = (
        stretches.join_asof(ends, left_on="_end", right_on="_e", by="rank", strategy="nearest", check_sortedness=False)
        .filter((pl.col("_steps") > 1) | ((pl.col("_e") - pl.col("_end")).abs() <= tol))
        .select("_stretch", _waited=pl.lit(True))
    )
    return (
        segs.join(waited, on="_stretch", how="left", maintain_order="left")
        .with_columns(exposed=pl.col("exposed") & pl.col("_waited").fill_null(False))
        .drop("_stretch", "_waited")
    )


def segments(
    device: pl.DataFrame, spans: pl.DataFrame, sync: pl.DataFrame, keys: TimeKeys | None = None
) -> pl.DataFrame:
    """The rank's timeline pieces (`SEGMENT_SCHEMA`) over its complete steps (`spans`:
    `derive.steps.step_spans`), from its device timeline swept with its sync ends as cuts (`device`:
    `derive.breakdown.device_sweep` of `spans` and `sync`, the rank's `sync_ends`; `keys`: the
    events' `derive.intervals.time_keys`)."""
    sp = spans.lazy().filter(~pl.col("partial"), pl.col("start").is_not_null())
    exposed = ((pl.col("n_comm") > 0) | (pl.col("n_p2p") > 0)) & (pl.col("n_compute") == 0)
    starts = sp.select("rank", "step", _s="start")
    cuts = sync.select(rank_time("ts", keys).alias("_cut")).get_column("_cut").unique()
    elementary = (
        device.lazy()
        .filter(pl.col("n_complete") > 0)
        .with_columns(
            exposed=exposed,
            len=pl.col("end") - pl.col("ts"),
        )
    )
    # the sweep's order (rank, ts) is kept throughout: it is what the as-of join asks for
    elementary = (
        asof_by_rank(elementary, starts, "ts", "_s", ordered=True, keys=keys)
        .filter(pl.col("step").is_not_null())
        .with_columns(_cut=rank_time("ts", keys).is_in(cuts.implode()))  # one key per row: no join on (rank, ts)
    )
    segs = _without_lone_exposed(elementary, sync)
    new = (
        (pl.col("ts") != _prev("end")) | (pl.col("step") != _prev("step")) | (pl.col("exposed") != _prev("exposed"))
    ).fill_null(True) | pl.col("_cut")
    on = pl.col("len")
    # a piece is a run of consecutive rows (each rank's rows in time order), numbered by a running
    # count of its first rows: the numbers are sorted, so its group is found without hashing; its
    # start, rank, step and exposure are its first row's (all its rows share the last three), its
    # end its last row's
    pieces = (
        segs.select(
            "rank",
            "step",
            "ts",
            "end",
            "exposed",
            _piece=new.cum_sum().set_sorted(),
            **{f"{c}_ns": pl.when(test).then(on).otherwise(0) for c, test in _category_tests().items()},
        )
        .group_by("_piece")
        .agg(
            pl.col("rank", "step", "ts").first(),
            pl.col("end").last(),
            pl.col("exposed").first(),
            *(pl.col(c).sum() for c in LOCAL_COLUMNS),
        )
        .select(list(SEGMENT_SCHEMA))
        .sort("rank", "ts")
        # the in-memory engine runs this plan (as-of joins, shifts over 150k elementary segments) on
        # about half the CPU of the streaming one (measured on 8 ranks of an A100 trace)
        .collect(engine="in-memory")
    )
    return pieces.cast(SEGMENT_SCHEMA)
