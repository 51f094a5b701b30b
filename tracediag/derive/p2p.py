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
        .collect()
    )


def pipeline_groups(events: pl.DataFrame) -> list[list[int]]:
    """Ranks that exchange point-to-point traffic, one list per pipeline (sorted).

    From ``coll_peer`` when the trace has it (connected components), else one group of every rank
    with send/recv rows.
    """
    p2p = events.lazy().filter(pl.col("coll_op").is_in(["send", "recv"]))
    ranks = sorted(p2p.select("rank").unique().collect()["rank"].to_list())
    edges = p2p.filter(pl.col("coll_peer").is_not_null()).select("rank", "coll_peer").unique().collect().rows()
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
