"""`--comm-kernel REGEX`: kernels the vocabulary does not know as communication, named by the user."""

from __future__ import annotations

import polars as pl

from tracediag.schema import CollOp, Kind
from tracediag.vocab import coll_op, distinct_names, user_regex


def check_comm_kernel(pattern: str | None) -> str | None:
    """`pattern` when the linear-time engine accepts it; a one-line `ValueError` naming the option if not."""
    return None if pattern is None else user_regex(pattern, "--comm-kernel").pattern


def mark_comm_kernels(events: pl.DataFrame, pattern: str) -> pl.DataFrame:
    """`events` with every kernel (kind `kernel`) whose name `pattern` finds made communication (`comm`),
    its `coll_op` read from the name by the one vocabulary (`vocab.coll_op`: `my_alltoall_kernel` is
    `all_to_all`, a name that says none `other`). The pattern runs once per distinct name."""
    names = distinct_names(events.filter(pl.col("kind") == "kernel")).cast(pl.String)
    hit = names.filter(names.str.contains(pattern))
    if hit.is_empty():
        return events
    ops = pl.select(coll_op(pl.lit(hit))).to_series().to_list()
    name = pl.col("name").cast(pl.String)
    mark = (pl.col("kind") == "kernel") & name.is_in(hit.implode())
    return events.with_columns(
        kind=pl.when(mark).then(pl.lit("comm", dtype=Kind)).otherwise(pl.col("kind")),
        coll_op=pl.when(mark & pl.col("coll_op").is_null())
        .then(name.replace_strict(hit.to_list(), ops, default=None, return_dtype=pl.String).cast(CollOp))
        .otherwise(pl.col("coll_op")),
    )
