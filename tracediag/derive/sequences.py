"""How much sequence work each rank's batch held per step, where the trace records input shapes.

Variable-length batches give each data-parallel rank a different amount of work every step; attention's
part grows with the square of the sequence length. The event table carries ``seq_sq`` (Σ over a
sequence-input operator's sequences of their length², `vocab.SEQUENCE_INPUT_OP`) where the profiler
recorded shapes; summed per (rank, step) it is what `detect.sequence_imbalance` correlates the rank's
compute with. Per rank, from its own events (`per_rank.rank_tables`).
"""

from __future__ import annotations

import polars as pl

SEQUENCE_SCHEMA: dict[str, pl.DataType] = {"rank": pl.Int32(), "step": pl.Int32(), "seq_sq": pl.Int64()}
"""Per (rank, step) with recorded sequence inputs: ``seq_sq``, their Σ sequence length²."""


def sequence_work(events: pl.DataFrame) -> pl.DataFrame:
    """`SEQUENCE_SCHEMA` rows from stepped `events` (``step`` filled); none without recorded shapes."""
    return (
        events.lazy()
        .filter(pl.col("seq_sq").is_not_null(), pl.col("step").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("seq_sq").sum())
        .sort("rank", "step")
        .collect(engine="in-memory")
        .cast(SEQUENCE_SCHEMA)
    )
