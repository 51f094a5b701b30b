"""The replay graph of a run: per rank, local segments and sync marks; across ranks, sync operations.

Each rank's timeline (the breakdown's device timeline, aligned clock) from its first kept step to
its last is cut into

- *blocks*: exposed communication (a collective or send/recv active, no compute) that ends where
  one of the rank's sync operations in flight ends — the rank waits there for that operation;
- *local segments*: everything else, by category (``compute``, ``input``: data loading with nothing
  computing, ``idle``, ``other``: copies or communication that does not end at an operation).

A *sync operation* is a collective instance matched across ranks (`derive.collectives`) or a
send/recv pair (the k-th send r→q with the k-th recv on q from r). Each participant has an
arrival (its start) and its own end; ``transfer_ns`` = own end − the last participant's arrival.

*Marks* place the sync points on a rank's local progress (the edited local time elapsed since the
window start, blocks excluded): ``arrive`` (the rank launches an operation), ``block`` (it waits
for one) and ``boundary`` (a step starts, or the last step ends). `replay.replay` walks the
operations in order of their observed end.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracediag.derive.breakdown import INPUT_REGEX, device_timeline
from tracediag.derive.intervals import sweep, union_intervals

BLOCK_TOLERANCE_NS = 1_000_000
BLOCK_TOLERANCE_SHARE = 0.5
"""A block belongs to the operation in flight on the rank (arrived before the block ends, ends after
it starts) whose own end lies nearest the block's end, within `BLOCK_TOLERANCE_NS` or this share of
the block's length, whichever is larger (a rank may resume a little before its own part of a gloo
collective is closed); otherwise the exposed time stays local (``other``)."""

LOCAL_CATEGORIES = ("compute", "input", "idle", "other")


@dataclass(frozen=True)
class Graph:
    """What the replay needs, all on aligned clocks (ns)."""

    segments: pl.DataFrame
    """Local segments: ``rank, step, ts, end, cat`` (one of `LOCAL_CATEGORIES`)."""
    ops: pl.DataFrame
    """Per (op, rank) participation: ``op, rank, kind`` (collective | p2p), ``dir`` (send | recv for
    p2p), ``name``, ``bytes``, ``n`` (participants), ``arrival, end``, ``dep`` (the participant
    waits for every peer: it ends
    after the last arrival, or it receives — a recv cannot end before its send starts, so there the
    clocks are off, typically by a few ms on traces without collectives to align them; false only
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


PHASE_REGEX = r"^(?i:forward|backward)"
"""Pipeline schedule annotations (`torch.distributed.pipelining`: ``Forward i``, ``Backward i``): a
send inside a forward goes to the next stage, a recv comes from the previous one; backward reverses."""


def _peers(rows: pl.LazyFrame, events: pl.DataFrame, neighbours: dict[int, tuple[int, int]]) -> pl.LazyFrame:
    """Fill a missing ``peer`` from the enclosing forward/backward annotation and the stage order."""
    if not neighbours:
        return rows
    name = pl.col("name").cast(pl.String)
    phases = (
        events.lazy()
        .filter(pl.col("device") == -1, pl.col("kind") == "annotation", name.str.contains(PHASE_REGEX))
        .select("rank", "tid", _pts="ts", _pend=pl.col("ts") + pl.col("dur"), _fwd=name.str.contains("(?i)^forward"))
        .sort("_pts")
    )
    nb = pl.DataFrame(
        {
            "rank": list(neighbours),
            "_prev": [v[0] for v in neighbours.values()],
            "_next": [v[1] for v in neighbours.values()],
        },
        schema={"rank": pl.Int32, "_prev": pl.Int32, "_next": pl.Int32},
    ).lazy()
    to_next = (pl.col("dir") == "send") == pl.col("_fwd")
    return (
        rows.sort("ts")
        .join_asof(phases, left_on="ts", right_on="_pts", by=["rank", "tid"], check_sortedness=False)
        .join(nb, on="rank", how="left")
        .with_columns(
            peer=pl.coalesce(
                "peer",
                pl.when(pl.col("ts") < pl.col("_pend")).then(
                    pl.when(to_next).then(pl.col("_next")).otherwise(pl.col("_prev"))
                ),
            )
        )
        .drop("_pts", "_pend", "_fwd", "_prev", "_next")
    )


def _p2p_ops(
    events: pl.DataFrame, offsets: pl.DataFrame, neighbours: dict[int, tuple[int, int]] | None = None
) -> pl.DataFrame:
    """Send/recv pairs: per participant ``op, rank, arrival, end, bytes, stream`` (aligned)."""
    op = pl.col("coll_op").cast(pl.String)
    source = pl.when(pl.col("device") >= 0).then(0).when(pl.col("kind") == "comm").then(1).otherwise(2)
    rows = (
        events.lazy()
        .filter(op.is_in(["send", "recv"]), pl.col("kind").is_in(["comm", "cpu_op"]))
        .with_columns(_src=source)
        .filter(pl.col("_src") == pl.col("_src").min().over("rank"))
        .select("rank", "tid", "ts", "dur", "coll_bytes", "stream", dir=op, peer=pl.col("coll_peer").cast(pl.Int32))
    )
    rows = (
        _peers(rows, events, neighbours or {})
        .filter(pl.col("peer").is_not_null())
        .join(offsets.lazy(), on="rank", how="left")
        .select(
            "rank",
            "dir",
            "peer",
            arrival=pl.col("ts") - pl.col("offset_ns").fill_null(0),
            end=pl.col("ts") + pl.col("dur") - pl.col("offset_ns").fill_null(0),
            bytes=pl.col("coll_bytes"),
            stream=pl.col("stream"),
        )
        .with_columns(
            src=pl.when(pl.col("dir") == "send").then(pl.col("rank")).otherwise(pl.col("peer")),
            dst=pl.when(pl.col("dir") == "send").then(pl.col("peer")).otherwise(pl.col("rank")),
        )
        .sort("arrival")
        .with_columns(k=pl.int_range(pl.len()).over("src", "dst", "dir"))
        .collect()
    )
    sends = rows.filter(pl.col("dir") == "send")
    recvs = rows.filter(pl.col("dir") == "recv")
    pairs = sends.join(recvs, on=["src", "dst", "k"], how="inner", suffix="_r").with_columns(
        op=pl.format("p2p:{}>{}#{}", "src", "dst", "k")
    )
    keep = ["op", "rank", "dir", "arrival", "end", "bytes", "stream"]
    recv_side = pairs.select(
        "op", rank="rank_r", dir="dir_r", arrival="arrival_r", end="end_r", bytes="bytes_r", stream="stream_r"
    )
    return pl.concat([pairs.select(keep), recv_side.cast(pairs.select(keep).schema)])


def sync_ops(
    matched: pl.DataFrame,
    events: pl.DataFrame,
    offsets: pl.DataFrame,
    neighbours: dict[int, tuple[int, int]] | None = None,
) -> pl.DataFrame:
    """Every sync operation's participation rows (see `Graph.ops`)."""
    streams = (
        events.filter(pl.col("kind") == "comm")
        .select("rank", "ts", stream=pl.coalesce("stream", "tid"))
        .unique(["rank", "ts"], keep="first")
    )
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
        )
    )
    p2p = _p2p_ops(events, offsets, neighbours).select(
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
    )
    ops = pl.concat([coll, p2p.cast(coll.schema)])
    return (
        ops.with_columns(last=pl.col("arrival").max().over("op"))
        .with_columns(dep=(pl.col("last") <= pl.col("end")) | (pl.col("dir").fill_null("") == "recv"))
        .with_columns(
            transfer_ns=pl.when("dep")
            .then((pl.col("end") - pl.col("last")).clip(lower_bound=0))
            .otherwise(pl.col("end") - pl.col("arrival"))
        )
        .with_columns(_e=pl.col("end").median().over("op"))
        .with_columns(order=pl.col("_e").rank("dense").cast(pl.Int64) - 1)
        .drop("last", "_e")
        .sort("order", "rank")
    )


def _timeline(events: pl.DataFrame, spans: pl.DataFrame, offsets: pl.DataFrame, kept: pl.DataFrame) -> pl.DataFrame:
    """Elementary segments of each rank's device timeline over its kept steps, aligned, with counts."""
    sp = spans.join(kept.select("rank", "step"), on=["rank", "step"], how="semi").lazy()
    lf = events.lazy()
    name = pl.col("name").cast(pl.String)
    loading = lf.filter(pl.col("device") == -1, name.str.contains(INPUT_REGEX)).select(
        "rank", "ts", end=pl.col("ts") + pl.col("dur"), cat=pl.lit("input")
    )
    parts = pl.concat([device_timeline(events, sp).select("rank", "ts", "end", "cat"), loading])
    segs = sweep(parts, ["rank"], ["compute", "comm", "p2p", "copy", "input", "step"])
    return (
        segs.filter(pl.col("n_step") > 0)
        .join(offsets.lazy(), on="rank", how="left")
        .with_columns(pl.col("ts") - pl.col("offset_ns").fill_null(0), pl.col("end") - pl.col("offset_ns").fill_null(0))
        .drop("offset_ns")
        .collect()
    )


def _assign_blocks(blocks: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """Each block's operation: the rank's operation in flight whose own end is nearest the block's end,
    within tolerance; recvs and collectives before sends (a send completes on its own once the data is
    handed over). As-of joins on the end, so the cost grows as n log n, not blocks × operations."""
    tol = pl.max_horizontal(
        pl.lit(BLOCK_TOLERANCE_NS), (BLOCK_TOLERANCE_SHARE * (pl.col("b_end") - pl.col("b_ts"))).cast(pl.Int64)
    )
    off_by = (pl.col("end") - pl.col("b_end")).abs()
    b = blocks.rename({"ts": "b_ts", "end": "b_end"}).sort("b_end")
    is_send = pl.col("dir").fill_null("") == "send"
    found = []
    for sends in (False, True):
        o = ops.filter(is_send == sends).select("op", "rank", "arrival", "end").sort("end")
        near = b.join_asof(o, left_on="b_end", right_on="end", by="rank", strategy="nearest", check_sortedness=False)
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


def build(
    events: pl.DataFrame,
    spans: pl.DataFrame,
    offsets: pl.DataFrame,
    matched: pl.DataFrame,
    steps: pl.DataFrame,
    neighbours: dict[int, tuple[int, int]] | None = None,
) -> Graph:
    """The replay graph of the kept steps.

    `events` with ``step`` filled, `spans` (`derive.steps.step_spans`), `offsets` and `matched`
    (`derive.collectives.align_and_match`), `steps`: the kept (rank, step) rows with aligned
    ``start_ns`` and ``dur_ns`` (`Facts.steps`). `neighbours`: per pipeline rank, its previous and
    next stage's rank (-1 at the ends), to pair send/recv when the trace names no peer.
    """
    kept = steps.select("rank", "step", "start_ns", "dur_ns").sort("rank", "step")
    segs = _timeline(events, spans, offsets, kept)
    exposed = ((pl.col("n_comm") > 0) | (pl.col("n_p2p") > 0)) & (pl.col("n_compute") == 0)
    blocks = (
        union_intervals(segs.lazy().filter(exposed).select("rank", "ts", "end"), ["rank"])
        .collect()
        .with_row_index("bid")
    )
    ops = sync_ops(matched, events, offsets, neighbours)
    cand = _assign_blocks(blocks, ops)
    assigned = cand.select("rank", "op", ts="b_ts", end="b_end", lag_ns=pl.col("b_end") - pl.col("end"))
    # local segments: everything outside assigned blocks
    in_block = (
        segs.lazy()
        .sort("ts")
        .join_asof(
            assigned.lazy().select("rank", _bts="ts", _bend="end").sort("_bts"),
            left_on="ts",
            right_on="_bts",
            by="rank",
            check_sortedness=False,
        )
        .with_columns(_in=(pl.col("_bend").is_not_null() & (pl.col("end") <= pl.col("_bend"))))
    )
    cat = (
        pl.when(pl.col("n_compute") > 0)
        .then(pl.lit("compute"))
        .when(pl.col("n_input") > 0)
        .then(pl.lit("input"))
        .when((pl.col("n_comm") + pl.col("n_p2p") + pl.col("n_copy")) > 0)
        .then(pl.lit("other"))
        .otherwise(pl.lit("idle"))
    )
    starts = kept.lazy().select("rank", "step", _s="start_ns").sort("_s")
    local = (
        in_block.filter(~pl.col("_in"))
        .select("rank", "ts", "end", cat=cat)
        .sort("ts")
        .join_asof(starts, left_on="ts", right_on="_s", by="rank", check_sortedness=False)
        .filter(pl.col("step").is_not_null())
        .select("rank", "step", "ts", "end", "cat")
        .sort("rank", "ts")
        .collect()
    )
    last = kept.group_by("rank").agg(pl.col("step").max(), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("t"))
    bounds = pl.concat(
        [
            kept.select("rank", "step", t="start_ns"),
            last.select("rank", step=pl.col("step") + 1, t="t"),
        ]
    ).with_columns(t_end="t", kind=pl.lit("boundary"), op=pl.lit(None, pl.String), lag_ns=pl.lit(0, pl.Int64))
    window = kept.group_by("rank").agg(_lo=pl.col("start_ns").min(), _hi=(pl.col("start_ns") + pl.col("dur_ns")).max())
    ops = ops.join(window, on="rank").filter(pl.col("arrival") >= pl.col("_lo"), pl.col("end") <= pl.col("_hi"))
    # an operation replays only when every participant's part lies in the window
    ops = ops.filter(pl.len().over("op") == pl.col("n")).drop("_lo", "_hi")
    # a device stream (or a gloo worker thread) runs its communication one operation after the other
    ops = ops.sort("arrival").with_columns(
        prev_op=pl.when(pl.col("stream").is_not_null()).then(pl.col("op").shift(1).over("rank", "stream"))
    )
    arrive = ops.select(
        "rank", t="arrival", t_end="arrival", kind=pl.lit("arrive"), op="op", lag_ns=pl.lit(0, pl.Int64)
    )
    block = assigned.join(ops.select("op", "rank"), on=["op", "rank"], how="semi").select(
        "rank", t="ts", t_end="end", kind=pl.lit("block"), op="op", lag_ns="lag_ns"
    )
    marks = pl.concat([arrive, block]).sort("t")
    marks = marks.join_asof(
        kept.select("rank", "step", _s="start_ns").sort("_s"),
        left_on="t",
        right_on="_s",
        by="rank",
        check_sortedness=False,
    ).drop("_s")
    marks = pl.concat([marks, bounds.select(marks.columns).cast(marks.schema)]).sort("rank", "t")
    # blocks dropped with their operation become local time again
    dropped = assigned.join(ops.select("op", "rank").unique(), on=["op", "rank"], how="anti")
    if dropped.height:
        extra = (
            segs.lazy()
            .join(dropped.lazy().select("rank", _bts="ts", _bend="end"), on="rank")
            .filter(pl.col("ts") >= pl.col("_bts"), pl.col("end") <= pl.col("_bend"))
            .select("rank", "ts", "end", cat=cat)
            .sort("ts")
            .join_asof(starts, left_on="ts", right_on="_s", by="rank", check_sortedness=False)
            .filter(pl.col("step").is_not_null())
            .select("rank", "step", "ts", "end", "cat")
            .collect()
        )
        local = pl.concat([local, extra]).sort("rank", "ts")
    return Graph(segments=local, ops=ops, marks=marks, steps=kept)
