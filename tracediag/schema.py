"""The event table: the one contract between ingest and every later stage.

One row per duration event, all times in integer nanoseconds (absolute Unix epoch where the format
allows it). Every reader returns exactly these columns in this order and with these dtypes;
`conform` is the single place that enforces it.
"""

from __future__ import annotations

from typing import Annotated

import polars as pl

from tracediag.api_types import Table, checked
from tracediag.errors import TraceError

KINDS: tuple[str, ...] = (
    "cpu_op",  # host operator (aten::*, c10d::*, record_param_comms)
    "annotation",  # user / framework ranges (record_function, NVTX, gpu_user_annotation)
    "step",  # a training step marker (ProfilerStep#N, NVTX step range, JAX `train`)
    "runtime",  # CUDA/HIP runtime and driver calls
    "kernel",  # device compute kernel
    "comm",  # communication: NCCL/RCCL kernels, gloo ops, XLA collectives
    "memcpy",
    "memset",
    "sync",  # device synchronisation (stream/event/context sync)
    "python",  # python_function frames
    "other",
)
"""Event kinds, in the order of the `kind` Enum."""

COLL_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
    "coalesced",
    "other",
)
"""Collective operations, in the order of the `coll_op` Enum."""

Kind = pl.Enum(list(KINDS))
CollOp = pl.Enum(list(COLL_OPS))

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int64(),
    "tid": pl.Int64(),
    "device": pl.Int16(),
    "stream": pl.Int64(),
    "kind": Kind,
    "name": pl.Categorical(),
    "ts": pl.Int64(),
    "dur": pl.Int64(),
    "correlation": pl.Int64(),
    "external_id": pl.Int64(),
    "coll_op": CollOp,
    "coll_bytes": pl.Int64(),
    "coll_group": pl.String(),
    "coll_group_size": pl.Int32(),
    "coll_seq": pl.Int64(),
    "coll_peer": pl.Int32(),
    "seq_sq": pl.Int64(),
    "step": pl.Int32(),
}
"""Column name -> dtype of the event table, in column order.

- ``rank``: global rank of the process that wrote the trace.
- ``pid``/``tid``: as in the trace (GPU rows: pid = device, tid = stream); string ids map to null.
- ``device``: device index, -1 on host rows. ``stream``: device stream, null on host rows.
- ``ts``/``dur``: ns; ``ts`` absolute where the trace allows (see `RunMeta.time_base`).
- ``correlation``/``external_id``: launch <-> kernel and CPU op <-> kernel links.
- ``coll_*``: collective op, payload bytes (nelems x dtype size), process group name, its size,
  collective sequence number, and the send/recv peer (global rank).
- ``seq_sq``: on an operator whose recorded input shapes give the batch's sequences
  (`vocab.SEQUENCE_INPUT_OP`: an embedding lookup of ``[B, S]`` token ids), Σ over them of the
  sequence length² (B·S²: attention's work grows with it); null elsewhere and without ``record_shapes``.
- ``step``: left null by ingest, filled by ``derive.steps``.
"""

SKIP_REASONS: tuple[str, ...] = (
    "metadata",  # ph=M: process / thread names
    "instant",  # ph=i/I/R: instant events and marks
    "counter",  # ph=C
    "flow",  # ph=s/t/f: flow arrows (ac2g, fwdbwd)
    "async",  # ph=b/n/e/S/T/F/p: async events
    "object",  # ph=N/O/D and samples P
    "unmatched_end",  # an E with no open B
    "paired_end",  # an E that closed a B: the pair is one row
    "malformed",  # a duration event without a usable ts/dur, or fields of the wrong type
    "truncated",  # cut off at the end of an incomplete file
    "other_phase",  # any other phase value
)
"""Reasons an input event does not become a row; every input event is a row or counted under one."""


EventTable = Annotated[
    pl.DataFrame,
    Table(
        "event-table",
        EVENT_SCHEMA,
        "docs/event-table.md: tracediag.load builds them, tracediag.schema.conform casts to them",
    ),
]
"""The hint of an argument that must be an event table (`Run.events`): `api_types.checked` refuses a frame
without every `EVENT_SCHEMA` column of its dtype, in one line naming them."""


GEMM_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String(),
    "op": pl.String(),
    "batch": pl.Int64(),
    "m": pl.Int64(),
    "k": pl.Int64(),
    "n": pl.Int64(),
    "dtype": pl.String(),
    "seconds": pl.Float64(),
    "steps": pl.Int64(),
}
"""The GEMM table's columns, in order: one row per GEMM host op with a recorded shape (`ingest.gemms.gemm_table`
reads it from the files, `model.calibrate` fits over it)."""
GemmTable = Annotated[pl.DataFrame, Table("GEMM-table", GEMM_SCHEMA, "tracediag.ingest.gemms.gemm_table builds them")]
"""The hint of an argument that must be a GEMM table (`model.calibrate.calibrate_from_trace`)."""


OPTIONAL_COLUMNS: frozenset[str] = frozenset({"seq_sq"})
"""Columns a saved event table (`tracediag ingest` Parquet) may lack: added later, read as nulls."""


def empty_events() -> pl.DataFrame:
    """An event table with no rows."""
    return pl.DataFrame(schema=EVENT_SCHEMA)


MAX_NS = 2**62
"""The largest time or duration, in ns, a row may have (about 146 years): the sum of two stays an Int64."""
MAX_RANK = 2**31 - 1
"""The largest rank the `rank` column (Int32) holds."""
_I64 = (-(2**63), 2**63 - 1)


def check_rank(rank: int, path: str) -> int:
    """`rank` if the `rank` column can hold it; else a `TraceError` naming the file."""
    if not 0 <= rank <= MAX_RANK:
        raise TraceError(path, f"rank {rank} is out of range (0..{MAX_RANK:,})")
    return rank


def check_base_ns(base: int, path: str, what: str) -> int:
    """A file's absolute time base (epoch ns) if it is in range; else a `TraceError` naming the file."""
    if not 0 <= base <= MAX_NS:
        raise TraceError(path, f"{what} {base} is out of range (0..{MAX_NS:,} ns)")
    return base


def shifted(col: str | pl.Expr, base: int) -> pl.Expr:
    """`col + base` (Int64 ns), null where the sum would leave ±MAX_NS (never a wrapped number)."""
    e = pl.col(col) if isinstance(col, str) else col
    lo, hi = max(-MAX_NS - base, _I64[0]), min(MAX_NS - base, _I64[1])
    return pl.when(e.is_between(lo, hi)).then(e + base)


@checked
def conform(
    df: pl.DataFrame, *, skipped: dict[str, int] | None = None, warnings: list[str] | None = None
) -> pl.DataFrame:
    """Return `df` with exactly the event-table columns, in order, with their dtypes.

    Missing columns become nulls; extra columns are dropped. A row whose `ts` or `dur` is missing
    or beyond ±`MAX_NS` (or `dur` < 0), or whose device index does not fit Int16, is dropped and
    counted as "malformed" in `skipped`; any other integer that does not fit its column becomes
    null, with one line per column in `warnings`. Other casts are strict, so a reader bug
    surfaces here rather than as a silently wrong value.
    """
    skipped = skipped if skipped is not None else {}
    exprs, narrowed = [], []
    have = df.schema  # built anew on every access: once, not once per column
    for col, dtype in EVENT_SCHEMA.items():
        if col not in have:
            exprs.append(_AS_NULL[col])
        elif dtype.is_integer() and have[col] != dtype:
            exprs.append(_LENIENT[col])
            narrowed.append(col)
        else:
            exprs.append(_STRICT[col])
    out = df.select(exprs)
    # a non-strict cast turns only the values that do not fit into nulls: null counts tell how many
    lost = {col: out[col].null_count() - df[col].null_count() for col in narrowed}
    ts, dur = pl.col("ts"), pl.col("dur")
    bad = ts.is_null() | dur.is_null() | ~ts.is_between(-MAX_NS, MAX_NS) | ~dur.is_between(0, MAX_NS)
    if lost.get("device"):
        bad = bad | (pl.lit(df["device"].is_not_null()) & pl.col("device").is_null())
    n_bad = 0 if not lost.get("device") and _all_in_range(out) else out.select(bad.sum()).item()
    if n_bad:
        skipped["malformed"] = skipped.get("malformed", 0) + n_bad
        out = out.filter(~bad)
    for col, n in lost.items():
        if n and col != "device" and warnings is not None:
            warnings.append(f"{n:,} {col} values out of range for {EVENT_SCHEMA[col]}; left unknown")
    return out


STRAY_NS = 86_400 * 10**9
"""A row that starts or ends more than this (a day) from the median start of its file's rows is a stray: a
negative or corrupted `ts`, a `dur` of years. No profiler window spans a day, and one such row would stretch
its rank's timeline, or put its work in no step, without a word."""


def drop_strays(events: pl.DataFrame, *, skipped: dict[str, int], warnings: list[str]) -> pl.DataFrame:
    """`events` (one file's, `conform`ed) without its strays (`STRAY_NS`), counted as "malformed" in
    `skipped` with one line in `warnings`. Costs two reductions where the rows span less than a day."""
    if not events.height:
        return events
    ts, end = pl.col("ts"), pl.col("ts") + pl.col("dur")
    lo, hi = events.select(ts.min().alias("lo"), end.max().alias("hi")).row(0)
    if hi - lo <= STRAY_NS:
        return events
    median = int(events.get_column("ts").median())
    stray = ((ts - median).abs() > STRAY_NS) | (end - median > STRAY_NS)
    bad = events.filter(stray)
    if not bad.height:
        return events
    skipped["malformed"] = skipped.get("malformed", 0) + bad.height
    first = bad.row(0, named=True)
    warnings.append(
        f"{bad.height:,} events start or end more than a day from the file's other events (e.g. ts {first['ts']:,} "
        f"ns, dur {first['dur']:,} ns, where the median ts is {median:,}): left out as malformed"
    )
    return events.filter(~stray)


def unnamed_warning(n: int) -> str:
    """The warning of a Chrome-format reader for `n` duration events with no `name` (absent, or not a string):
    read unnamed, so no rule that goes by name (a step marker, a collective, data loading) sees them."""
    return f"{n} events have no name (absent, or not a string): read unnamed"


def stray_files(events: pl.DataFrame, file: pl.Series) -> bool:
    """Whether the rows of any one file of a batch (`file`: the row's file, as `events`) span more than a day,
    so that `drop_strays` of that file alone may drop some."""
    if not events.height:
        return False
    lo, hi = events.select(lo=pl.col("ts").min(), hi=(pl.col("ts") + pl.col("dur")).max()).row(0)
    if hi - lo <= STRAY_NS:
        return False
    spans = (
        events.select("ts", "dur", file=file)
        .group_by("file")
        .agg(span=(pl.col("ts") + pl.col("dur")).max() - pl.col("ts").min())
    )
    return bool(spans.select((pl.col("span") > STRAY_NS).any()).item())


# `conform`'s expressions, built once: building them costs about as much as running them.
_AS_NULL = {col: pl.lit(None, dtype=dtype).alias(col) for col, dtype in EVENT_SCHEMA.items()}
_LENIENT = {col: pl.col(col).cast(dtype, strict=False) for col, dtype in EVENT_SCHEMA.items()}
_STRICT = {col: pl.col(col).cast(dtype) for col, dtype in EVENT_SCHEMA.items()}


def _all_in_range(events: pl.DataFrame) -> bool:
    """No `ts`/`dur` null or out of range, told by null counts and four extremes rather than a
    test of every row (the common case)."""
    ts, dur = events.get_column("ts"), events.get_column("dur")
    if ts.null_count() or dur.null_count():
        return False
    if events.height == 0:
        return True
    return ts.min() >= -MAX_NS and ts.max() <= MAX_NS and dur.min() >= 0 and dur.max() <= MAX_NS
