"""Op-timeline tables: one row per op (a forward or backward compute, a send, a reduce-scatter, ...)
per micro-batch per rank, in Parquet, CSV or JSON Lines, with many ranks in one file.

What Megatron's timers and production tracers record, as a table (docs/formats/timeline.md). Each
rank's rows become an event table like any trace's: compute ops are device kernels and
communication ops device communication on streams of their own, data loading and host work are
host rows of the training thread, and each step gets a ``ProfilerStep#<step>`` marker spanning its
ops, so the step, breakdown, collective and what-if stages read it as they read a GPU trace.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import polars as pl

from tracediag.errors import TraceError, one_line
from tracediag.ingest.trace import FileMeta, FileTrace, ProcessGroup
from tracediag.schema import MAX_NS, MAX_RANK, STRAY_NS, conform
from tracediag.vocab import INPUT_OP, TIMELINE_COMM, TIMELINE_DATA, coll_op, name_matches

if TYPE_CHECKING:
    from collections.abc import Iterator

HEAD_BYTES = 4096
"""How much of a file's start is read to tell a table from a trace: a CSV header or the first JSON
Lines row must end within it."""

INT_COLUMNS = ("rank", "step", "peer", "microbatch", "dp", "pp", "tp", "cp", "ep", "start_ns", "dur_ns")
FLOAT_COLUMNS = ("start_us", "dur_us")
STRING_COLUMNS = ("name", "kind", "group")
COLUMNS = (*INT_COLUMNS, *FLOAT_COLUMNS, *STRING_COLUMNS)
"""Every column a table may have; any other is ignored with a warning."""
REQUIRED = ("rank", "step", "name")
COORDINATES = ("dp", "pp", "tp", "cp", "ep")
"""The rank's coordinates in the job's parallel layout."""
_TIME_COLUMNS = ("start_ns", "dur_ns", "start_us", "dur_us")

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
P2P_KINDS = ("send", "recv")
KINDS = ("compute", *COLLECTIVE_KINDS, *P2P_KINDS, "data", "host", "other")
"""The values of the `kind` column."""


DEVICE = 0
"""The device index of every rank's compute and communication rows."""
TRAINING_TID = 1
"""The thread id of every host row (step markers, data loading, host work)."""
STREAMS = {"compute": 1, "collective": 2, "send": 3, "recv": 4}
"""Device streams: compute, collectives, sends and receives (ops of one stream run one after another)."""
EPOCH_NS = 10**18
"""Starts at or after this (2001-09-09 in Unix-epoch ns) are taken as epoch times; earlier as relative."""


def table_format(head: bytes) -> str | None:
    """The table's format, "csv" or "jsonl", when the file's first bytes (after any byte-order mark and whitespace) are
    an op-timeline table's header or first row, else None (a trace, or not a table)."""
    line, newline, _ = head.partition(b"\n")
    if not newline and len(head) >= HEAD_BYTES:
        return None  # the first line does not end within the head: not a table's row or header
    text = line.strip()
    if text[:1] == b"{":
        try:
            row = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None  # a pretty-printed or minified Chrome trace
        return "jsonl" if isinstance(row, dict) and is_timeline(row) else None
    try:
        names = [c.strip().strip('"') for c in text.decode("utf-8").split(",")]
    except UnicodeDecodeError:
        return None
    return "csv" if len(names) > 1 and is_timeline(names) else None


def is_timeline(columns: object) -> bool:
    """Whether a table with these column names is an op timeline: it has `rank` and a start or
    duration column (a run saved by `Run.save` has ``ts``/``dur`` instead)."""
    names = set(columns)  # type: ignore[call-overload]
    return "rank" in names and "traceEvents" not in names and any(c in names for c in _TIME_COLUMNS)


def parquet_is_timeline(source: str | bytes) -> bool:
    """Whether a Parquet file (a path or its bytes) holds an op-timeline table."""
    try:
        schema = pl.read_parquet_schema(io.BytesIO(source) if isinstance(source, bytes) else source)
    except Exception:  # damaged: its reader says so
        return False
    return is_timeline(schema)


def read_timeline(
    path: str, source: str | Path | bytes | Iterator[bytes], fmt: str, *, rank: int | None = None
) -> list[FileTrace]:
    """The event tables of the ranks of one op-timeline table, in rank order.

    `source`: the file's path (local and uncompressed), its bytes, or its content as blocks; `fmt`:
    "parquet", "csv" or "jsonl". `rank` (the user's) may relabel a table of one rank. A missing
    column, a column of the wrong type, an unknown `kind`, no rows, a rank out of range or
    coordinates that change within a rank are one `TraceError` naming the file and the column;
    rows without a rank, step, name, start or duration, or with a negative duration, are skipped
    and counted (one warning per column).
    """
    if not isinstance(source, (str, Path, bytes)):
        source = b"".join(source)
    table = _read_table(path, source, fmt)
    warnings: list[str] = []
    extra = [c for c in table.columns if c not in COLUMNS]
    if extra:
        warnings.append(f"column(s) {', '.join(extra)} are not op-timeline columns; ignored")
    table = _typed(path, table.drop(extra))
    if table.height == 0:
        raise TraceError(path, "the op-timeline table has no rows")
    rows_in = table.height
    table, skipped_by_rank, n_unranked = _valid_rows(path, table, warnings)
    if table.height == 0:
        raise TraceError(path, f"none of the op-timeline table's {rows_in:,} rows is usable ({'; '.join(warnings)})")
    ranks = table.get_column("rank").unique().sort().to_list()
    if rank is not None:
        if len(ranks) > 1:
            raise TraceError(path, f"--rank gives one rank to a table of {len(ranks):,} ranks")
        if ranks != [rank]:
            warnings.append(f"the table says rank={ranks[0]}; using rank {rank} as given")
            table = table.with_columns(rank=pl.lit(rank, pl.Int64))
            ranks = [rank]
    groups, coords = _coordinates(path, table)
    events = _events(table)
    rows_of = dict(table.group_by("rank").len().iter_rows())
    epoch = bool(table.select(pl.col("ts").min()).item() >= EPOCH_NS)
    traces = []
    for i, (key, part) in enumerate(sorted(events.partition_by("rank", as_dict=True).items())):
        r = key[0]
        skipped = dict(skipped_by_rank.get(r, {}))
        if i == 0 and n_unranked:  # rows with no rank are counted with the first rank's
            skipped["malformed"] = skipped.get("malformed", 0) + n_unranked
        meta = FileMeta(
            path=path,
            format="timeline",
            rank=r,
            process_groups=groups,
            time_base="epoch" if epoch else "relative",
            events_in=rows_of[r] + sum(skipped.values()),
            skipped=skipped,
            warnings=tuple(warnings) if i == 0 else (),
            coords=coords.get(r, {}),
        )
        traces.append(FileTrace(events=part, meta=meta))
    return traces


def _read_table(path: str, source: str | Path | bytes, fmt: str) -> pl.DataFrame:
    """The table as its file types it (CSV: the known columns as their documented types)."""
    src = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        if fmt == "parquet":
            return pl.read_parquet(src)
        if fmt == "jsonl":
            return pl.read_ndjson(_without_bom(source, src), infer_schema_length=None)
        header = _csv_header(source)
        dtypes = {c: pl.Int64 for c in INT_COLUMNS} | {c: pl.Float64 for c in FLOAT_COLUMNS}
        dtypes |= {c: pl.String for c in STRING_COLUMNS}
        return pl.read_csv(src, schema_overrides={c: t for c, t in dtypes.items() if c in header})
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
        raise TraceError(path, f"cannot read the {_FORMAT_NAMES[fmt]} op-timeline table ({_why(e)})") from None
    except OSError as e:
        raise TraceError(path, f"cannot read file ({e.strerror or e})") from None


_FORMAT_NAMES = {"parquet": "Parquet", "csv": "CSV", "jsonl": "JSON Lines"}


def _why(e: Exception) -> str:
    """A library error's first line, without its hints."""
    return one_line(str(e).split("\n\n")[0])[:300]


def _without_bom(source: str | Path | bytes, src: str | Path | io.BytesIO) -> str | Path | io.BytesIO:
    """`src`, past a UTF-8 byte-order mark: the JSON Lines reader of polars fails on one ("TapeError"), which its
    CSV reader and the JSON trace readers skip."""
    if isinstance(source, bytes):
        return io.BytesIO(source[3:]) if source.startswith(_BOM) else src
    with Path(source).open("rb") as f:
        if f.read(3) != _BOM:
            return src
        return io.BytesIO(f.read())


_BOM = b"\xef\xbb\xbf"


def _csv_header(source: str | Path | bytes) -> list[str]:
    if isinstance(source, bytes):
        first = source[:HEAD_BYTES]
    else:
        with Path(source).open("rb") as f:
            first = f.read(HEAD_BYTES)
    line = first.lstrip(b"\xef\xbb\xbf \t\r\n").partition(b"\n")[0]
    return [c.strip().strip('"') for c in line.decode("utf-8", errors="replace").split(",")]


def _typed(path: str, table: pl.DataFrame) -> pl.DataFrame:
    """The table with every column of its documented type: integers as Int64, `start_us`/`dur_us`
    as Float64, strings as String (an integer `group` id as its text); one `TraceError` naming the
    first column that is missing or of another type."""
    missing = [c for c in REQUIRED if c not in table.columns]
    has_ns = [c in table.columns for c in ("start_ns", "dur_ns")]
    has_us = [c in table.columns for c in ("start_us", "dur_us")]
    if not all(has_ns) and not all(has_us):
        want = ("start_ns", "dur_ns") if any(has_ns) or not any(has_us) else ("start_us", "dur_us")
        missing += [c for c in want if c not in table.columns]
    if missing:
        raise TraceError(
            path, f"the op-timeline table has no column {', '.join(missing)} (needs rank, step, name, start_ns, dur_ns)"
        )
    if all(has_ns):
        table = table.drop([c for c in ("start_us", "dur_us") if c in table.columns])
    else:
        table = table.drop([c for c in ("start_ns", "dur_ns") if c in table.columns])
    casts = []
    for col, dtype in table.schema.items():
        ok = dtype == pl.Null or (
            dtype.is_integer()
            if col in INT_COLUMNS
            else dtype.is_numeric()
            if col in FLOAT_COLUMNS
            else dtype in (pl.String, pl.Categorical) or (col == "group" and dtype.is_integer())
        )
        if not ok:
            want = "integers" if col in INT_COLUMNS else "numbers" if col in FLOAT_COLUMNS else "text"
            raise TraceError(path, f"column {col} holds {dtype}, not {want}")
        target = pl.Int64 if col in INT_COLUMNS else pl.Float64 if col in FLOAT_COLUMNS else pl.String
        casts.append(pl.col(col).cast(target, strict=False))  # UInt64 beyond Int64: null, then counted
    return table.select(casts)


def _valid_rows(
    path: str, table: pl.DataFrame, warnings: list[str]
) -> tuple[pl.DataFrame, dict[int, dict[str, int]], int]:
    """The usable rows with ``ts``/``dur`` in ns; skips counted per rank (and those with no rank);
    one warning per reason. An unknown `kind`, a rank beyond Int32, is a `TraceError`."""
    if "start_ns" in table.columns:
        ts, dur = pl.col("start_ns"), pl.col("dur_ns")
    else:
        ts, dur = (pl.col(c) * 1000 for c in ("start_us", "dur_us"))
        ts = pl.when(ts.is_finite() & ts.abs().le(MAX_NS)).then(ts.round().cast(pl.Int64))
        dur = pl.when(dur.is_finite() & dur.abs().le(MAX_NS)).then(dur.round().cast(pl.Int64))
    table = table.with_columns(ts=ts, dur=dur).drop(_TIME_COLUMNS, strict=False)
    if "kind" in table.columns:
        unknown = table.filter(~pl.col("kind").is_in(KINDS) & pl.col("kind").is_not_null())
        if unknown.height:
            seen = unknown.get_column("kind").unique(maintain_order=True).head(3).to_list()
            raise TraceError(
                path,
                f"column kind: {unknown.height:,} row(s) of unknown kind ({', '.join(map(repr, seen))}); "
                f"kinds are {', '.join(KINDS)}",
            )
    big = table.filter(pl.col("rank") > MAX_RANK)
    if big.height:
        raise TraceError(path, f"column rank: rank {big['rank'][0]} is out of range (0..{MAX_RANK:,})")
    tests = {
        "no rank": pl.col("rank").is_null(),
        "a negative rank": pl.col("rank") < 0,
        "no step": pl.col("step").is_null(),
        "a step outside 0..2^31-1": ~pl.col("step").is_between(0, 2**31 - 1),
        "no name": pl.col("name").is_null(),
        "no start or one out of range": pl.col("ts").is_null() | ~pl.col("ts").is_between(-MAX_NS, MAX_NS),
        "no duration or one out of range": pl.col("dur").is_null() | (pl.col("dur") > MAX_NS),
        "a negative duration": pl.col("dur") < 0,
    }
    lo, hi = table.select(lo=pl.col("ts").min(), hi=(pl.col("ts") + pl.col("dur")).max()).row(0)
    if lo is not None and hi is not None and hi - lo > STRAY_NS:  # ranks may be on clocks of their own
        median = pl.col("ts").median().over("rank")
        far = ((pl.col("ts") - median).abs() > STRAY_NS) | (pl.col("ts") + pl.col("dur") - median > STRAY_NS)
        tests["a start or end more than a day from its rank's other rows"] = far
    if "peer" in table.columns:
        tests["a peer outside 0..2^31-1"] = ~pl.col("peer").is_between(0, MAX_RANK)
    flags = table.select(**{why: test.fill_null(False) for why, test in tests.items()})
    bad = flags.select(pl.any_horizontal(pl.all()).alias("bad")).get_column("bad")
    for why, n in flags.sum().row(0, named=True).items():
        if n:
            warnings.append(f"{n:,} row(s) with {why} skipped")
    if not bad.any():
        return table, {}, 0
    dropped = table.filter(bad)
    n_unranked = dropped.filter(pl.col("rank").is_null() | (pl.col("rank") < 0)).height
    by_rank = {r: {"malformed": n} for r, n in dropped.filter(pl.col("rank") >= 0).group_by("rank").len().iter_rows()}
    return table.filter(~bad), by_rank, n_unranked


def _coordinates(path: str, table: pl.DataFrame) -> tuple[tuple[ProcessGroup, ...], dict[int, dict[str, int]]]:
    """Each rank's coordinates (`dp`, `pp`, ...) and the process groups they imply: for each
    coordinate, the ranks that agree on all the others form one group (``pp:0`` is the pipeline of
    the ranks that differ only in their stage), groups of one rank left out."""
    dims = [d for d in COORDINATES if d in table.columns]
    if not dims:
        return (), {}
    per_rank = table.group_by("rank").agg(*[pl.col(d).drop_nulls().unique().alias(d) for d in dims]).sort("rank")
    for d in dims:
        several = per_rank.filter(pl.col(d).list.len() > 1)
        if several.height:
            r = several["rank"][0]
            raise TraceError(path, f"column {d}: rank {r} has several values ({several[d][0].to_list()[:3]})")
    per_rank = per_rank.with_columns(pl.col(d).list.first() for d in dims)
    coords = {row["rank"]: {d: row[d] for d in dims if row[d] is not None} for row in per_rank.iter_rows(named=True)}
    groups = []
    for d in dims:
        others = [o for o in dims if o != d]
        members = per_rank.filter(pl.col(d).is_not_null(), *[pl.col(o).is_not_null() for o in others])
        by = (
            members.group_by(others or pl.lit(0))
            .agg(pl.col("rank").sort_by(d))
            .with_columns(first=pl.col("rank").list.min())
            .sort("first")
        )
        ranks = [tuple(r) for r in by.get_column("rank").to_list() if len(r) > 1]
        for i, rs in enumerate(ranks):
            groups.append(
                ProcessGroup(name=f"{d}:{i}", desc=f"{d} group (the table's rank coordinates)", size=len(rs), ranks=rs)
            )
    return tuple(groups), coords


def _events(table: pl.DataFrame) -> pl.DataFrame:
    """All ranks' event tables in one frame (`schema.EVENT_SCHEMA`, step markers added)."""
    names = table.get_column("name").unique()
    comm_name = name_matches(names, TIMELINE_COMM)
    data_name = name_matches(names, TIMELINE_DATA) | name_matches(names, INPUT_OP)
    kind = pl.col("kind") if "kind" in table.columns else pl.lit(None, pl.String)
    comm = (COLLECTIVE_KINDS, P2P_KINDS)
    cat = (
        pl.when(kind.is_in(["compute", "data", "host", "other"]))
        .then(kind)
        .when(kind.is_in([*comm[0], *comm[1]]))
        .then(pl.lit("comm"))
        .when(comm_name)
        .then(pl.lit("comm"))
        .when(data_name)
        .then(pl.lit("data"))
        .otherwise(pl.lit("compute"))
    )
    op = pl.when(kind.is_in([*comm[0], *comm[1]])).then(kind).otherwise(coll_op(pl.col("name")))
    t = table.with_columns(_cat=cat).with_columns(_op=pl.when(pl.col("_cat") == "comm").then(op))
    on_device = pl.col("_cat").is_in(["compute", "comm"])
    stream = (
        pl.when(pl.col("_cat") == "compute")
        .then(STREAMS["compute"])
        .when(pl.col("_op") == "send")
        .then(STREAMS["send"])
        .when(pl.col("_op") == "recv")
        .then(STREAMS["recv"])
        .when(pl.col("_cat") == "comm")
        .then(STREAMS["collective"])
    )
    name = pl.col("name")
    renamed = name_matches(names, INPUT_OP)
    t = t.with_columns(
        device=pl.when(on_device).then(DEVICE).otherwise(-1),
        stream=stream,
        pid=pl.when(on_device).then(DEVICE).otherwise(pl.col("rank")),
        tid=pl.when(on_device).then(stream).otherwise(TRAINING_TID),
        kind=pl.col("_cat").replace_strict(
            {"compute": "kernel", "comm": "comm", "data": "cpu_op", "host": "cpu_op", "other": "other"}
        ),
        name=pl.when((pl.col("_cat") == "data") & ~renamed).then(pl.lit("DataLoader#") + name).otherwise(name),
        coll_op=pl.col("_op"),
    )
    if "peer" in t.columns:
        t = t.with_columns(coll_peer=pl.when(pl.col("_op").is_in(P2P_KINDS)).then(pl.col("peer")))
    t = _lanes(t)
    if "group" in t.columns:
        t = _collective_ids(t)
    # a step's marker ends at its last op's end or the next step's first op's start, whichever comes first:
    # ops of a step that run on into the next (a gradient all-reduce) would make markers overlap, which
    # `derive.steps.find_markers` cuts and warns of; the table's own steps are no such damage
    markers = (
        t.group_by("rank", "step")
        .agg(ts=pl.col("ts").min(), _end=(pl.col("ts") + pl.col("dur")).max())
        .sort("rank", "ts", "step")
        .with_columns(_end=pl.min_horizontal("_end", pl.col("ts").shift(-1).over("rank").fill_null(pl.col("_end"))))
        .with_columns(dur=pl.col("_end") - pl.col("ts"))
        .drop("_end")
    )
    markers = markers.with_columns(
        name=pl.lit("ProfilerStep#") + pl.col("step").cast(pl.String),
        kind=pl.lit("step"),
        device=pl.lit(-1),
        pid=pl.col("rank"),
        tid=pl.lit(TRAINING_TID),
    )
    keep = ["rank", "pid", "tid", "device", "stream", "kind", "name", "ts", "dur", "coll_op"]
    keep += [c for c in ("coll_group", "coll_group_size", "coll_seq", "coll_peer") if c in t.columns]
    events = pl.concat([markers.drop("step"), t.select(keep)], how="diagonal_relaxed")
    return conform(events.sort("rank", "ts", maintain_order=True))


def _collective_ids(t: pl.DataFrame) -> pl.DataFrame:
    """`coll_group`, its size (the ranks in the file that use it) and `coll_seq` for collectives with
    a `group`: the instance is the k-th occurrence per (group, step, name), numbered the same on
    every rank."""
    coll = pl.col("group").is_not_null() & pl.col("_op").is_not_null() & ~pl.col("_op").is_in(P2P_KINDS)
    t = t.with_row_index("_row")
    c = t.filter(coll).sort("ts").with_columns(_k=pl.int_range(pl.len()).over("rank", "group", "step", "name"))
    keys = c.select("step", "name", "_k").unique().sort("step", "name", "_k").with_row_index("coll_seq")
    sizes = c.group_by("group").agg(coll_group_size=pl.col("rank").n_unique())
    c = (
        c.join(keys, on=["step", "name", "_k"])
        .join(sizes, on="group")
        .select(
            "_row", coll_group="group", coll_group_size="coll_group_size", coll_seq=pl.col("coll_seq").cast(pl.Int64)
        )
    )
    return t.join(c, on="_row", how="left").sort("_row").drop("_row")


def _lanes(t: pl.DataFrame) -> pl.DataFrame:
    """Device rows that overlap others of their stream (two all-reduce buckets in flight) moved to
    streams of their own: a row's lane is how many rows of its stream are in flight when it starts,
    and its stream ``base + len(STREAMS) * lane`` (ops of one stream run one after another)."""
    dev = t.lazy().with_row_index("_row").filter(pl.col("stream").is_not_null())
    end = pl.col("ts") + pl.col("dur")
    # at one instant: ends, then zero-length rows (start, end), then starts
    points = pl.concat(
        [
            dev.select(
                "rank", "stream", "_row", _t="ts", _d=pl.lit(1), _o=pl.when(pl.col("dur") == 0).then(1).otherwise(3)
            ),
            dev.select(
                "rank",
                "stream",
                pl.lit(None, pl.UInt32).alias("_row"),
                _t=end,
                _d=pl.lit(-1),
                _o=pl.when(pl.col("dur") == 0).then(2).otherwise(0),
            ),
        ]
    )
    lanes = (
        points.sort("rank", "stream", "_t", "_o")
        # each stream's points sum to 0, so one running sum over all of them is each stream's own
        .with_columns(_lane=(pl.col("_d").cum_sum() - 1).clip(lower_bound=0))
        .filter(pl.col("_row").is_not_null())
        .select("_row", "_lane")
        .collect()
    )
    if not lanes.height or lanes.get_column("_lane").max() == 0:
        return t
    lane = pl.repeat(0, t.height, dtype=pl.Int64, eager=True).scatter(lanes["_row"], lanes["_lane"])
    stream = pl.col("stream") + len(STREAMS) * lane
    return t.with_columns(stream=stream, tid=pl.when(pl.col("stream").is_not_null()).then(stream).otherwise("tid"))
