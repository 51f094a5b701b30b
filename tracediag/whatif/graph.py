"""The replay graph of a run: per rank, local segments and sync marks; across ranks, sync operations.

This is the cross-rank half; the per-rank half (`derive.sync_segments`) cuts each rank's device timeline over its
complete steps into pieces and lists its sync ends, where its file lies. Here, on aligned clocks and
over the kept steps, each rank's timeline from its first kept step to its last is cut into

- *blocks*: exposed communication (a collective or send/recv active, no compute) that ends where
  one of the rank's sync operations in flight ends — the rank waits there for that operation;
- *local segments*: everything else, with the time of each category inside (``compute``,
  ``input``: data loading with nothing computing, ``idle``, ``other``: copies or communication that
  does not end at an operation).

A *sync operation* is a collective instance matched across ranks (`derive.collectives`) or a
send/recv pair (the k-th send r→q with the k-th recv on q from r). Each participant has an
arrival (its start) and its own end; ``transfer_ns`` = own end − the last participant's arrival.

*Marks* place the sync points on a rank's local progress (the edited local time elapsed since the
window start, blocks excluded): ``arrive`` (the rank launches an operation), ``block`` (it waits
for one) and ``boundary`` (a step starts, or the last step ends). Every mark lies on a segment's
edge (`derive.sync_segments`). `replay.replay` walks the operations in order of their observed end.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracediag.derive.intervals import in_time_order, union_intervals
from tracediag.derive.p2p import p2p_pairs
from tracediag.derive.ranked import rank_slices
from tracediag.derive.sync_segments import BLOCK_TOLERANCE_NS, BLOCK_TOLERANCE_SHARE, LOCAL_COLUMNS


@dataclass(frozen=True, eq=False)
class Graph:
    """What the replay needs, all on aligned clocks (ns)."""

    segments: pl.DataFrame
    """Local segments, sorted by ``rank, ts``: ``rank, step, ts, end`` and the time of each of
    `sync_segments.LOCAL_CATEGORIES` inside (``compute_ns, input_ns, idle_ns, other_ns``, summing to ``end − ts``)."""
    ops: pl.DataFrame
    """Per (op, rank) participation: ``op, rank, kind`` (collective | p2p), ``dir`` (send | recv for
    p2p), ``peer`` (the other side of a send/recv; null for collectives), ``name``, ``bytes``, ``n``
    (participants), ``arrival, end``, ``dep`` (the participant waits for every peer: it ends after the
    last arrival, or it receives — a recv cannot end before its send starts, so there the clocks are
    off, typically by a few ms on traces without collectives to align them; false only
    where the clocks disagree on a collective or a send), ``transfer_ns`` (end − last arrival, at
    least 0; without ``dep``, its own duration), ``order`` (the op's rank in the replay),
    ``stream`` (the device stream; on host traces the thread running gloo's work) and ``prev_op``
    (the operation before it on that stream of the rank: it cannot start before that one ends)."""
    marks: pl.DataFrame
    """``rank, t, t_end`` (a block's observed end; else t), ``kind`` (arrive | block | boundary),
    ``op`` (null for boundaries), ``step``, ``lag_ns`` (block: its observed end − the operation's
    end on the rank)."""
    steps: pl.DataFrame
    """Kept steps: ``rank, step, start_ns, dur_ns`` (observed)."""


_P2P_OP_SCHEMA = {
    "op": pl.String(),
    "rank": pl.Int32(),
    "dir": pl.String(),
    "peer": pl.Int32(),
    "arrival": pl.Int64(),
    "end": pl.Int64(),
    "bytes": pl.Int64(),
    "stream": pl.Int64(),
}


def _p2p_ops(
    sync: pl.DataFrame,
    offsets: pl.DataFrame,
    neighbours: dict[int, tuple[int, int]],
    steps: pl.DataFrame | None = None,
    pairs: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Send/recv pairs (`derive.p2p.p2p_pairs`, unless given: the peers the trace or the schedule
    names, else inferred from the times within `steps`): per participant ``op, rank, dir, peer,
    arrival, end, bytes, stream`` (aligned)."""
    if pairs is None:
        steps = steps if steps is not None else pl.DataFrame(schema=_STEP_KEYS)
        pairs = p2p_pairs(sync, offsets, neighbours, steps)
    if not pairs.height:
        return pl.DataFrame(schema=_P2P_OP_SCHEMA)
    op = pl.concat_str(pl.lit("p2p:"), "key")
    sides = [
        pairs.select(
            op.alias("op"),
            rank=pl.col(me),
            dir=pl.lit(d),
            peer=pl.col(other),
            arrival=f"{d}_arrival",
            end=f"{d}_end",
            bytes="bytes",
            stream=f"{d}_stream",
        )
        for d, me, other in (("send", "src", "dst"), ("recv", "dst", "src"))
    ]
    return pl.concat(sides).cast(_P2P_OP_SCHEMA)


_STEP_KEYS = {"rank": pl.Int32, "step": pl.Int32, "start_ns": pl.Int64, "dur_ns": pl.Int64}


def sync_ops(
    matched: pl.DataFrame,
    sync: pl.DataFrame,
    offsets: pl.DataFrame,
    neighbours: dict[int, tuple[int, int]] | None = None,
    steps: pl.DataFrame | None = None,
    pairs: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Every sync operation's participation rows (see `Graph.ops`) from the matched collectives and
    the ranks' sync ends (`sync_segments.sync_ends`); `steps` (aligned) to pair sends and recvs the
    trace names no peer for by their times, or their `pairs` (`derive.p2p.p2p_pairs`)."""
    streams = sync.filter(pl.col("kind") == "collective").select("rank", "ts", "stream").unique()
    coll = (
        matched.filter(pl.col("n_ranks") > 1)
        .join(streams, on=["rank", "ts"], how="left")
        .select(
            op=pl.format("c:{}", pl.col("iid")),
            rank="rank",
            kind=pl.lit("collective"),
            name="op",
            bytes="bytes",
            n="n_ranks",
            arrival="arrival",
            end="aligned_end",
            stream="stream",
            dir=pl.lit(None, pl.String),
            peer=pl.lit(None, pl.Int32),
        )
        .with_columns(parts=pl.col("n") - (pl.len().over("op") - pl.col("rank").n_unique().over("op")).cast(pl.Int32))
        # one participation per rank: a rank with several devices in one collective (a JAX process
        # driving its local devices) arrives with its first device and goes on when its last is done
        .group_by("op", "rank", maintain_order=True)
        .agg(
            pl.col("kind", "name", "bytes", "n").first(),
            pl.col("arrival").min(),
            pl.col("end").max(),
            pl.col("stream").sort_by("arrival").first(),
            pl.col("dir", "parts", "peer").first(),
        )
    )
    p2p = _p2p_ops(sync, offsets, neighbours or {}, steps, pairs).select(
        "op",
        "rank",
        kind=pl.lit("p2p"),
        name=pl.lit("send/recv"),
        bytes="bytes",
        n=pl.lit(2, pl.Int32),
        arrival="arrival",
        end="end",
        stream="stream",
        dir="dir",
        parts=pl.lit(2, pl.Int32),
        peer="peer",
    )
    ops = pl.concat([coll, p2p.cast(coll.schema)])
    ops = (
        ops.with_columns(last=pl.col("arrival").max().over("op"))
        .with_columns(dep=(pl.col("last") <= pl.col("end")) | (pl.col("dir").fill_null("") == "recv"))
        .with_columns(
            transfer_ns=pl.when("dep")
            .then((pl.col("end") - pl.col("last")).clip(lower_bound=0))
            .otherwise(pl.col("end") - pl.col("arrival"))
        )
    )
    # replayed in the order of their last arrival: everything an operation's arrivals wait for ended
    # before it (its own end may come much later: a wait long after the data went over)
    order = (
        ops.group_by("op")
        .agg(pl.col("last").first(), _e=pl.col("end").median())
        .sort("last", "_e", "op")
        .select("op", order=pl.int_range(pl.len(), dtype=pl.Int64))
    )
    return ops.join(order, on="op", how="left").drop("last").sort("order", "rank")


def _p2p_transfers(ops: pl.DataFrame, assigned: pl.DataFrame) -> pl.DataFrame:
    """`ops` with each send/recv side's transfer at most its peer's transfer + the time the side was
    seen waiting for it (its block). A side's own end is only an upper bound on when its data went
    over: gloo closes a send or recv where the rank waits for it, which may be long after (a send
    waited for at the end of the forward, the rank computing meanwhile); that stretch is the rank's
    own progress, which an edit of its compute moves, not transfer. A side that completes later than
    its peer for real (a recv still copying after the send was handed over) waits in a block."""
    waited = assigned.select("op", "rank", _w=pl.col("end") - pl.col("ts"))
    p2p = (pl.col("kind") == "p2p") & pl.col("dep")
    both = p2p.all().over("op")
    return (
        ops.join(waited, on=["op", "rank"], how="left", maintain_order="left")
        .with_columns(_peer=pl.col("transfer_ns").sum().over("op") - pl.col("transfer_ns"))
        .with_columns(
            transfer_ns=pl.when(p2p & both & (pl.col("n") == 2))
            .then(pl.min_horizontal("transfer_ns", pl.col("_peer") + pl.col("_w").fill_null(0)))
            .otherwise("transfer_ns")
        )
        .drop("_w", "_peer")
    )


def _assign_blocks(blocks: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each block's operation: the rank's operation in flight whose own end is nearest the block's end,
    within tolerance (`rank.BLOCK_TOLERANCE_NS`); recvs and collectives before sends (a send completes
    on its own once the data is handed over). As-of joins on the end, so the cost grows as n log n,
    not blocks × operations."""
    tol = pl.max_horizontal(
        pl.lit(BLOCK_TOLERANCE_NS), (BLOCK_TOLERANCE_SHARE * (pl.col("b_end") - pl.col("b_ts"))).cast(pl.Int64)
    )
    off_by = (pl.col("end") - pl.col("b_end")).abs()
    is_send = pl.col("dir").fill_null("") == "send"
    sides = [(s, ops.filter(is_send == s).select("op", "rank", "arrival", "end").sort("end")) for s in (False, True)]
    found = []
    # a rank slice of the blocks at a time (a million at 16,384 ranks): the as-of join's rows are a
    # slice's, and the sort below puts the candidates in one order whatever theirs ((_send, bid) is unique)
    for part in rank_slices(blocks):
        b = part.rename({"ts": "b_ts", "end": "b_end"}).sort("b_end")
        for sends, o in sides:
            near = b.join_asof(
                o, left_on="b_end", right_on="end", by="rank", strategy="nearest", check_sortedness=False
            )
            found.append(
                near.filter(
                    pl.col("op").is_not_null(),
                    pl.col("arrival") < pl.col("b_end"),
                    pl.col("end") > pl.col("b_ts"),
                    off_by <= tol,
                ).with_columns(_send=pl.lit(sends))
            )
    return (
        pl.concat(found)
        .sort("_send", off_by, "bid")
        .unique("bid", keep="first", maintain_order=True)
        .unique(["rank", "op"], keep="first", maintain_order=True)
    )


def _aligned(frame: pl.LazyFrame, offsets: pl.DataFrame) -> pl.LazyFrame:
    """`frame` with ``ts`` and ``end`` on aligned clocks, its rows in their order."""
    off = pl.col("offset_ns").fill_null(0)
    return (
        frame.join(offsets.lazy(), on="rank", how="left", maintain_order="left")
        .with_columns(pl.col("ts") - off, pl.col("end") - off)
        .drop("offset_ns")
    )


def _local(segs: pl.LazyFrame, waits: pl.LazyFrame) -> pl.DataFrame:
    """The local segments of `segs` (aligned, in (rank, ts) order): those not inside a block of their rank
    (`waits`: ``rank, _bts, _bend``, sorted by ``_bts``), in their order."""
    return (
        segs.join_asof(waits, left_on="ts", right_on="_bts", by="rank", check_sortedness=False)
        .filter(~(pl.col("_bend").is_not_null() & (pl.col("end") <= pl.col("_bend"))))
        .select("rank", "step", "ts", "end", *LOCAL_COLUMNS)
        .collect(engine="in-memory")
    )


def build(
    segments: pl.DataFrame,
    sync: pl.DataFrame,
    offsets: pl.DataFrame,
    matched: pl.DataFrame,
    steps: pl.DataFrame,
    neighbours: dict[int, tuple[int, int]] | None = None,
    pairs: pl.DataFrame | None = None,
) -> Graph:
    """The replay graph of the kept steps: the cross-rank half, from the per-rank tables.

    `segments` and `sync`: every rank's `sync_segments.segments` and `sync_segments.sync_ends`; `offsets` and
    `matched` (`derive.collectives.align_and_match`); `steps`: the kept (rank, step) rows with
    aligned ``start_ns`` and ``dur_ns`` (`Facts.steps`). `neighbours`: per pipeline rank, its
    previous and next stage's rank (-1 at the ends), to pair send/recv when the trace names no peer;
    `pairs`: the send/recv pairs when already made (`derive.p2p.p2p_pairs`).
    """
    kept = steps.select("rank", "step", "start_ns", "dur_ns").sort("rank", "step")
    # the kept steps' segments, aligned, in (rank, ts) order, a rank slice at a time: read twice (the
    # blocks, the local segments), never a table beside the segments given but a slice's (2.5 million
    # rows at 16,384 ranks); every row is its rank's own, so the slices' results are the run's
    pieces = rank_slices(segments if in_time_order(segments, "rank", "ts") else segments.sort("rank", "ts"))
    del segments

    def segs(piece: pl.DataFrame) -> pl.LazyFrame:
        kept_only = piece.lazy().join(
            kept.lazy().select("rank", "step"), on=["rank", "step"], how="semi", maintain_order="left"
        )
        return _aligned(kept_only, offsets)

    exposed = [union_intervals(segs(p).filter("exposed").select("rank", "ts", "end"), ["rank"]) for p in pieces]
    blocks = pl.concat([b.collect(engine="in-memory") for b in exposed]).with_row_index("bid")
    ops = sync_ops(matched, sync, offsets, neighbours, kept, pairs)
    cand = _assign_blocks(blocks, ops)
    # a rank waits for an operation from its arrival on: exposed time before it (other communication
    # in flight while the host is between operators) is its own progress
    assigned = cand.select(
        "rank", "op", ts=pl.max_horizontal("b_ts", "arrival"), end="b_end", lag_ns=pl.col("b_end") - pl.col("end")
    )
    window = kept.group_by("rank").agg(_lo=pl.col("start_ns").min(), _hi=(pl.col("start_ns") + pl.col("dur_ns")).max())
    ops = ops.join(window, on="rank").filter(pl.col("arrival") >= pl.col("_lo"), pl.col("end") <= pl.col("_hi"))
    # an operation replays only when every participant's part lies in the window
    ops = ops.filter(pl.len().over("op") == pl.col("parts")).drop("_lo", "_hi", "parts")
    # a device stream (or a gloo worker thread) runs its communication one operation after the other
    ops = ops.sort("arrival").with_columns(
        prev_op=pl.when(pl.col("stream").is_not_null()).then(pl.col("op").shift(1).over("rank", "stream"))
    )
    # blocks whose operation was dropped are local time again
    assigned = assigned.join(ops.select("op", "rank"), on=["op", "rank"], how="semi")
    ops = _p2p_transfers(ops, assigned)
    # each rank's segments in time order (what the as-of join by rank reads), kept in that order
    waits = assigned.select("rank", _bts="ts", _bend="end").sort("_bts").lazy()
    local = pl.concat([_local(segs(p), waits) for p in pieces])
    last = kept.group_by("rank").agg(pl.col("step").max(), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("t"))
    bounds = pl.concat(
        [
            kept.select("rank", "step", t="start_ns"),
            last.select("rank", step=pl.col("step") + 1, t="t"),
        ]
    ).with_columns(t_end="t", kind=pl.lit("boundary"), op=pl.lit(None, pl.String), lag_ns=pl.lit(0, pl.Int64))
    arrive = ops.select(
        "rank", t="arrival", t_end="arrival", kind=pl.lit("arrive"), op="op", lag_ns=pl.lit(0, pl.Int64)
    )
    block = assigned.select("rank", t="ts", t_end="end", kind=pl.lit("block"), op="op", lag_ns="lag_ns")
    marks = pl.concat([arrive, block]).sort("t")
    marks = marks.join_asof(
        kept.select("rank", "step", _s="start_ns").sort("_s"),
        left_on="t",
        right_on="_s",
        by="rank",
        check_sortedness=False,
    ).drop("_s")
    marks = pl.concat([marks, bounds.select(marks.columns).cast(marks.schema)]).sort("rank", "t")
    return Graph(segments=local, ops=ops, marks=marks, steps=kept)
