"""Read Nsight Systems SQLite exports (`nsys export --type sqlite`) into the event table.

The export's schema changes between releases and lazy exports omit empty tables, so every table and
column is discovered with `sqlite_master` / `PRAGMA table_info`; a missing event table is read as
empty. Rows are fetched as raw integers and shaped in polars (ids -> names through `StringIds`,
`globalPid`/`globalTid` -> pid/tid, session-relative -> epoch ns). See docs/formats/nsys.md.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
import shutil
import sqlite3
import subprocess
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracediag.errors import NotATraceError, TraceError
from tracediag.ingest.sniff import is_stream, open_input
from tracediag.ingest.trace import FileMeta, FileTrace
from tracediag.schema import MAX_NS, check_base_ns, check_rank, conform, drop_strays, shifted
from tracediag.units import count
from tracediag.vocab import COMM_KERNEL, STEP_MARKER, coll_op, resolve_rank

if TYPE_CHECKING:
    from collections.abc import Iterator

_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"
_REP_SUFFIXES = (".nsys-rep", ".qdrep")

_RANK_KEYS = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK")
_SIZE_KEYS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE")
"""Environment variables naming the rank / world size, in order of preference."""

_MEMCPY_NAMES = {
    1: "Memcpy HtoD",
    2: "Memcpy DtoH",
    3: "Memcpy HtoA",
    4: "Memcpy AtoH",
    5: "Memcpy AtoA",
    6: "Memcpy AtoD",
    7: "Memcpy DtoA",
    8: "Memcpy DtoD",
    9: "Memcpy HtoH",
    10: "Memcpy PtoP",
    11: "Memcpy HtoD (unified)",
    12: "Memcpy DtoH (unified)",
    13: "Memcpy DtoD (unified)",
}
"""`copyKind` (ENUM_CUDA_MEMCPY_OPER, CUPTI's CUpti_ActivityMemcpyKind) -> row name."""

_SYNC_NAMES = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
"""`syncType` (ENUM_CUPTI_SYNC_TYPE) -> row name, as Kineto names its cuda_sync events."""

_BATCH_ROWS = 65_536
"""Rows fetched from SQLite per batch: bounds the transient Python objects of a large table."""

_NVTX_RANGES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange
_NVTX_MARK = 34
_NVTX_METADATA = (33, 39, 75, 76)  # category, thread name, domain create, domain destroy


@dataclass(frozen=True, slots=True)
class _Table:
    """A consumed event table: the columns the reader needs and those it can do without."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()


_KERNEL = _Table(
    "CUPTI_ACTIVITY_KIND_KERNEL",
    ("start", "end", "deviceId", "streamId", "shortName"),
    ("demangledName", "correlationId", "globalPid"),
)
_MEMCPY = _Table(
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    ("start", "end", "deviceId", "streamId"),
    ("copyKind", "correlationId", "globalPid"),
)
_MEMSET = _Table("CUPTI_ACTIVITY_KIND_MEMSET", ("start", "end", "deviceId", "streamId"), ("correlationId", "globalPid"))
_SYNC = _Table(
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
    ("start", "end", "deviceId", "streamId"),
    ("syncType", "correlationId", "globalPid"),
)
_RUNTIME = _Table("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "end", "nameId"), ("correlationId", "globalTid"))
_NVTX = _Table("NVTX_EVENTS", ("start", "end", "eventType"), ("text", "textId", "globalTid"))


def read_nsys(path: str | Path, *, rank: int | None = None, default_rank: int | None = None) -> FileTrace:
    """Read one Nsight Systems export (`.sqlite`, `.sqlite.gz` or `.nsys-rep`) into the event table.

    Parameters
    ----------
    path
        The export. A `.nsys-rep` is first exported to SQLite with `export_nsys_rep`.
    rank
        The file's global rank when the caller resolved it (filename regex, explicit mapping).
        When None it comes from the profiled process's environment strings in the file
        (`RANK`, `OMPI_COMM_WORLD_RANK`, `SLURM_PROCID`, `PMI_RANK`).
    default_rank
        Used, with a warning, only when neither `rank` nor the file names one (a single-file run).

    Raises
    ------
    TraceError
        The file is not a readable Nsight Systems SQLite export.
    RankError
        `rank` is None and the file names no rank, or several.
    """
    path = Path(path)
    source = export_nsys_rep(path) if path.name.endswith(_REP_SUFFIXES) else path
    with _connect(source, shown=path) as con:
        try:
            return _read(con, path, rank, default_rank)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # damaged pages can yield invalid text
            raise TraceError(str(path), f"corrupt SQLite file ({e})") from e


def export_nsys_rep(path: str | Path) -> Path:
    """Export a `.nsys-rep` report to `<name>.sqlite` beside it, reusing a newer existing export.

    Raises `TraceError` with the command to run when `nsys` is not on PATH or the export fails.
    """
    path = Path(path)
    stem = path.name.removesuffix(".nsys-rep").removesuffix(".qdrep")
    out = path.with_name(f"{stem}.sqlite")
    if out.exists() and out.stat().st_mtime >= path.stat().st_mtime:
        return out
    command = f"nsys export --type sqlite -o {out} {path}"
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceError(str(path), f"nsys is not on PATH; export it with: {command}")
    args = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(path)]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit status {done.returncode}"]
        raise TraceError(str(path), f"`{command}` failed: {lines[-1]}")
    return out


@contextmanager
def _connect(path: Path, *, shown: Path) -> Iterator[sqlite3.Connection]:
    """Open `path` read-only, decompressing a gzip file to a temporary copy first."""
    if is_stream(path):
        raise TraceError(str(shown), "an SQLite export must be a regular file (not a pipe): save it first")
    with open_input(path) as f:
        try:
            head = f.read(100)
        except OSError as e:
            raise TraceError(str(shown), f"cannot read file ({e.strerror or e})") from None
    with tempfile.TemporaryDirectory(prefix="tracediag-nsys-") as tmp:
        if head.startswith(_GZIP_MAGIC):
            plain = Path(tmp) / "export.sqlite"
            _gunzip(path, plain, shown=shown)
            with plain.open("rb") as f:
                head = f.read(100)
            path = plain
        else:
            _check_wal(path, head, shown=shown)
        _check_header(path, head, shown=shown)
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        # names are untrusted bytes: a damaged string must not stop the read
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            yield con
        finally:
            con.close()


def _check_wal(path: Path, head: bytes, *, shown: Path) -> None:
    """Refuse an export in WAL mode whose write-ahead log beside it holds changes: the file is read as it is
    (`immutable`, no lock), so those changes would be missing without a word."""
    wal = Path(f"{path}-wal")
    if head[18:19] == b"\x02" and wal.is_file() and wal.stat().st_size > 0:
        problem = (
            f"its write-ahead log {wal.name} ({wal.stat().st_size:,} bytes) is not merged into it (a writer has it"
            f" open, or died): run sqlite3 {path.name} 'PRAGMA wal_checkpoint' and read it again"
        )
        raise TraceError(str(shown), problem)


GUNZIP_RATIO = 100
"""A gzipped export may grow at most this many times its compressed size (real exports: 10-40x)."""
GUNZIP_FLOOR = 256 << 20
GUNZIP_SPARE = 1 << 30
"""Room left free on the temporary folder's disk."""


def gunzip_limit(src: Path, tmp: Path) -> int:
    """How many bytes the decompressed copy of `src` may have: `GUNZIP_RATIO` times the compressed
    size (at least `GUNZIP_FLOOR`), and never more than the temporary folder's free space less
    `GUNZIP_SPARE` (so a decompression bomb fills neither the disk nor the time)."""
    free = shutil.disk_usage(tmp).free - GUNZIP_SPARE
    return max(0, min(max(GUNZIP_RATIO * src.stat().st_size, GUNZIP_FLOOR), free))


def _gunzip(src: Path, dst: Path, *, shown: Path) -> None:
    limit = gunzip_limit(src, dst.parent)
    written = 0
    try:
        with gzip.open(src, "rb") as fin, dst.open("wb") as fout:
            while block := fin.read(1 << 20):
                written += len(block)
                if written > limit:
                    raise TraceError(
                        str(shown),
                        f"gzip data expands past {limit / 1e6:,.0f} MB ({GUNZIP_RATIO}x the file, capped by "
                        "the free space of the temporary folder); decompress it yourself if it is genuine",
                    )
                fout.write(block)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; EOFError: cut short
        raise TraceError(str(shown), f"corrupt gzip data ({e})") from None


def _check_header(path: Path, head: bytes, *, shown: Path) -> None:
    """Refuse empty, non-SQLite and truncated files before SQLite reads garbage."""
    if not head:
        raise TraceError(str(shown), "empty file")
    if not head.startswith(_SQLITE_MAGIC):
        raise TraceError(str(shown), "not a trace: content is not SQLite (Nsight Systems: `nsys export --type sqlite`)")
    if len(head) < 100:
        raise TraceError(str(shown), "truncated SQLite file (header cut short)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    header_size_valid = head[24:28] == head[92:96]  # "in-header database size" is trusted only then
    expected, actual = page_size * pages, path.stat().st_size
    if header_size_valid and pages and actual < expected:
        raise TraceError(str(shown), f"truncated SQLite file ({actual} of {expected} bytes)")


def _string_ids(con: sqlite3.Connection, path: Path) -> pl.DataFrame:
    """`StringIds` (id -> value). An id held twice (a damaged export: it is the primary key) is a
    `TraceError`: which name its rows carry would be a guess. A null id names no row (none is dropped)."""
    _require(con, "StringIds", ("id", "value"), path)
    strings = _query(con, "SELECT id, value FROM StringIds", {"id": pl.Int64(), "value": pl.String()}, path)
    strings = strings.filter(pl.col("id").is_not_null())
    twice = strings.filter(pl.col("id").is_duplicated())
    if twice.height:
        n = twice["id"].n_unique()
        problem = f"StringIds holds {count(n, 'id')} more than once (id {twice['id'][0]}): a damaged export"
        raise TraceError(str(path), problem)
    return strings


def _read(con: sqlite3.Connection, path: Path, rank: int | None, default_rank: int | None) -> FileTrace:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    if "StringIds" not in tables:
        raise NotATraceError(str(path), "not a trace: SQLite without the Nsight Systems StringIds table")
    strings = _string_ids(con, path)

    warnings: list[str] = []
    rank = check_rank(_resolve_rank(strings, rank, default_rank, path, warnings), str(path))
    sizes = _env_values(strings, _SIZE_KEYS)
    world_size = sizes[1][0] if sizes is not None and len(sizes[1]) == 1 else None

    epoch = _session_start(con, tables, path)
    if epoch is not None:
        check_base_ns(epoch, str(path), "TARGET_INFO_SESSION_START_TIME")
    if epoch is None:
        warnings.append("no TARGET_INFO_SESSION_START_TIME: times are relative to the session start")

    parts, events_in, skipped = [], 0, {}
    readers = (
        (_KERNEL, _kernels),
        (_MEMCPY, _memcpy),
        (_MEMSET, _memset),
        (_SYNC, _sync),
        (_RUNTIME, _runtime),
        (_NVTX, _nvtx),
    )
    for table, shape in readers:
        raw = _fetch(con, tables, table, path, warnings)
        events_in += raw.height
        warnings.extend(_unnamed(raw, strings, table) + _nameless_ranges(raw, table, warnings))
        rows, skips = shape(raw, strings)
        parts.append(rows)
        for reason, n in skips.items():
            if n:
                skipped[reason] = skipped.get(reason, 0) + n

    events = pl.concat(parts, how="diagonal_relaxed")
    events = events.with_columns(
        rank=pl.lit(rank, pl.Int32), ts=shifted("start", epoch or 0), dur=pl.col("end") - pl.col("start")
    )
    has_comm = (events["kind"] == "comm").any()
    meta = FileMeta(
        path=str(path),
        format="nsys",
        rank=rank,
        world_size=world_size,
        backend="nccl" if has_comm else None,
        time_base="epoch" if epoch is not None else "relative",
        devices=_devices(con, tables),
        host=_hostname(con, tables),
        events_in=events_in,
        skipped=skipped,
        warnings=tuple(warnings),
    )
    events = drop_strays(conform(events, skipped=skipped, warnings=warnings), skipped=skipped, warnings=warnings)
    meta = dataclasses.replace(meta, skipped=dict(sorted(skipped.items())), warnings=tuple(warnings))
    return FileTrace(events=events, meta=meta)


def _query(con: sqlite3.Connection, sql: str, schema: dict[str, pl.DataType], path: Path) -> pl.DataFrame:
    """Run `sql` into a frame, in batches so the Python row tuples never all exist at once."""
    cursor = con.execute(sql)
    try:
        parts = [
            pl.DataFrame(batch, schema=schema, orient="row")
            for batch in iter(lambda: cursor.fetchmany(_BATCH_ROWS), [])
        ]
    except (TypeError, pl.exceptions.PolarsError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        table = re.search(r'FROM "?(\w+)', sql)
        value = re.search(r"could not append value: (.{1,60}?) of type: (\w+)", first)
        if table and value:  # polars' builder wording names neither the table nor what was expected
            first = f"{table[1]} holds {value[1]} ({value[2]}) where a number goes"
        raise TraceError(str(path), f"unexpected value type in the export ({first})") from None
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


_NO_NVTX_NAMES = "NVTX_EVENTS has neither a text nor a textId column: its ranges (step markers) read unnamed"


def _fetch(con: sqlite3.Connection, tables: set[str], table: _Table, path: Path, warnings: list[str]) -> pl.DataFrame:
    """The table's needed columns (absent optional ones as nulls, with a warning where that leaves its rows
    unnamed: NVTX_EVENTS without `text` and `textId`); an absent table reads as empty."""
    cols = table.required + table.optional
    schema = {c: (pl.String() if c == "text" else pl.Int64()) for c in cols}
    if table.name not in tables:
        return pl.DataFrame(schema=schema)
    present = _require(con, table.name, table.required, path)
    if table.name == _NVTX.name and not {"text", "textId"} & present:
        warnings.append(_NO_NVTX_NAMES)
    select = ", ".join(f'"{c}"' if c in present else f'NULL AS "{c}"' for c in cols)
    raw = _query(con, f'SELECT {select} FROM "{table.name}"', schema, path)
    absent = [c for c in table.optional if c not in present and c not in ("text", "textId")]
    if absent and raw.height:  # every release read so far writes them: another release's schema
        warnings.append(
            f"{table.name} lacks column(s) {', '.join(absent)} (an export schema of another release): "
            f"left unknown in its {count(raw.height, 'row')}"
        )
    return raw


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f'PRAGMA table_info("{table}")')}


def _require(con: sqlite3.Connection, table: str, required: tuple[str, ...], path: Path) -> set[str]:
    """The columns of `table`; a `TraceError` naming those of `required` it lacks (another release's
    schema: read on, the query would fail as if the file were corrupt)."""
    present = _columns(con, table)
    missing = [c for c in required if c not in present]
    if missing:
        problem = f"{table} lacks column(s) {', '.join(missing)}: unknown export schema"
        raise TraceError(str(path), problem)
    return present


def _env_values(strings: pl.DataFrame, keys: tuple[str, ...]) -> tuple[str, tuple[int, ...]] | None:
    """The first of `keys` found as a `KEY=N` environment string in `StringIds`, and its values."""
    pattern = rf"^({'|'.join(keys)})=(\d+)$"
    found = strings.select(
        key=pl.col("value").str.extract(pattern, 1),
        value=pl.col("value").str.extract(pattern, 2).cast(pl.Int64, strict=False),
    ).drop_nulls()
    for key in keys:
        values = found.filter(pl.col("key") == key)["value"].unique().sort()
        if values.len():
            return key, tuple(values)
    return None


def _resolve_rank(
    strings: pl.DataFrame, given: int | None, default: int | None, path: Path, warnings: list[str]
) -> int:
    """The rank from the profiled process's environment strings (`vocab.resolve_rank`)."""
    found = _env_values(strings, _RANK_KEYS)
    return resolve_rank(
        str(path),
        given=given,
        named=() if found is None else found[1],
        source="RANK" if found is None else found[0],
        default=default,
        missing=f"no {', '.join(_RANK_KEYS[:-1])} or {_RANK_KEYS[-1]} environment string",
        warnings=warnings,
    )


_NAME_IDS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "shortName",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "nameId",
    "NVTX_EVENTS": "textId",
}
"""The column of each table whose `StringIds` id names its rows (NVTX: where `text` is null)."""


def _unnamed(raw: pl.DataFrame, strings: pl.DataFrame, table: _Table) -> list[str]:
    """A warning counting the rows of `table` whose name id `StringIds` lacks (a damaged or mixed export):
    they are read unnamed, so a communication kernel among them would pass for compute."""
    col = _NAME_IDS.get(table.name)
    if col is None or not raw.height:
        return []
    named_by_id = pl.col(col).is_not_null() & (pl.col("text").is_null() if "text" in raw.columns else pl.lit(True))
    lacking = raw.filter(named_by_id & ~pl.col(col).is_in(strings["id"].implode()))
    if not lacking.height:
        return []
    return [
        f"{lacking.height} rows of {table.name} name a string id StringIds lacks ({col} {lacking[col][0]}): "
        "read unnamed"
    ]


def _nameless_ranges(raw: pl.DataFrame, table: _Table, warnings: list[str]) -> list[str]:
    """A warning counting the NVTX ranges whose `text` and `textId` are both null (a damaged export): read
    unnamed, a step marker among them would be lost unsaid (the table without both columns says so already)."""
    if table.name != _NVTX.name or _NO_NVTX_NAMES in warnings:
        return []
    no_name = pl.col("text").is_null() & pl.col("textId").is_null()
    nameless = raw.filter(pl.col("eventType").is_in(_NVTX_RANGES) & no_name)
    n = _well_formed(nameless)[0].height  # a malformed one is counted as such
    if not n:
        return []
    verb = "has" if n == 1 else "have"
    return [f"{count(n, 'NVTX range')} of NVTX_EVENTS {verb} neither a text nor a textId: read unnamed"]


def _session_start(con: sqlite3.Connection, tables: set[str], path: Path) -> int | None:
    """`TARGET_INFO_SESSION_START_TIME`'s epoch ns; None without the table (or a row); a value that is no
    integer is a `TraceError` (read as absent, the file's times would be taken as relative without cause)."""
    if "TARGET_INFO_SESSION_START_TIME" not in tables:
        return None
    _require(con, "TARGET_INFO_SESSION_START_TIME", ("utcEpochNs",), path)
    row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    if row is None or row[0] is None:
        return None
    if type(row[0]) is not int:
        msg = f"TARGET_INFO_SESSION_START_TIME holds {repr(row[0])[:40]} ({type(row[0]).__name__}) where a number goes"
        raise TraceError(str(path), msg)
    return row[0]


def _hostname(con: sqlite3.Connection, tables: set[str]) -> str | None:
    """The profiled host's name (`TARGET_INFO_SYSTEM_ENV` row `Hostname`); None without one."""
    if "TARGET_INFO_SYSTEM_ENV" not in tables or {"name", "value"} - _columns(con, "TARGET_INFO_SYSTEM_ENV"):
        return None
    row = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname' LIMIT 1").fetchone()
    return row[0] if row and isinstance(row[0], str) and row[0] else None


def _devices(con: sqlite3.Connection, tables: set[str]) -> tuple[str, ...]:
    if "TARGET_INFO_GPU" not in tables or {"id", "name"} - _columns(con, "TARGET_INFO_GPU"):
        return ()
    return tuple(r[0] for r in con.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id") if r[0])


def _pid(global_id: str) -> pl.Expr:
    """OS pid from a serialized `globalPid`/`globalTid` (UG §3.3: id / 0x1000000 % 0x1000000)."""
    return (pl.col(global_id) // 0x1000000) % 0x1000000


def _tid(global_tid: str) -> pl.Expr:
    return pl.col(global_tid) % 0x1000000


def _name(id_col: str, strings: pl.DataFrame) -> pl.Expr:
    ids, values = strings["id"], strings["value"]
    return pl.col(id_col).replace_strict(ids, values, default=None, return_dtype=pl.String)


def _well_formed(raw: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Drop rows without a usable interval (both ends within 0..MAX_NS, end >= start), counted as malformed."""
    ok = raw.filter(pl.col("start").is_between(0, MAX_NS) & pl.col("end").is_between(pl.col("start"), MAX_NS))
    return ok, {"malformed": raw.height - ok.height}


def _gpu(raw: pl.DataFrame, kind: pl.Expr, name: pl.Expr, **extra: pl.Expr) -> pl.DataFrame:
    """Device rows: pid = the launching process, tid = stream (a GPU lane, as in Kineto)."""
    return raw.select(
        "start",
        "end",
        pid=_pid("globalPid"),
        tid=pl.col("streamId"),
        device=pl.col("deviceId"),
        stream=pl.col("streamId"),
        kind=kind,
        name=name,
        correlation=pl.col("correlationId"),
        **extra,
    )


def _kernels(raw: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    ok, skipped = _well_formed(raw)
    ok = ok.with_columns(short=_name("shortName", strings))
    is_comm = pl.col("short").str.contains(COMM_KERNEL)
    rows = _gpu(
        ok,
        pl.when(is_comm).then(pl.lit("comm")).otherwise(pl.lit("kernel")),
        pl.coalesce(_name("demangledName", strings), pl.col("short")),
        coll_op=pl.when(is_comm).then(coll_op(pl.col("short"))),
    )
    return rows, skipped


def _memcpy(raw: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    ok, skipped = _well_formed(raw)
    name = pl.col("copyKind").replace_strict(_MEMCPY_NAMES, default="Memcpy", return_dtype=pl.String)
    return _gpu(ok, pl.lit("memcpy"), name), skipped


def _memset(raw: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    ok, skipped = _well_formed(raw)
    return _gpu(ok, pl.lit("memset"), pl.lit("Memset")), skipped


def _sync(raw: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    ok, skipped = _well_formed(raw)
    name = pl.col("syncType").replace_strict(_SYNC_NAMES, default="Unknown Sync", return_dtype=pl.String)
    return _gpu(ok, pl.lit("sync"), name), skipped


def _runtime(raw: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    ok, skipped = _well_formed(raw)
    rows = ok.select(
        "start",
        "end",
        pid=_pid("globalTid"),
        tid=_tid("globalTid"),
        device=pl.lit(-1),
        kind=pl.lit("runtime"),
        name=_name("nameId", strings),
        correlation=pl.col("correlationId"),
    )
    return rows, skipped


def _nvtx(raw: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, int]]:
    """Push/pop and start/end ranges -> annotation (`ProfilerStep#N` -> step); the rest counted."""
    event_type = pl.col("eventType")
    is_range = event_type.is_in(_NVTX_RANGES)
    ranges, skipped = _well_formed(raw.filter(is_range))
    skipped |= {
        "instant": raw.filter(event_type == _NVTX_MARK).height,
        "metadata": raw.filter(event_type.is_in(_NVTX_METADATA)).height,
    }
    skipped["other_phase"] = raw.height - ranges.height - sum(skipped.values())
    name = pl.coalesce(pl.col("text"), _name("textId", strings))
    rows = ranges.select(
        "start",
        "end",
        pid=_pid("globalTid"),
        tid=_tid("globalTid"),
        device=pl.lit(-1),
        name=name,
    ).with_columns(
        kind=pl.when(pl.col("name").str.contains(STEP_MARKER)).then(pl.lit("step")).otherwise(pl.lit("annotation")),
        coll_op=pl.when(pl.col("name").str.contains(COMM_KERNEL)).then(coll_op(pl.col("name"), default=None)),
    )
    return rows, skipped
