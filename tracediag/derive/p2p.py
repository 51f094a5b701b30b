"""Point-to-point traffic per (rank, step) and the pipeline topology it implies.

Sends and receives are the ``send``/``recv`` rows of one source per rank (device kernels, else
``gloo:*`` work, else ``c10d::send``/``c10d::recv_`` operators). Pipeline stages are ordered by when
they first send in a step: stage 0 sends its first activation first, stage s after receiving from
s−1 and computing, and the last stage sends only in backward, after its own forward. The order is
taken per step and its median over steps decides. When the trace names peers (``coll_peer``),
ranks that exchange traffic form one pipeline (connected components of the send/recv graph);
otherwise all ranks with point-to-point traffic are taken as one pipeline.
"""

from __future__ import annotations

import polars as pl


def p2p_per_step(events: pl.DataFrame, offsets: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step): ``sends``, ``recvs`` and ``first_send_ns`` (the first send's start, aligned clock).

    `events` must have ``step`` filled; `offsets` is `collectives.clock_offsets` output.
    """
    op = pl.col("coll_op").cast(pl.String)
    source = pl.when(pl.col("device") >= 0).then(0).when(pl.col("kind") == "comm").then(1).otherwise(2)
    rows = (
        events.lazy()
        .filter(pl.col("coll_op").is_in(["send", "recv"]), pl.col("step").is_not_null())  # on the Enum
        .filter(pl.col("kind").is_in(["comm", "cpu_op"]))
        .with_columns(_src=source)
        .filter(pl.col("_src") == pl.col("_src").min().over("rank"))
        .join(offsets.lazy(), on="rank", how="left")
        .with_columns(_t=pl.col("ts") - pl.col("offset_ns").fill_null(0))
    )
    return (
        rows.group_by("rank", "step")
        .agg(
            sends=(op == "send").sum().cast(pl.Int32),
            recvs=(op == "recv").sum().cast(pl.Int32),
            first_send_ns=pl.col("_t").filter(op == "send").min(),
        )
        .sort("rank", "step")
        .collect(engine="in-memory")
    )


def pipeline_groups(events: pl.DataFrame) -> list[list[int]]:
    """Ranks that exchange point-to-point traffic, one list per pipeline (sorted).

    From ``coll_peer`` when the trace has it (connected components), else one group of every rank
    with send/recv rows.
    """
    p2p = events.lazy().filter(pl.col("coll_op").is_in(["send", "recv"]))
    ranks = sorted(p2p.select("rank").unique().collect(engine="in-memory")["rank"].to_list())
    edges = (
        p2p.filter(pl.col("coll_peer").is_not_null())
        .select("rank", "coll_peer")
        .unique()
        .collect(engine="in-memory")
        .rows()
    )
    if not edges:
        return [ranks] if len(ranks) > 1 else []
    parent = {r: r for r in ranks}

    def root(r: int) -> int:
        while parent.setdefault(r, r) != r:
            r = parent[r]
        return r

    for a, b in edges:
        parent[root(a)] = root(b)
    groups: dict[int, list[int]] = {}
    for r in ranks:
        groups.setdefault(root(r), []).append(r)
    return [sorted(g) for g in groups.values() if len(g) > 1]


def stage_order(p2p: pl.DataFrame, ranks: list[int]) -> list[int]:
    """`ranks` ordered by pipeline stage: the median over steps of each rank's first-send rank.

    `p2p` is `p2p_per_step` output. A rank that never sends goes last.
    """
    order = (
        p2p.lazy()
        .filter(pl.col("rank").is_in(ranks))
        .with_columns(_pos=pl.col("first_send_ns").rank("ordinal").over("step"))
        .group_by("rank")
        .agg(_pos=pl.col("_pos").median())
        .sort(pl.col("_pos").fill_null(float("inf")), "rank")
        .collect()
    )
    return order["rank"].to_list()


def stage_neighbours(p2p: pl.DataFrame, pipelines: list[list[int]]) -> dict[int, tuple[int, int]]:
    """Per pipeline rank, its previous and next stage's rank (-1 at the ends), in `stage_order`."""
    out: dict[int, tuple[int, int]] = {}
    for ranks in pipelines:
        order = stage_order(p2p, ranks)
        for i, r in enumerate(order):
            out[r] = (order[i - 1] if i else -1, order[i + 1] if i + 1 < len(order) else -1)
    return out


PAIR_SCHEMA: dict[str, pl.DataType] = {
    "src": pl.Int32(),
    "dst": pl.Int32(),
    "key": pl.String(),
    "inferred": pl.Boolean(),
    "step": pl.Int32(),
    "bytes": pl.Int64(),
    "send_arrival": pl.Int64(),
    "send_end": pl.Int64(),
    "send_stream": pl.Int64(),
    "recv_arrival": pl.Int64(),
    "recv_end": pl.Int64(),
    "recv_stream": pl.Int64(),
}
"""One send/recv pair per row, aligned clocks: ``src`` → ``dst``, ``key`` (unique per pair:
``{src}>{dst}#{k}`` for the k-th pair of peers the trace or the schedule names, ``{src}>{dst}~{k}``
where the peer was inferred from the times, ``inferred``), ``step`` (the send's step among `steps`,
null outside them), ``bytes`` and each side's arrival, end and stream."""

PAIR_TOLERANCE_NS = 100_000
"""A send may end this much after the recv it feeds (or 10% of the recv, when longer) on aligned
clocks: device kernels of one transfer end within µs of each other, plus the clocks' alignment error."""

INFER_LIMIT = 4_000_000
"""Peers are inferred from times only when no step holds more candidate (send, recv) couples than this
(sends × recvs of the step): the traces that lack peers are small CPU (gloo) jobs; a large one keeps its
unnamed transfers unpaired rather than a quadratic join."""


INFER_COVERAGE = 0.9
"""Peers inferred from times are kept only when their pattern pairs at least this share of the unnamed
sends and recvs: a program that exchanges with the same peers every step (a ring or halo exchange)
pairs them all; a pattern that leaves many unpaired (interleaved micro-batches of a pipeline schedule
without annotations) is a guess and would invent transfers."""


def _sides(sync: pl.DataFrame, offsets: pl.DataFrame, neighbours: dict[int, tuple[int, int]]) -> pl.LazyFrame:
    """The send/recv rows of `sync` (`sync_segments.sync_ends`), aligned, with ``peer`` as the trace
    names it, else from the schedule annotation around it and the stage order (a send inside a forward
    goes to the next stage, a recv comes from the previous one; backward reverses)."""
    nb = pl.DataFrame(
        {
            "rank": list(neighbours),
            "_prev": [v[0] for v in neighbours.values()],
            "_next": [v[1] for v in neighbours.values()],
        },
        schema={"rank": pl.Int32, "_prev": pl.Int32, "_next": pl.Int32},
    ).lazy()
    to_next = (pl.col("dir") == "send") == pl.col("fwd")
    from_phase = pl.when(pl.col("fwd").is_not_null()).then(
        pl.when(to_next).then(pl.col("_next")).otherwise(pl.col("_prev"))
    )
    off = pl.col("offset_ns").fill_null(0)
    return (
        sync.lazy()
        .filter(pl.col("kind") == "p2p")
        .join(nb, on="rank", how="left")
        .with_columns(peer=pl.coalesce("peer", from_phase))
        .join(offsets.lazy(), on="rank", how="left")
        .select(
            "rank",
            "dir",
            "peer",
            arrival=pl.col("ts") - off,
            end=pl.col("ts") + pl.col("dur") - off,
            bytes=pl.col("bytes"),
            stream=pl.col("stream"),
        )
    )


def _with_steps(rows: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """`rows` (``rank, arrival``) with ``step``: the step of `steps` (``rank, step, start_ns, dur_ns``,
    aligned) the arrival falls in, else null."""
    s = steps.select("rank", "step", _s="start_ns", _e=pl.col("start_ns") + pl.col("dur_ns")).sort("_s")
    return (
        rows.sort("arrival")
        .join_asof(s, left_on="arrival", right_on="_s", by="rank", check_sortedness=False)
        .with_columns(step=pl.when(pl.col("arrival") < pl.col("_e")).then(pl.col("step")))
        .drop("_s", "_e")
    )


def _named_pairs(rows: pl.DataFrame) -> pl.DataFrame:
    """Pairs of the rows whose peer is known: the k-th send src → dst with the k-th recv on dst from src."""
    named = (
        rows.filter(pl.col("peer").is_not_null())
        .with_columns(
            src=pl.when(pl.col("dir") == "send").then(pl.col("rank")).otherwise(pl.col("peer")),
            dst=pl.when(pl.col("dir") == "send").then(pl.col("peer")).otherwise(pl.col("rank")),
        )
        .sort("arrival", "end", "bytes", "stream", nulls_last=True)
        .with_columns(k=pl.int_range(pl.len()).over("src", "dst", "dir"))
    )
    sends = named.filter(pl.col("dir") == "send")
    recvs = named.filter(pl.col("dir") == "recv")
    return sends.join(recvs, on=["src", "dst", "k"], how="inner", suffix="_r").select(
        "src",
        "dst",
        key=pl.format("{}>{}#{}", "src", "dst", "k"),
        inferred=pl.lit(False),
        step="step",
        bytes=pl.coalesce("bytes", "bytes_r"),
        send_arrival="arrival",
        send_end="end",
        send_stream="stream",
        recv_arrival="arrival_r",
        recv_end="end_r",
        recv_stream="stream_r",
    )


def _mode_kept(pairs: pl.DataFrame, side: str, other: str) -> pl.DataFrame:
    """`pairs` whose `other` rank is the one `side`'s rank pairs with most often at that position
    (``_js`` / ``_jr``: its j-th send or recv of the step) over the steps, strictly: the same program
    every step talks to the same peers."""
    j = "_js" if side == "src" else "_jr"
    counts = pairs.group_by(side, j, other).agg(_n=pl.len()).sort("_n", descending=True)
    top = counts.group_by(side, j, maintain_order=True).agg(
        _mode=pl.col(other).first(), _n1=pl.col("_n").first(), _n2=pl.col("_n").get(1, null_on_oob=True)
    )
    strict = top.filter(pl.col("_n2").is_null() | (pl.col("_n1") > pl.col("_n2")))
    return (
        pairs.join(strict, on=[side, j], how="inner")
        .filter(pl.col(other) == pl.col("_mode"))
        .drop("_mode", "_n1", "_n2")
    )


def _open_ended(recvs: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """`recvs` less those whose end was closed by the rank's wait for another of its send/recvs: the
    recv ends within `PAIR_TOLERANCE_NS` after one that was in flight with it ended (gloo closes an
    operation where the host waits for it, in the order it waits: such an end says when the wait
    returned, not when the data came)."""
    ends = rows.select("rank", _e="end", _a="arrival").sort("_e")
    near = (
        recvs.with_row_index("_i")
        .sort("end")
        .join_asof(
            ends,
            left_on="end",
            right_on="_e",
            by="rank",
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .filter(
            pl.col("_e") < pl.col("end"),
            pl.col("end") - pl.col("_e") <= PAIR_TOLERANCE_NS,
            pl.col("_a") < pl.col("end"),
        )
    )
    return recvs.with_row_index("_i").join(near.select("_i"), on="_i", how="anti").drop("_i")


def _inferred_pairs(rows: pl.DataFrame) -> pl.DataFrame:
    """Pairs of the rows without a peer, from their times (aligned): the pattern first, then every step.

    Within each step, a recv takes the send of another rank that overlaps it and ended last before the
    recv ended (within `PAIR_TOLERANCE_NS`): the data it got was the last handed over; a send claimed
    twice stays with the recv that ended nearest it. A recv whose end was closed by the rank's wait for
    another operation claims nothing (`_open_ended`). The same program talks to the same peers every
    step, so the pattern is what both sides keep most often at their position (the j-th send or recv
    of the rank in the step, `_mode_kept`); it then pairs those positions in every step where both
    sides overlap, closed ends included, when that pairs nearly all of them (`INFER_COVERAGE`)."""
    free = rows.filter(pl.col("peer").is_null(), pl.col("step").is_not_null())
    if not free.height:
        return pl.DataFrame(schema=PAIR_SCHEMA)
    free = free.sort("arrival", "end").with_columns(_j=pl.int_range(pl.len()).over("rank", "step", "dir"))
    s = (
        free.filter(pl.col("dir") == "send")
        .select("step", src="rank", send_arrival="arrival", send_end="end", send_stream="stream", _b="bytes", _js="_j")
        .with_row_index("_sid")
    )
    recvs = free.filter(pl.col("dir") == "recv")
    r_all = recvs.select(
        "step", dst="rank", recv_arrival="arrival", recv_end="end", recv_stream="stream", _br="bytes", _jr="_j"
    )
    r = r_all.join(_open_ended(recvs, rows).select("step", dst="rank", _jr="_j"), on=["step", "dst", "_jr"])
    per_step = s.group_by("step").len().join(r.group_by("step").len(), on="step")
    if not per_step.height or int((per_step["len"] * per_step["len_right"]).max()) > INFER_LIMIT:
        return pl.DataFrame(schema=PAIR_SCHEMA)
    tol = pl.max_horizontal(pl.lit(PAIR_TOLERANCE_NS), 0.1 * (pl.col("recv_end") - pl.col("recv_arrival")))
    overlap = (pl.col("send_arrival") <= pl.col("recv_end")) & (pl.col("recv_arrival") <= pl.col("send_end"))
    same_bytes = pl.col("_b").is_null() | pl.col("_br").is_null() | (pl.col("_b") == pl.col("_br"))
    cand = (
        r.with_row_index("_rid")
        .join(s, on="step")
        .filter(pl.col("src") != pl.col("dst"), pl.col("send_end") <= pl.col("recv_end") + tol, overlap, same_bytes)
    )
    best = (
        cand.sort("send_end", "src", descending=[True, False])
        .unique("_rid", keep="first")
        .sort((pl.col("recv_end") - pl.col("send_end")).abs(), "_rid")
        .unique("_sid", keep="first")
    )
    pattern = (
        _mode_kept(_mode_kept(best, "src", "dst"), "dst", "src")
        .group_by("src", "_js", "dst", "_jr")
        .agg(_n=pl.len())
        .sort("_n", "src", "_js", descending=[True, False, False])
        .unique(["src", "_js"], keep="first")
        .unique(["dst", "_jr"], keep="first")
    )
    paired = (
        s.join(pattern.select("src", "_js", "dst", "_jr"), on=["src", "_js"])
        .join(r_all, on=["step", "dst", "_jr"])
        .filter(overlap, same_bytes)
    )
    if paired.height < INFER_COVERAGE * max(s.height, r_all.height):
        return pl.DataFrame(schema=PAIR_SCHEMA)  # no consistent program: a guess, not a pairing
    return (
        paired.sort("send_arrival", "src", "dst")
        .with_columns(_k=pl.int_range(pl.len()).over("src", "dst"))
        .select(
            "src",
            "dst",
            key=pl.format("{}>{}~{}", "src", "dst", "_k"),
            inferred=pl.lit(True),
            step="step",
            bytes=pl.coalesce("_b", "_br"),
            send_arrival="send_arrival",
            send_end="send_end",
            send_stream="send_stream",
            recv_arrival="recv_arrival",
            recv_end="recv_end",
            recv_stream="recv_stream",
        )
    )


def p2p_pairs(
    sync: pl.DataFrame, offsets: pl.DataFrame, neighbours: dict[int, tuple[int, int]], steps: pl.DataFrame
) -> pl.DataFrame:
    """Every send matched with its recv (`PAIR_SCHEMA`), from every rank's sync ends
    (`sync_segments.sync_ends`), the clock offsets, the pipeline `neighbours` (`stage_neighbours`) and
    the kept `steps` (``rank, step, start_ns, dur_ns``, aligned): by the peers the trace or the
    schedule names, else by their times (`_inferred_pairs`)."""
    if not sync.select((pl.col("kind") == "p2p").any()).item():
        return pl.DataFrame(schema=PAIR_SCHEMA)
    rows = _with_steps(_sides(sync, offsets, neighbours).collect(engine="in-memory"), steps)
    parts = [_named_pairs(rows), _inferred_pairs(rows)]
    return pl.concat([p.select(list(PAIR_SCHEMA)).cast(PAIR_SCHEMA) for p in parts]).sort("send_arrival", "key")
