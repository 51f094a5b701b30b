"""PyTorch profiler (Kineto) semantics on top of the decoded Chrome container.

Maps `cat` to the event kinds, places every time on the Unix epoch (the three Kineto time-base
generations), reads the rank and process groups from `distributedInfo`, and fills the collective
columns from `record_param_comms` args, NCCL kernel names, `nccl:*`/`gloo:*` annotations and
`c10d::*` ops. See trace-formats.md §2.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl

from tracediag.errors import RankError, TraceError, shown
from tracediag.ingest.trace import FileMeta, FileTrace, ProcessGroup
from tracediag.schema import (
    MAX_NS,
    CollOp,
    Kind,
    check_base_ns,
    check_rank,
    conform,
    drop_strays,
    shifted,
    stray_files,
    unnamed_warning,
)
from tracediag.vocab import (
    COLLECTIVE_PREFIX,
    COMM_KERNEL,
    DEVICE_CATS,
    HOST_COLLECTIVE,
    OP_RULES,
    SEQUENCE_INPUT_OP,
    STEP_MARKER,
    category,
    name_matches,
    resolve_rank,
)

if TYPE_CHECKING:
    from tracediag.ingest.chrome import Batch, Decoded

EPOCH_FLOOR_NS = 10**17
"""Times above this (1973) are taken as Unix-epoch ns; below, the trace is relative."""

_KIND_BY_CAT = {
    "cpu_op": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "annotation",
    "kernel": "kernel",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cuda_sync": "sync",
    "python_function": "python",
}

DTYPE_BYTES: dict[str, int] = {
    # c10 ScalarType names (record_param_comms `dtype`)
    "Float": 4,
    "BFloat16": 2,
    "Half": 2,
    "Double": 8,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e5m2fnuz": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
    # C++ type names (profiler `Input type` with record_shapes)
    "float": 4,
    "double": 8,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "long int": 8,
    "long": 8,
    "int": 4,
    "short int": 2,
    "short": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}
"""Element size in bytes by the dtype names traces use."""


def to_events(dec: Decoded, path: str, *, rank: int | None, default_rank: int | None = None) -> FileTrace:
    """The event table of one Kineto trace.

    `rank` overrides the file's own; `default_rank` is used only when the file names none
    (a single-file run). Otherwise a missing rank is a `RankError` naming the file.
    """
    info = dec.top.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    file_rank = _int_or_none(info.get("rank"))
    warnings = list(dec.warnings)
    named = () if file_rank is None else (file_rank,)
    given = rank
    rank = resolve_rank(
        path,
        given=given,
        named=named,
        source="distributedInfo.rank",
        default=default_rank,
        missing=_no_rank(info),
        warnings=warnings,
    )
    _check_world_size(check_rank(rank, path), info, path, given=given)
    slices, time_base = _absolute_times(dec, path, warnings)
    events = _classify(_with_args(dec, slices, "a_device", "a_stream"), _rows_named(dec, slices))
    events = _fill_collectives(events, dec, warnings)
    events = _fill_sequences(events, dec)
    events = events.hstack([pl.Series("rank", [rank], dtype=pl.Int32).new_from_index(0, events.height)])
    events = drop_strays(
        conform(events, skipped=dec.skipped, warnings=warnings), skipped=dec.skipped, warnings=warnings
    )
    if n := events.select(THREADLESS.sum()).item():
        warnings.append(threadless_warning(n))
    if n := events.get_column("name").null_count():
        warnings.append(unnamed_warning(n))
    meta = FileMeta(
        path=path,
        format="kineto",
        rank=rank,
        world_size=_small_int(info.get("world_size")),
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        process_groups=_process_groups(info),
        time_base=time_base,
        devices=_device_names(dec.top.get("deviceProperties")),
        host=_host_name(dec.top),
        events_in=dec.events_in,
        skipped=dict(sorted(dec.skipped.items())),
        warnings=tuple(warnings),
    )
    return FileTrace(events=events, meta=meta)


THREADLESS = pl.col("pid").is_not_null() & pl.col("tid").is_null() & pl.col("stream").is_null()
"""Host rows of a process with no integer thread id: `tid` absent, or a string that is not decimal digits
(`"main"`). Their process's rows of that kind are then one thread, whose nesting and B/E pairs mix
threads; Kineto's own string tid (the profiler's span, `"pid": "Spans"`) has no integer pid and is not one."""


def threadless_warning(n: int) -> str:
    """The warning for `n` `THREADLESS` rows: they are read, as one thread of their process."""
    return f'{n} events have no integer thread id (tid absent, or a string such as "main"): read as one thread'


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isascii() and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _no_rank(info: dict) -> str:
    """Why `distributedInfo` gives no rank: none there, or one that is no integer (1.5, "one", [0])."""
    if "rank" not in info or info["rank"] is None:
        return "no distributedInfo.rank"
    return f"distributedInfo.rank is {shown(repr(info['rank'])[:40])}, not an integer"


def _check_world_size(rank: int, info: dict, path: str, *, given: int | None) -> int:
    """`rank` if it is below the world size the file states (rank 7 of a world of 2 is a contradiction that
    would make up ranks 2..6 as missing); else a `TraceError` naming the file. A rank given for the file
    (`--rank`, `--rank-from-filename`) overrides the file's own, and its world size with it."""
    world = _small_int(info.get("world_size"))
    if given is None and world is not None and 0 < world <= rank:
        raise TraceError(path, f"rank {rank} is not below the world size {world} the file states (distributedInfo)")
    return rank


def _small_int(value: Any) -> int | None:
    """An integer field that must fit Int32 (a size, a peer rank); None when absent or out of range."""
    n = _int_or_none(value)
    return n if n is not None and -(2**31) <= n < 2**31 else None


def _absolute_times(dec: Decoded, path: str, warnings: list[str]) -> tuple[pl.DataFrame, str]:
    base = _int_or_none(dec.top.get("baseTimeNanoseconds"))
    slices = dec.slices
    if base is not None:
        check_base_ns(base, path, "baseTimeNanoseconds")
        return slices.with_columns(ts=shifted("ts", base)), "epoch"
    if slices.height and _median_past_floor(slices["ts"]):
        return slices, "epoch"
    if slices.height:
        warnings.append(_RELATIVE)
    return slices, "relative"


_RELATIVE = "times are relative (no baseTimeNanoseconds): not comparable across hosts"


def _median_past_floor(ts: pl.Series) -> bool:
    """Whether the median time is above `EPOCH_FLOOR_NS`; told by the extremes when all times lie
    well on one side of it (the usual case: a median costs a selection over every row)."""
    return _past_floor(ts.min(), ts.max(), ts)


def _past_floor(lo: int | None, hi: int | None, median: pl.Series | float | None) -> bool:
    """`_median_past_floor` from the extremes, and the median (or the times, to take it from when needed)."""
    if lo is not None and lo > EPOCH_FLOOR_NS + 1024:  # the margin covers the median's float rounding
        return True
    if hi is not None and hi < EPOCH_FLOOR_NS - 1024:
        return False
    if isinstance(median, pl.Series):
        median = median.median()
    return (median or 0) > EPOCH_FLOOR_NS


def _with_args(dec: Decoded, frame: pl.DataFrame, *fields: str) -> pl.DataFrame:
    """`dec.with_args(frame, *fields)`, each tier row placed by its `order` (an index in the file:
    small and unique) rather than by a hash join of every row."""
    tiers = [(tier, [f for f in fields if f in tier.columns]) for tier in dec.rare]
    columns = []
    for tier, wanted in tiers:
        if not wanted:
            continue
        located = _locate(frame["order"], tier["order"])
        if located is None:
            return dec.with_args(frame, *fields)
        at, keep = located
        values = tier if keep is None else tier.filter(keep)  # tier rows that are not slices (instants, dropped)
        columns += [_nulls(f, tier[f].dtype, frame.height).scatter(at, values[f]) for f in wanted]
    return frame.with_columns(columns) if set(fields) & set(frame.columns) else frame.hstack(columns)


def _rows_named(dec: Decoded, frame: pl.DataFrame) -> pl.Series:
    """The rows of `frame` whose args name a collective (`Collective name`): a kernel's kind follows from
    it, and these rows are few, so their names are not spread over a column for every row."""
    tier = next(t for t in dec.rare if "a_coll_name" in t.columns)
    wanted = tier.filter(pl.col("a_coll_name").is_not_null()).get_column("order")
    located = _locate(frame["order"], wanted) if len(wanted) else None
    if located is not None:
        return located[0].cast(pl.UInt32)
    rows = frame.select(pl.col("order").is_in(wanted.implode()).arg_true()) if len(wanted) else None
    return pl.Series("row", [], dtype=pl.UInt32) if rows is None else rows.to_series().cast(pl.UInt32)


def _locate(order: pl.Series, wanted: pl.Series) -> tuple[pl.Series, pl.Series | None] | None:
    """The rows holding the `wanted` orders, and which of them are held (None: all); None where no
    table from order to row can be built (orders spread far wider than the rows).

    Where the orders are the row numbers themselves (0, 1, 2, ...: every input row is a slice, as in
    most files) an order is its row, and no table is built. `order` is distinct, as an index in the
    file is."""
    n = len(order)
    if n and order.is_sorted() and order[0] == 0 and order[n - 1] == n - 1 and not order.null_count():
        if (wanted.max() or 0) < n and (wanted.min() or 0) >= 0:
            return wanted, None
        keep = (wanted >= 0) & (wanted < n)
        return wanted.filter(keep), keep
    top = max(order.max() or 0, wanted.max() or 0)
    row_of = _row_of(order, top + 1)
    if row_of is None:
        return None
    at = row_of.gather(wanted)
    if not at.null_count():
        return at, None
    keep = at.is_not_null()
    return at.filter(keep), keep


def _row_of(values: pl.Series, size: int) -> pl.Series | None:
    """A table from each value (0..size-1) to its row (null where none); None unless the values
    are distinct non-negative integers in a range not much wider than the rows."""
    n = len(values)
    if n < 2 or values.null_count() or values.min() < 0 or size > 4 * n + 4096:
        return None
    table = _nulls("row", pl.UInt32, size).scatter(values, pl.int_range(n, eager=True, dtype=pl.UInt32))
    return table if table.null_count() == size - n else None  # fewer rows than values: some repeat


def _classify(s: pl.DataFrame, named: pl.Series) -> pl.DataFrame:
    """Kind, device and stream of every row (`named`: the rows whose args name a collective).

    A row's kind follows from its (category, name) pair, and a trace's 75k rows hold a few hundred
    pairs: the rules run once per pair (`_per_distinct`, on the Categorical `cat` and `name` of
    `Decoded.slices`) and each row looks its pair up. A kernel whose args name a collective is
    communication too: those few rows are changed in place.
    """
    pairs = _per_distinct(s["cat"], s["name"], **_PAIR_RULES)
    kind = pairs.get_column("kind")
    kernels = named.filter(kind.gather(named) == "kernel") if len(named) else named
    if len(kernels):
        kind = kind.scatter(kernels, pl.Series("kind", ["comm"], dtype=Kind).new_from_index(0, len(kernels)))
    return s.hstack([kind, pairs.get_column("_on_device"), pairs.get_column("_host_collective")]).with_columns(
        **_ROW_RULES
    )


_CAT, _NAME = category(pl.col("cat")), pl.col("name")
"""The category as Kineto spells it since PyTorch 1.10 (`Kernel`, `Operator` of the 2021 layout as
`kernel`, `cpu_op`): the pair rules run once per distinct pair, so this costs no per-row work."""
_PAIR_RULES: dict[str, pl.Expr] = {
    # the step's range: a user annotation since 2021, an `Operator` (cpu_op) in the 2021 layout
    "kind": pl.when(_CAT.is_in(["user_annotation", "gpu_user_annotation", "cpu_op"]) & _NAME.str.contains(STEP_MARKER))
    .then(pl.lit("step", dtype=Kind))
    .when((_CAT == "user_annotation") & _NAME.str.starts_with("gloo:"))
    .then(pl.lit("comm", dtype=Kind))
    .when((_CAT == "kernel") & _NAME.str.contains(COMM_KERNEL))
    .then(pl.lit("comm", dtype=Kind))
    .otherwise(_CAT.replace_strict(_KIND_BY_CAT, default="other", return_dtype=Kind)),  # Enum: 1 B/row
    # flags as UInt8 (1: true), not Boolean: every row looks its pair's up, and a gather of bits costs three
    # times one of bytes
    "_on_device": _CAT.is_in(DEVICE_CATS).cast(pl.UInt8),
    "_host_collective": _NAME.str.contains(HOST_COLLECTIVE).cast(pl.UInt8),
}
"""What a (category, name) pair says: the row's kind as far as its args leave it, whether it lies on
a device timeline, and whether it may be a collective's host-side row. Built once: an expression
costs as much to build as to run on a few hundred pairs."""
_ON_DEVICE = pl.col("_on_device") == 1
_ROW_RULES: dict[str, pl.Expr] = {
    "device": pl.when(_ON_DEVICE).then(pl.coalesce("a_device", "pid")).otherwise(-1),
    "stream": pl.when(_ON_DEVICE).then(pl.coalesce("a_stream", "tid")),
    "correlation": pl.col("a_correlation"),
    "external_id": pl.col("a_external_id"),
}
"""Each row's device and stream from its pair's rules and its own args."""


def _per_distinct(*keys: pl.Series, **columns: pl.Expr) -> pl.DataFrame:
    """`columns`, expressions over String columns named as the Categorical `keys`, evaluated once
    per distinct combination of the keys and given to every row: a frame row for row with them.

    Each combination is evaluated as itself (nulls included), so the result equals the expressions
    over the rows. A combination is a number from the category codes, and a row finds its
    combination's result by indexing, not hashing.
    """
    coded = [_codes(key) for key in keys]
    if math.prod(size for _, size in coded) > 8 * len(keys[0]) + 65536:  # too sparse to index: renumber
        coded = [_renumbered(codes) for codes, _ in coded[:-1]] + coded[-1:]
    n_combined = math.prod(size for _, size in coded)
    wide = pl.UInt32 if n_combined < 2**32 else pl.UInt64
    combined = coded[0][0].cast(wide)
    for codes, size in coded[1:]:
        combined = combined * size + codes
    rows = combined.arg_unique()  # a row of each combination
    slot = _nulls("slot", pl.UInt32, n_combined).scatter(
        combined.gather(rows), pl.int_range(len(rows), eager=True, dtype=pl.UInt32)
    )
    # two eager selects: chained in one lazy query, the rules were moved before the gather (onto every row)
    table = pl.DataFrame(keys).select(pl.all().gather(rows).cast(pl.String)).select(**columns)
    return table[slot.gather(combined)]  # a row gather: a third of the cost of a gather per column


def _codes(key: pl.Series) -> tuple[pl.Series, int]:
    """Each row's Categorical code (null as one more code) and the number of codes; codes spread
    far beyond the rows (a long-lived process's many names) renumbered over those present."""
    codes = key.to_physical()
    if codes.null_count():
        codes = codes.fill_null((codes.max() or 0) + 1)
    size = (codes.max() + 1) if len(codes) else 0
    if size > 4 * len(codes) + 4096:
        present = codes.unique()
        return codes.replace_strict(present, pl.int_range(len(present), eager=True, dtype=pl.UInt32)), len(present)
    return codes, size


def _renumbered(codes: pl.Series) -> tuple[pl.Series, int]:
    """`codes` (0..size-1) renumbered 0..n-1 over those present, and n."""
    present = codes.unique()
    number = pl.int_range(len(present), eager=True, dtype=pl.UInt32)
    return _nulls("slot", pl.UInt32, (codes.max() or 0) + 1).scatter(present, number).gather(codes), len(present)


_COLL_ARGS = [
    "a_coll_name",
    "a_in_nelems",
    "a_out_nelems",
    "a_dtype",
    "a_group_size",
    "a_pg_name",
    "a_pg_id",
    "a_seq",
    "a_src_rank",
    "a_dst_rank",
]


def _fill_collectives(ev: pl.DataFrame, dec: Decoded, warnings: list[str], keys: tuple[str, ...] = ()) -> pl.DataFrame:
    """Collective columns, computed on the few rows that can be collectives (comm kind or a
    collective's host-side name); the other rows keep them null. A column with no value at all is
    left out: `conform` adds it as nulls.

    Only the columns the rules read are taken to those rows, their rare args joined in the same
    query, and the results placed by `scatter` and `hstack`: each polars call costs about as much
    as these rows, so the calls are kept few. `keys`: columns telling the files of a batch apart
    (`to_events_small`), joined on too; `warnings` then gets (file, warning) pairs."""
    idx = ev.select(pl.arg_where((pl.col("kind") == "comm") | (pl.col("_host_collective") == 1))).to_series()
    if idx.is_empty():
        return ev
    rows = ev.lazy().select(
        *(pl.col(c).gather(idx) for c in (*_COLL_INPUT, *keys)), name=pl.col("name").gather(idx).cast(pl.String)
    )
    for tier in dec.rare:
        wanted = [f for f in _COLL_EXTRA if f in tier.columns]
        if wanted and tier.height == 0:
            rows = rows.with_columns(pl.lit(None, dtype=tier.schema[f]).alias(f) for f in wanted)
        elif wanted:  # as `Decoded.with_args`: each row's `order` is unique, so a left join keeps the rows
            rows = rows.join(tier.lazy().select("order", *wanted), on="order", how="left", maintain_order="left")
    coll = _collective_columns(rows.collect(engine="in-memory", optimizations=_NO_REWRITES), warnings, keys)
    columns = []
    for c in COLL_COLUMNS:
        values = coll.get_column(c)
        if values.null_count() < coll.height:
            values = values.cast(CollOp) if c == "coll_op" else values  # here, on a few rows, not in `conform`
            columns.append(_nulls(c, values.dtype, ev.height).scatter(idx, values))
    # the args and helper columns stay: `conform` keeps only the table's
    return _op_from_launch(ev.hstack(columns), keys)


def _op_from_launch(ev: pl.DataFrame, keys: tuple[str, ...] = ()) -> pl.DataFrame:
    """Communication kernels whose name says no operation (NCCL's ``ncclKernel_SendRecv_…`` runs the
    peer exchanges of an all_to_all) get the operation of the host collective their launch ran inside
    (``c10d::alltoall_base_`` / ``nccl:all_to_all`` around the ``cudaLaunchKernel`` of the same
    correlation): so they are that collective's instances, matched across ranks."""
    if "coll_op" not in ev.columns:
        return ev
    vague = (pl.col("kind") == "comm") & (pl.col("coll_op") == "other") & pl.col("correlation").is_not_null()
    idx = ev.select(pl.arg_where(vague)).to_series()
    if idx.is_empty():
        return ev
    lf = ev.lazy()
    kernels = ev.select(*keys, "correlation").gather(idx)
    launches = (
        lf.filter(pl.col("kind") == "runtime", pl.col("correlation").is_in(kernels["correlation"].implode()))
        .select(*keys, "correlation", "pid", "tid", "ts")
        .sort("ts")
    )
    named = (
        lf.filter(
            pl.col("kind").is_in(["cpu_op", "annotation"]),
            pl.col("coll_op").is_not_null(),
            pl.col("coll_op") != "other",
        )
        .select(*keys, "pid", "tid", "ts", _end=pl.col("ts") + pl.col("dur"), _op="coll_op")
        .sort("ts")
    )
    found = (
        launches.join_asof(named, on="ts", by=[*keys, "pid", "tid"], strategy="backward", check_sortedness=False)
        .filter(pl.col("ts") <= pl.col("_end"))
        .select(*keys, "correlation", "_op")
        .unique([*keys, "correlation"], keep="first")
    )
    # the operations of the vague rows alone, put in place: a join of every row would copy the frame
    ops = (
        kernels.lazy()
        .join(found, on=[*keys, "correlation"], how="left", maintain_order="left")
        .collect(engine="in-memory")["_op"]
    )
    if ops.null_count() == ops.len():
        return ev
    coll_op = ev.get_column("coll_op")
    return ev.with_columns(coll_op.scatter(idx, ops.fill_null(coll_op.gather(idx))))


def _fill_sequences(ev: pl.DataFrame, dec: Decoded) -> pl.DataFrame:
    """``seq_sq`` on the sequence-input operators (`vocab.SEQUENCE_INPUT_OP`) with recorded shapes: B·S²
    for token ids ``[B, S]`` (their second `Input Dims` entry), decoded on those few rows as one column;
    ids of another rank (packed 1-D tokens) say no lengths and stay null."""
    idx = ev.select(pl.arg_where((pl.col("kind") == "cpu_op") & name_matches(ev, SEQUENCE_INPUT_OP))).to_series()
    if idx.is_empty():
        return ev
    rows = dec.with_args(ev.select(pl.col("order").gather(idx)), "a_input_dims")
    if "a_input_dims" not in rows.columns:
        return ev
    ids = rows["a_input_dims"].cast(pl.String).str.json_decode(pl.List(pl.List(pl.Int64))).list.get(1, null_on_oob=True)
    b, s = ids.list.get(0, null_on_oob=True), ids.list.get(1, null_on_oob=True)
    seq_sq = pl.select(pl.when(ids.list.len() == 2).then(b * s * s)).to_series().alias("seq_sq")
    if not seq_sq.is_not_null().any():
        return ev
    return ev.with_columns(_nulls("seq_sq", pl.Int64, ev.height).scatter(idx, seq_sq))


_COLL_INPUT = ("order", "kind", "external_id", "pid", "tid", "ts", "dur")
"""The columns of a collective's row that `_collective_columns` reads (and `name`)."""
_COLL_EXTRA = (*_COLL_ARGS, "a_input_dims", "a_input_type", "a_concrete_inputs")
"""The rare args `_collective_columns` reads."""


def _nulls(name: str, dtype: pl.DataType, n: int) -> pl.Series:
    """A column of `n` nulls (`pl.repeat(..., eager=True)` costs a query; this a copy of one value)."""
    return pl.Series(name, [None], dtype=dtype).new_from_index(0, n)


COLL_COLUMNS = ("coll_op", "coll_bytes", "coll_group", "coll_group_size", "coll_seq", "coll_peer")


def _collective_columns(ev: pl.DataFrame, warnings: list | None = None, keys: tuple[str, ...] = ()) -> pl.DataFrame:
    """Collective columns from the row's own args, else from its `record_param_comms` CPU op.

    One query (the rows are few: its cost is per operation, not per row), in memory and as
    written: the streaming engine's start, or the optimiser's rewrites, cost more than these rows.
    `coll_op` is found once per distinct text (`_coll_ops`).
    """
    params = (
        ev.lazy()
        .filter((pl.col("name") == "record_param_comms") & pl.col("external_id").is_not_null())
        .select(*keys, "external_id", *_COLL_ARGS)
        .unique([*keys, "external_id"], keep="first")
        .rename({c: f"{c}_op" for c in _COLL_ARGS})
    )
    ev = (
        ev.lazy()
        .with_columns(_link=pl.when(pl.col("kind") == "comm").then(pl.col("external_id")))
        .join(params, left_on=[*keys, "_link"], right_on=[*keys, "external_id"], how="left", maintain_order="left")
        .with_columns(_ARGS_OR_OPS)
        .drop("_link", *(f"{c}_op" for c in _COLL_ARGS))
        .with_columns(coll_op=_coll_ops(ev), **_COLL_RULES, _huge=_HUGE.sum().over(keys) if keys else _HUGE.sum())
        .with_columns(coll_peer=_PEER)
        .with_columns(_gloo=_GLOO_SHAPES, _p2p=_P2P_INPUTS, _peer_wanted=_NEEDS_PEER.any())
        .collect(engine="in-memory", optimizations=_NO_REWRITES)
    )
    huge = ev.filter(pl.col("_huge") > 0).unique(list(keys), keep="first", maintain_order=True) if keys else ev.head(1)
    for *at, n_huge in huge.select(*keys, "_huge").iter_rows():
        if n_huge and warnings is not None:
            text = f"{n_huge:,} collectives with an element count out of range (0..2^58); bytes left unknown"
            warnings.append((*at, text) if keys else text)
    peer_wanted = ev.height and ev["_peer_wanted"][0]
    ev = _from_recorded_shapes(ev)
    if peer_wanted:  # recorded inputs only give peers: the rows that want one are fewer after, never more
        ev = _peer_from_enclosing_op(ev, keys)
    for helper in ("_huge", "_gloo", "_p2p", "_peer_wanted"):
        ev.drop_in_place(helper)
    return ev


def _coll_ops(ev: pl.DataFrame) -> pl.Expr:
    """`vocab.coll_op(_OP_TEXT)` for the rows of `ev`, as a lookup: an op text is a row's
    `a_coll_name` or name (or its op's, among the same rows), and the few distinct ones are
    classified here by the same rule (the first `OP_RULES` text the normalised text contains), not
    by building the rule's automaton in a query for every file."""
    texts = ev.select(pl.col("name").append(pl.col("a_coll_name")).unique().drop_nulls()).to_series().to_list()
    if not texts:
        return pl.lit(None, dtype=pl.String)
    ops = [_coll_op_of(t) for t in texts]
    return _OP_TEXT.replace_strict(texts, ops, default=None, return_dtype=pl.String)


def _coll_op_of(text: str) -> str:
    """`vocab.coll_op` of one text (tests/ingest/test_kineto_lookups.py holds them equal)."""
    norm = _NOT_A_TO_Z.sub("", text.lower())
    return next((op for needle, op in OP_RULES if needle in norm), "other")


_NOT_A_TO_Z = re.compile(r"[^a-z]")
_NO_REWRITES = pl.QueryOptFlags.none()
"""For a query on a few rows: rewriting the plan costs more than running it as written."""
# The expressions of `_collective_columns`, built once (building them costs as much as running them).
_ARGS_OR_OPS = [pl.coalesce(c, f"{c}_op").alias(c) for c in _COLL_ARGS]
"""A row's arg, else (a communication row, linked by `_link`) its `record_param_comms` op's."""
_HOST = pl.col("kind").is_in(["cpu_op", "annotation"]) & _NAME.str.contains(COLLECTIVE_PREFIX)
_OP_TEXT = pl.coalesce(pl.col("a_coll_name"), pl.when((pl.col("kind") == "comm") | _HOST).then(_NAME))
_NELEMS = pl.max_horizontal("a_in_nelems", "a_out_nelems")
_FITS = _NELEMS.is_between(0, MAX_NS // 16)  # elements x element size stays far inside Int64
_COLL_RULES: dict[str, pl.Expr] = {
    "coll_bytes": pl.when(_FITS).then(
        _NELEMS * pl.col("a_dtype").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    ),
    "coll_group": pl.coalesce("a_pg_name", pl.col("a_pg_id").cast(pl.String)),
    "coll_group_size": pl.col("a_group_size"),
    "coll_seq": pl.col("a_seq"),
}
_HUGE = _NELEMS.is_not_null() & ~_FITS
"""A collective whose element count is out of range (its bytes left unknown, counted in a warning)."""
_PEER = (
    pl.when(pl.col("coll_op") == "send")
    .then(pl.col("a_dst_rank"))
    .when(pl.col("coll_op") == "recv")
    .then(pl.col("a_src_rank"))
)
_GLOO_SHAPES = (
    (pl.col("kind") == "comm")
    & pl.col("name").str.starts_with("gloo:")
    & pl.col("coll_bytes").is_null()
    & pl.col("a_input_dims").is_not_null()
)
"""`gloo:*` ops whose bytes come from their recorded input shapes."""
_P2P_INPUTS = (
    pl.col("name").is_in(["c10d::send", "c10d::recv_", "c10d::recv"])
    & pl.col("coll_peer").is_null()
    & pl.col("a_concrete_inputs").is_not_null()
)
"""`c10d::send/recv` ops whose peer comes from their recorded concrete inputs."""
_NEEDS_PEER = (pl.col("kind") == "comm") & pl.col("coll_op").is_in(["send", "recv"]) & pl.col("coll_peer").is_null()
"""Communication rows of a point-to-point op without a peer: `_peer_from_enclosing_op` looks for one."""


def _from_recorded_shapes(ev: pl.DataFrame) -> pl.DataFrame:
    """Bytes of `gloo:*` ops and peers of `c10d::send/recv` from recorded shapes and inputs
    (the rows flagged `_gloo` and `_p2p`).

    These rows are few (one per collective call), so their JSON snippets are parsed one by one.
    """
    if ev["_gloo"].any():
        idx = ev.select(pl.arg_where("_gloo")).to_series()
        rows = ev[idx]
        sizes = [_tensor_bytes(d, t) for d, t in zip(rows["a_input_dims"].to_list(), rows["a_input_type"].to_list())]
        ev = ev.with_columns(coll_bytes=ev["coll_bytes"].scatter(idx, pl.Series(sizes, dtype=pl.Int64)))
    if ev["_p2p"].any():
        idx = ev.select(pl.arg_where("_p2p")).to_series()
        peers = [_p2p_peer(c) for c in ev[idx]["a_concrete_inputs"].to_list()]
        ev = ev.with_columns(coll_peer=ev["coll_peer"].cast(pl.Int64).scatter(idx, pl.Series(peers, dtype=pl.Int64)))
    return ev


def _peer_from_enclosing_op(ev: pl.DataFrame, keys: tuple[str, ...] = ()) -> pl.DataFrame:
    """Give a `gloo:send`/`gloo:recv` the peer of the `c10d::send`/`recv_` op that encloses it."""
    p2p_op = pl.col("coll_op").is_in(["send", "recv"])
    needs = _NEEDS_PEER
    if not ev.select(needs.any()).item():
        return ev
    ops = (
        ev.filter((pl.col("kind") == "cpu_op") & p2p_op & pl.col("coll_peer").is_not_null())
        .select(*keys, "pid", "tid", "ts", op_end=pl.col("ts") + pl.col("dur"), op_peer="coll_peer", op_kind="coll_op")
        .sort("ts")
    )
    ev = ev.with_row_index("_row")
    found = (
        ev.filter(needs)
        .select("_row", *keys, "pid", "tid", "ts", "coll_op")
        .sort("ts")
        .join_asof(ops, on="ts", by=[*keys, "pid", "tid"], strategy="backward", check_sortedness=False)
        .filter((pl.col("ts") <= pl.col("op_end")) & (pl.col("coll_op") == pl.col("op_kind")))
        .select("_row", "op_peer")
    )
    return (
        ev.join(found, on="_row", how="left")
        .with_columns(coll_peer=pl.coalesce("coll_peer", "op_peer"))
        .drop("_row", "op_peer")
    )


def _tensor_bytes(dims_json: bytes | None, types_json: bytes | None) -> int | None:
    """Total bytes of the tensors recorded as `Input Dims` / `Input type` (None if unknown)."""
    try:
        dims, types = orjson.loads(dims_json or b"null"), orjson.loads(types_json or b"null")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    for shape, dtype in zip(dims, types):
        size = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if size is None or not isinstance(shape, list) or not all(isinstance(x, int) for x in shape):
            continue
        n = 1
        for x in shape:
            n *= x
        total += n * size
    return total if 0 < total <= MAX_NS else None


def _p2p_peer(concrete_json: bytes | None) -> int | None:
    """The peer rank of `c10d::send(tensors, pg, dst, tag)` / `c10d::recv_(tensors, pg, src, tag)`."""
    try:
        values = orjson.loads(concrete_json or b"null")
    except orjson.JSONDecodeError:
        return None
    if isinstance(values, list) and len(values) >= 3:
        return _small_int(values[2])
    return None


def _process_groups(info: dict[str, Any]) -> tuple[ProcessGroup, ...]:
    groups = []
    configs = info.get("pg_config")
    for pg in configs if isinstance(configs, list) else []:
        if not isinstance(pg, dict) or pg.get("pg_name") is None:
            continue
        ranks = pg.get("ranks")
        if isinstance(ranks, str):
            ranks = re.findall(r"-?\d{1,10}", ranks)
        ranks = [_small_int(r) for r in ranks] if isinstance(ranks, list) else None
        desc = pg.get("pg_desc") or pg.get("uid")
        groups.append(
            ProcessGroup(
                name=str(pg["pg_name"]),
                desc=None if desc is None else str(desc),
                size=_small_int(pg.get("pg_size")),
                ranks=None if ranks is None or None in ranks else tuple(ranks),
            )
        )
    return tuple(groups)


def _host_name(top: dict[str, Any]) -> str | None:
    """The top-level `host_name` of recent Kineto traces (the profiled host); None when absent or empty."""
    name = top.get("host_name")
    return name if isinstance(name, str) and name.strip() else None


def _device_names(props: Any) -> tuple[str, ...]:
    if not isinstance(props, list):
        return ()
    return tuple(str(p["name"]) for p in props if isinstance(p, dict) and "name" in p)


def to_events_small(
    batch: Batch, paths: list[str], ranks: list[int | None], default_ranks: list[int | None]
) -> dict[int, FileTrace]:
    """`to_events` of each file of a `chrome.decode_small` batch, by batch index (`paths`, `ranks`,
    `default_ranks`: by batch index, as `to_events` takes them), equal to it file by file once in time
    order (each file's events come sorted by `ts`, ties in file order, as `run.load` sorts them): the
    per-file work is done once, as expressions over the batch's columns grouped by `file`.

    A file is left out where `to_events` of it alone raises (a rank or a time base it refuses: read alone,
    it says so), and every file is where `conform` would drop or narrow rows (rare: read alone, each
    counts its own)."""
    warnings: dict[int, list[str]] = {f: [] for f in batch.files}
    infos, rank_of, base_of = {}, {}, {}
    for f, top in zip(batch.files, batch.tops):
        info = top.get("distributedInfo")
        infos[f] = info if isinstance(info, dict) else {}
        file_rank = _int_or_none(infos[f].get("rank"))
        try:
            rank = resolve_rank(
                paths[f],
                given=ranks[f],
                named=() if file_rank is None else (file_rank,),
                source="distributedInfo.rank",
                default=default_ranks[f],
                missing=_no_rank(infos[f]),
                warnings=warnings[f],
            )
            rank_of[f] = _check_world_size(check_rank(rank, paths[f]), infos[f], paths[f], given=ranks[f])
            base = _int_or_none(top.get("baseTimeNanoseconds"))
            base_of[f] = None if base is None else check_base_ns(base, paths[f], "baseTimeNanoseconds")
        except (RankError, TraceError):
            continue
    batch = batch.without(set(batch.files) - set(rank_of))
    if not batch.files:
        return {}
    dec = batch.decoded
    slices, time_bases = _absolute_times_small(dec.slices, base_of, warnings)
    events = _classify(_with_args(dec, slices, "a_device", "a_stream"), _rows_named(dec, slices))
    found: list[tuple[int, str]] = []
    events = _fill_collectives(events, dec, found, keys=("file",))  # type: ignore[arg-type]
    for f, text in found:
        warnings[f].append(text)
    events = _fill_sequences(events, dec)
    for f, n in events.filter(THREADLESS).get_column("file").value_counts().iter_rows():
        warnings[f].append(threadless_warning(n))
    for f, n in events.filter(pl.col("name").is_null()).get_column("file").value_counts().iter_rows():
        warnings[f].append(unnamed_warning(n))
    file = events.get_column("file")
    rank = pl.Series("rank", [rank_of.get(f) for f in range(max(batch.files) + 1)], dtype=pl.Int32).gather(file)
    counted: dict[str, int] = {}
    narrowed: list[str] = []
    events = conform(events.hstack([rank]), skipped=counted, warnings=narrowed)
    if counted or narrowed or not file.is_sorted() or stray_files(events, file):
        return {}
    # each file's rows in time order (ties in file order), as `run.load` orders a file's: one sort, not one a file
    events = events.with_columns(file).sort("file", "ts", maintain_order=True).drop("file")
    out = {}
    start = 0
    counts = dict(file.value_counts().iter_rows())
    for f, top, events_in, skipped in zip(batch.files, batch.tops, batch.events_in, batch.skipped):
        height = counts.get(f, 0)
        info = infos[f]
        meta = FileMeta(
            path=paths[f],
            format="kineto",
            rank=rank_of[f],
            world_size=_small_int(info.get("world_size")),
            backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
            process_groups=_process_groups(info),
            time_base=time_bases[f],
            devices=_device_names(top.get("deviceProperties")),
            host=_host_name(top),
            events_in=events_in,
            skipped=dict(sorted(skipped.items())),
            warnings=tuple(warnings[f]),
        )
        out[f] = FileTrace(events=events.slice(start, height), meta=meta)
        start += height
    return out


def _absolute_times_small(
    slices: pl.DataFrame, base_of: dict[int, int | None], warnings: dict[int, list[str]]
) -> tuple[pl.DataFrame, dict[int, str]]:
    """`_absolute_times` of each file of a batch (`slices` with `file`; `base_of`: each file's
    `baseTimeNanoseconds`, checked), and each file's time base; a relative file's warning goes to `warnings`."""
    time_bases = {f: "epoch" for f, base in base_of.items() if base is not None}
    if time_bases:
        top = max(base_of) + 1
        b = pl.Series([base_of.get(f) for f in range(top)], dtype=pl.Int64).gather(slices.get_column("file"))
        ts = pl.col("ts")
        # `schema.shifted` with a base per row (0 <= base <= MAX_NS: the bounds are in range)
        slices = slices.with_columns(
            ts=pl.when(b.is_null()).then(ts).when(ts.is_between(-MAX_NS - b, MAX_NS - b)).then(ts + b)
        )
    unbased = [f for f, base in base_of.items() if base is None]
    if unbased:
        stats = (
            slices.filter(pl.col("file").is_in(unbased))
            .group_by("file")
            .agg(lo=pl.col("ts").min(), hi=pl.col("ts").max(), median=pl.col("ts").median())
        )
        for f, lo, hi, median in stats.iter_rows():
            if _past_floor(lo, hi, median):
                time_bases[f] = "epoch"
            else:
                warnings[f].append(_RELATIVE)
    for f in unbased:
        time_bases.setdefault(f, "relative")  # a file without slices says nothing
    return slices, time_bases
