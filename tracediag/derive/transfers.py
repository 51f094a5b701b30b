"""Transfer times: how long each send/recv pair and each collective took to move its data, not to wait.

A transfer starts when its last participant arrives (before that the others wait for it, which is
lateness, `derive.lateness`) and ends when the data is over: for a send/recv pair (`p2p.p2p_pairs`)
the earlier of its two ends (gloo closes a side where its host waits for it, so the later end may
be the host's, not the link's), for a collective instance the median of its members' ends (the
members leave together). Rows carry the ranks that took part (``members``), so a slow link or NIC
shows as the transfers of one rank (or one pair) taking longer than the others' at the same bytes
(`detect.slow_link`).

Collective instances are kept only for operations run by different member sets (e.g. tensor- and
data-parallel groups): where every instance has the same members (one data-parallel group), a
rank's transfers cannot be compared with anyone else's.
"""

from __future__ import annotations

import polars as pl

TRANSFER_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int32(),
    "kind": pl.String(),
    "op": pl.String(),
    "n": pl.Int32(),
    "bytes": pl.Int64(),
    "pos": pl.Int32(),
    "members": pl.List(pl.Int32()),
    "src": pl.Int32(),
    "dst": pl.Int32(),
    "key": pl.String(),
    "transfer_ns": pl.Int64(),
}
"""One transfer per row: ``kind`` (``p2p`` or ``collective``), ``op`` (``send/recv`` or the collective
operation), ``n`` (participants), ``bytes`` (null when the trace does not say), ``pos`` (when bytes
are unknown, the transfer's place in the step: the k-th send of its sender, the k-th instance of
its operation on its members; else null), ``members`` (the ranks, sorted), ``src``/``dst`` (a
pair's sender and receiver; null for collectives), ``key`` (the pair's key, `p2p.PAIR_SCHEMA`, or
the instance's id) and ``transfer_ns`` (≥ 0)."""

CLASS = ("kind", "op", "n", "bytes", "pos")
_CLASS_OF_COLLECTIVE = ("op", "n", "bytes", "pos")
"""Transfers comparable with each other: the same kind of operation, as many participants and the
same bytes; when the trace gives no bytes, the same operation at the same place in the step (a
tensor-parallel all-reduce is compared with the other tensor-parallel groups' same all-reduce, not
with a data-parallel gradient all-reduce of another size)."""


def pair_transfers(pairs: pl.DataFrame) -> pl.DataFrame:
    """`TRANSFER_SCHEMA` rows of the send/recv pairs (`p2p.p2p_pairs`) in a step."""
    k = pl.int_range(pl.len()).over("src", "step", order_by="send_arrival")
    return (
        pairs.filter(pl.col("step").is_not_null())
        .select(
            "step",
            kind=pl.lit("p2p"),
            op=pl.lit("send/recv"),
            n=pl.lit(2, pl.Int32),
            bytes="bytes",
            pos=pl.when(pl.col("bytes").is_null()).then(k),
            members=pl.concat_list(pl.min_horizontal("src", "dst"), pl.max_horizontal("src", "dst")),
            src="src",
            dst="dst",
            key="key",
            transfer_ns=(
                pl.min_horizontal("send_end", "recv_end") - pl.max_horizontal("send_arrival", "recv_arrival")
            ).clip(lower_bound=0),
        )
        .cast(TRANSFER_SCHEMA)
    )


def collective_transfers(matched: pl.DataFrame) -> pl.DataFrame:
    """`TRANSFER_SCHEMA` rows of the matched collective instances in a step (`collectives.match_instances`),
    for the classes whose instances have different, disjoint member sets (one per group)."""
    kept = matched.filter(pl.col("n_ranks") > 1, pl.col("step").is_not_null())
    if not kept.height or kept["n_ranks"].min() == kept["rank"].n_unique():
        return pl.DataFrame(schema=TRANSFER_SCHEMA)  # every instance has every rank: nothing to compare
    rows = (
        kept.lazy()
        .with_columns(_k=pl.int_range(pl.len()).over("rank", "step", "op", order_by="arrival"))
        .group_by("iid")
        .agg(
            step=pl.col("step").min(),
            op=pl.col("op").first(),
            bytes=pl.col("bytes").max(),
            _k=pl.col("_k").min(),
            members=pl.col("rank").unique().sort(),
            transfer_ns=(pl.col("aligned_end").median() - pl.col("arrival").max()).clip(lower_bound=0),
        )
        .with_columns(n=pl.col("members").list.len().cast(pl.Int32), _set=pl.col("members").hash())
        .with_columns(pos=pl.when(pl.col("bytes").is_null()).then(pl.col("_k")).cast(pl.Int32))
        .filter(pl.col("_set").n_unique().over(_CLASS_OF_COLLECTIVE) > 1)
        .collect(engine="in-memory")
    )
    # a class whose groups overlap mixes kinds of groups (tensor- and data-parallel instances at one
    # place of the step, matched by occurrence): its transfers are not the same work
    sets = rows.select(*_CLASS_OF_COLLECTIVE, "_set", rank="members").explode("rank").unique()
    mixed = sets.filter(pl.col("_set").n_unique().over(*_CLASS_OF_COLLECTIVE, "rank") > 1)
    rows = (
        rows.lazy()
        .join(
            mixed.select(_CLASS_OF_COLLECTIVE).unique().lazy(),
            on=list(_CLASS_OF_COLLECTIVE),
            how="anti",
            nulls_equal=True,
        )
        .select(
            "step",
            kind=pl.lit("collective"),
            op="op",
            n="n",
            bytes="bytes",
            pos="pos",
            members="members",
            src=pl.lit(None, pl.Int32),
            dst=pl.lit(None, pl.Int32),
            key=pl.col("iid").cast(pl.String),
            transfer_ns=pl.col("transfer_ns").round(0).cast(pl.Int64),
        )
        .collect(engine="in-memory")
    )
    return rows.cast(TRANSFER_SCHEMA)


def transfers(pairs: pl.DataFrame, matched: pl.DataFrame) -> pl.DataFrame:
    """Every transfer of the run (`TRANSFER_SCHEMA`), sorted by step and key."""
    return pl.concat([pair_transfers(pairs), collective_transfers(matched)]).sort("step", "kind", "key")
