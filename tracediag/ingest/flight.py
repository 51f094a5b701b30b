"""PyTorch Flight Recorder dumps: one file per rank → polars tables of entries, group configs and status.

A dump (``TORCH_FR_BUFFER_SIZE`` on, written to ``${TORCH_FR_DUMP_TEMP_FILE}<rank>`` or fetched with
``torch._C._distributed_c10d._dump_fr_trace[_json]()``) is a dict with ``version``, ``pg_config`` (group
name → desc and member ranks), ``pg_status`` (local group id → last enqueued/started/completed sequence
id) and ``entries``: the last N collectives and point-to-point ops the rank enqueued, each with its
process group, sequence ids, op, sizes, dtypes, state and the Python frames that called it. Pickle (the
default) is loaded by `safepickle.load_plain`, which builds plain data only; JSON by orjson. Either may be
gzipped; a path, directory, glob or object-store URL is read as the other inputs are.

Bad input: a file that cannot be read as a dump is a `TraceError` naming it (or, found by a directory
scan and not a dump at all, a counted skip); an entry of the wrong shape is a counted skip. A dump over
`MAX_DUMP_BYTES` (after gunzip) is refused before it is parsed, and at most `MAX_ENTRIES` entries a dump
are kept (the newest), so memory stays bounded whatever the file claims.
"""

from __future__ import annotations

import glob
import io
import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pyarrow as pa

from tracediag.api_types import checked
from tracediag.errors import RankError, TracediagError, TraceError, shown
from tracediag.ingest import frscan
from tracediag.ingest.remote import expand, is_remote
from tracediag.ingest.safepickle import load_plain
from tracediag.ingest.sniff import iter_blocks
from tracediag.ingest.workers import in_worker
from tracediag.vocab import UserRegex, user_regex

MAX_DUMP_BYTES = 64 << 20
"""Largest dump read, after gunzip. torch's default buffer (2,000 entries) with stack frames pickles to
about 1 MB (torch memoises repeated strings); 64 MB holds ~100,000 entries, and loading it stays under
~1 GB of Python objects."""
MAX_ENTRIES = 100_000
"""Most entries kept per dump (the newest ones: a hang is at the end); the rest are counted skips."""
EXPAND_FACTOR = 8
EXPAND_SLACK = 1 << 20
"""A pickle's entries may expand to at most EXPAND_FACTOR x its size + EXPAND_SLACK values (list items and
string characters) once shared (memoised) lists and strings are copied out, on either path: the C
scanner's cap (`_frscan.c`) and `_expansion_cap` on the unpickler's."""

_FRAME = pl.Struct({"name": pl.Utf8, "filename": pl.Utf8, "line": pl.Int64})
_RAW: dict[str, pl.DataType] = {
    "record_id": pl.Int64(),
    "pg_id": pl.Int64(),
    "process_group": pl.List(pl.Utf8),
    "collective_seq_id": pl.Int64(),
    "p2p_seq_id": pl.Int64(),
    "op_id": pl.Int64(),
    "profiling_name": pl.Utf8(),
    "is_p2p": pl.Boolean(),
    "input_sizes": pl.List(pl.List(pl.Int64)),
    "input_dtypes": pl.List(pl.Utf8),
    "output_sizes": pl.List(pl.List(pl.Int64)),
    "output_dtypes": pl.List(pl.Utf8),
    "state": pl.Utf8(),
    "retired": pl.Boolean(),
    "time_created_ns": pl.Int64(),
    "time_discovered_started_ns": pl.Int64(),
    "time_discovered_completed_ns": pl.Int64(),
    "timeout_ms": pl.Int64(),
    "thread_name": pl.Utf8(),
    "frames": pl.List(_FRAME),
}
"""The entry fields read (others are ignored), as torch 2.4-2.13 name them."""

ENTRY_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32(),
        "record_id": pl.Int64(),
        "pg_id": pl.Int64(),
        "pg_name": pl.Utf8(),
        "pg_desc": pl.Utf8(),
        "pg_ranks": pl.List(pl.Int64),
        "collective_seq_id": pl.Int64(),
        "p2p_seq_id": pl.Int64(),
        "op_id": pl.Int64(),
        "backend": pl.Utf8(),
        "op": pl.Utf8(),
        "is_p2p": pl.Boolean(),
        "p2p_src": pl.Int64(),
        "p2p_dst": pl.Int64(),
        "input_sizes": pl.List(pl.List(pl.Int64)),
        "input_dtypes": pl.List(pl.Utf8),
        "output_sizes": pl.List(pl.List(pl.Int64)),
        "output_dtypes": pl.List(pl.Utf8),
        "state": pl.Utf8(),
        "retired": pl.Boolean(),
        "time_created_ns": pl.Int64(),
        "time_started_ns": pl.Int64(),
        "time_completed_ns": pl.Int64(),
        "timeout_ms": pl.Int64(),
        "thread_name": pl.Utf8(),
        "stack_id": pl.Int32(),
    }
)
"""One row per entry. `pg_name` is the group's name (``process_group[0]``, equal on every rank; `pg_id` is
a rank-local counter), `op` the collective without its backend (``all_reduce``, ``send``), `p2p_src` /
`p2p_dst` the group-local peers of a send or recv, `pg_ranks` the members the rank's own ``pg_config``
lists (null where it lists none, as gloo's does), times null where the dump has none (JSON writes 0),
`stack_id` the entry's Python stack in `STACK_SCHEMA` (entries of one call site share it)."""

STACK_SCHEMA = pl.Schema({"rank": pl.Int32(), "stack_id": pl.Int32(), "frames": pl.List(_FRAME)})
"""The distinct stacks of a rank's entries, innermost frame first (null: the entry has none)."""

GROUP_SCHEMA = pl.Schema({"rank": pl.Int32(), "pg_name": pl.Utf8(), "pg_desc": pl.Utf8(), "ranks": pl.List(pl.Int64)})
"""``pg_config`` rows: the groups a rank's dump lists, with their member (global) ranks."""
STATUS_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32(),
        "pg_id": pl.Int64(),
        "last_enqueued": pl.Int64(),
        "last_started": pl.Int64(),
        "last_completed": pl.Int64(),
    }
)
"""``pg_status`` rows: per rank and local group id, the last collective sequence id enqueued, started,
completed (-1: none)."""
DUMP_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32(),
        "path": pl.Utf8(),
        "format": pl.Utf8(),
        "version": pl.Utf8(),
        "entries": pl.Int64(),
        "skipped": pl.Int64(),
    }
)
"""One row per dump read."""

_RANK_IN_NAME = r"(\d+)(?:\.[A-Za-z][A-Za-z0-9]*)*$"
"""The default rank of a file without a rank field: the last number of its name before any extensions
(``nccl_trace_rank_3``, ``fr_trace_rank_3.json.gz``): the name torch's dump writer gives."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightDumps:
    """Flight Recorder dumps read: tables over every rank read, and what was skipped."""

    entries: pl.DataFrame
    """`ENTRY_SCHEMA` rows, by rank then record id."""
    groups: pl.DataFrame
    """`GROUP_SCHEMA` rows."""
    status: pl.DataFrame
    """`STATUS_SCHEMA` rows."""
    dumps: pl.DataFrame
    """`DUMP_SCHEMA` rows, by rank."""
    stacks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=STACK_SCHEMA))
    """`STACK_SCHEMA` rows: the frames an entry's `stack_id` stands for."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Files and entries that are not rows, by reason."""

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that wrote a dump."""
        return tuple(self.dumps["rank"].to_list())


class _NotADump(TraceError):
    """A readable file that is no Flight Recorder dump (skipped in a directory scan)."""


def resolve_dump_paths(sources: list[str], storage_options: dict | None = None) -> list[tuple[str, bool]]:
    """Every file the sources name once, with whether a directory scan (or prefix) found it.

    A directory is searched recursively (dumps have no common suffix: ``nccl_trace_rank_0``); hidden
    files are left out. A glob is expanded (``**`` across folders); a URL is listed by `remote.expand`.
    """
    out: list[tuple[str, bool]] = []
    for src in map(str, sources):
        src = "/dev/stdin" if src == "-" else src  # standard input, read as a stream
        if is_remote(src):
            out.extend((f.url, f.in_directory) for f in expand(src, storage_options, suffixes=("",)))
        elif os.path.isdir(src):
            found = [
                str(p)
                for p in sorted(Path(src).rglob("*"))
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(src).parts)
            ]
            if not found:
                msg = f"{shown(src)}: no files in this directory"
                raise TracediagError(msg)
            out.extend((p, True) for p in found)
        elif any(ch in src for ch in "*?["):
            matches = sorted(p for p in glob.glob(src, recursive=True) if os.path.isfile(p))
            if not matches:
                msg = f"{shown(src)}: the pattern matches no file"
                raise TracediagError(msg)
            out.extend((p, False) for p in matches)
        else:
            out.append((src, False))
    seen: set[str] = set()
    return [(p, d) for p, d in out if not (p in seen or seen.add(p))]


def _read_bytes(path: str, max_bytes: int, storage_options: dict | None) -> bytes:
    parts: list[bytes] = []
    total = 0
    for block in iter_blocks(path, storage_options=storage_options):
        total += len(block)
        if total > max_bytes:
            raise TraceError(path, f"dump larger than {max_bytes / 1e6:,.0f} MB (after gunzip); not read")
        parts.append(block)
    return b"".join(parts)


def _parse(data: bytes, path: str, max_entries: int) -> tuple[dict[str, Any], str, frscan.Scanned | None]:
    """The dump's top-level dict, its format ("pickle" or "json"), and its entries as columns where the C
    scanner read it (then the dict's ``entries`` is None)."""
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark before JSON (as the trace readers allow)
    head = data[:1]
    scanned = None
    if head == b"\x80":
        scanned = frscan.scan(data, path, max_entries)
        doc, fmt = (scanned.top if scanned else load_plain(data, path)), "pickle"
    elif head in (b"(", b"}") and data.endswith(b"."):  # pickle protocol 0 or 1 (a MARK or an empty dict first)
        doc, fmt = load_plain(data, path), "pickle"
    elif data.lstrip()[:1] == b"{":
        try:
            doc, fmt = orjson.loads(data), "json"
        except orjson.JSONDecodeError as e:
            raise TraceError(path, f"not valid JSON ({e})") from None
    elif not data:
        raise _NotADump(path, "empty file, not a Flight Recorder dump")
    else:
        raise _NotADump(path, "not a Flight Recorder dump (neither a pickle nor JSON)")
    if not isinstance(doc, dict) or not ({"entries", "pg_config"} & doc.keys()):
        raise _NotADump(path, f"{fmt} without Flight Recorder fields (entries, pg_config)")
    return doc, fmt, scanned


def _rank_pattern(rank_from_filename: str | None) -> UserRegex:
    """The file-name rank pattern, checked by the linear-time engine (a refused one is a `RankError`)."""
    try:
        return user_regex(rank_from_filename or _RANK_IN_NAME, "--rank-from-filename")
    except ValueError as e:
        raise RankError(str(e)) from None


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _rank(doc: dict[str, Any], path: str, found: str | None) -> int:
    """The dump's rank field, else `found`: the rank pattern's group in the file name. A `RankError` when
    both name a rank and they differ: a dump copied or renamed over another rank's would read as a rank that
    never ran (and the rank of its name as one that wrote no dump)."""
    value = doc.get("rank")
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        if found is not None and re.fullmatch(r"\d{1,9}", found) and int(found) != value:
            msg = (
                f"{shown(path)}: the dump says rank {value}, its file name rank {int(found)}\n\n"
                "Hint: name dumps <prefix><rank> as torch does, or pass --rank-from-filename REGEX whose group is "
                "the rank in the names"
            )
            raise RankError(msg)
        return value
    if found is not None and not re.fullmatch(r"\d{1,9}", found):
        msg = f"{shown(path)}: --rank-from-filename matched {found!r} in its name, not a rank (a whole number)"
        raise RankError(msg)
    if found is None:
        msg = (
            f"{shown(path)}: no rank in the dump nor in its file name\n\n"
            "Hint: name dumps <prefix><rank> as torch does, or pass --rank-from-filename REGEX"
        )
        raise RankError(msg)
    return int(found)


def _ranks_of(value: object) -> list[int] | None:
    """Member ranks as pg_config writes them: a string ``"[0, 1]"`` (torch) or a list."""
    if isinstance(value, str):
        found = [int(x) for x in re.findall(r"-?\d+", value)]
    elif isinstance(value, list | tuple):
        found = [int(x) for x in value if isinstance(x, int) and not isinstance(x, bool)]
    else:
        return None
    return found or None


def _groups(doc: dict[str, Any], rank: int, skipped: Counter[str]) -> pl.DataFrame:
    config = doc.get("pg_config")
    rows: list[tuple[int, str, str | None, list[int] | None]] = []
    if isinstance(config, dict):
        for name, spec in config.items():
            if not isinstance(spec, dict):
                skipped["pg_config item not a dict"] += 1
                continue
            desc = spec.get("desc")
            rows.append((rank, str(name), desc if isinstance(desc, str) else None, _ranks_of(spec.get("ranks"))))
    elif config is not None:
        skipped["pg_config not a dict"] += 1
    return pl.DataFrame(rows, schema=GROUP_SCHEMA, orient="row")


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else None
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value):
        return int(value)
    return None


def _status(doc: dict[str, Any], rank: int, skipped: Counter[str]) -> pl.DataFrame:
    status = doc.get("pg_status")
    rows = []
    if isinstance(status, dict):
        for pg_id, spec in status.items():
            if not isinstance(spec, dict) or _int(pg_id) is None:
                skipped["pg_status item malformed"] += 1
                continue
            rows.append(
                (
                    rank,
                    _int(pg_id),
                    _int(spec.get("last_enqueued_collective")),
                    _int(spec.get("last_started_collective")),
                    _int(spec.get("last_completed_collective")),
                )
            )
    return pl.DataFrame(rows, schema=STATUS_SCHEMA, orient="row")


_REQUIRED = ("record_id", "pg_name", "collective_seq_id", "op")


_FIELDS = {k: v for k, v in _RAW.items() if k != "frames"}
_INT = frozenset(k for k, v in _FIELDS.items() if v == pl.Int64())
_STR = frozenset(k for k, v in _FIELDS.items() if v == pl.Utf8())
_BOOL = frozenset(k for k, v in _FIELDS.items() if v == pl.Boolean())
_I64 = (-(2**63), 2**63)


def _ok(key: str, v: object) -> bool:
    """Whether an entry's value has the type its column takes (null always does)."""
    if v is None:
        return True
    if key in _INT:
        return type(v) is int and _I64[0] <= v < _I64[1]
    if key in _STR:
        return type(v) is str
    if key in _BOOL:
        return type(v) is bool
    if key == "process_group":
        return type(v) in (list, tuple) and all(type(x) is str for x in v)
    if key.endswith("_dtypes"):
        return type(v) is list and all(type(x) is str for x in v)
    if key.endswith("_sizes"):
        return type(v) is list and all(
            type(x) is list and all(type(n) is int and _I64[0] <= n < _I64[1] for n in x) for x in v
        )
    return True


def _cleaned(dicts: list[dict], skipped: Counter[str]) -> list[dict]:
    """The entries with each wrongly typed field set to null (counted): the slow path, taken only when
    the fast one refuses the batch."""
    out = []
    for e in dicts:
        c = {k: e.get(k) for k in _FIELDS}
        bad = [k for k, v in c.items() if not _ok(k, v)]
        for k in bad:
            c[k] = None
        if bad:
            skipped["entry field of the wrong type (set to null)"] += len(bad)
        out.append(c)
    return out


def _frame_table(dicts: list[dict], rank: int, skipped: Counter[str]) -> tuple[list[int], pl.DataFrame]:
    """Each entry's stack id, and the distinct stacks (an entry's frames, popped from it, as JSON)."""
    ids: dict[bytes, int] = {}
    seen: dict[int, bytes] = {}  # a frames list shared by many entries is written once (a pickle bomb's too)
    out = []
    for e in dicts:
        frames = e.pop("frames", None)
        text = seen.get(id(frames))
        if text is None:
            try:
                text = orjson.dumps(frames)
            except TypeError:
                skipped["entry frames not plain data (dropped)"] += 1
                text = b"null"
            seen[id(frames)] = text
        out.append(ids.setdefault(text, len(ids)))
    stacks = b'[{"frames":' + b'},{"frames":'.join(ids) + b"}]"
    try:
        frames = pl.read_json(io.BytesIO(stacks), schema={"frames": _RAW["frames"]})["frames"]
    except (pl.exceptions.PolarsError, ValueError):
        skipped["entry frames of the wrong shape (dropped)"] += len(ids)
        frames = pl.Series("frames", [None] * len(ids), dtype=_RAW["frames"])
    return out, _stack_table(frames, rank)


def _stack_table(frames: pl.Series, rank: int) -> pl.DataFrame:
    n = frames.len()
    return pl.DataFrame(
        {"rank": pl.Series([rank] * n, dtype=pl.Int32), "stack_id": pl.Series(range(n), dtype=pl.Int32)}
    ).with_columns(frames.alias("frames"))


def _raw_table(dicts: list[dict], skipped: Counter[str]) -> pl.DataFrame:
    """The entries' fields as columns: orjson writes them, polars' JSON reader parses them (10x faster
    than building nested columns from Python objects); wrong types go through `_cleaned` first."""
    if not dicts:
        return pl.DataFrame(schema=_FIELDS)
    try:
        return pl.read_json(io.BytesIO(orjson.dumps(dicts)), schema=_FIELDS)
    except (TypeError, pl.exceptions.PolarsError, ValueError):
        return pl.read_json(io.BytesIO(orjson.dumps(_cleaned(dicts, skipped))), schema=_FIELDS)


def _expansion_cap(dicts: list[dict], cap: int, path: str) -> None:
    """Refuse entries whose values, written out as `_raw_table` and `_frame_table` write them (every
    field of every entry, each distinct frames list once), would exceed `cap` list items and string
    characters: a pickle's memo lets one list or string be referenced by every entry (a pickle bomb).
    The walk stops at the cap, so it costs at most `cap` steps."""
    left = cap
    seen_frames: set[int] = set()
    todo: list[object] = []
    for e in dicts:
        frames = e.get("frames")
        if frames is not None:
            if id(frames) in seen_frames:
                todo.extend(v for k, v in e.items() if k != "frames")
            else:
                seen_frames.add(id(frames))
                todo.extend(e.values())
        else:
            todo.extend(e.values())
        while todo:
            v = todo.pop()
            t = type(v)
            if t is dict:
                v = v.values()
            elif t is not list and t is not tuple:
                left -= len(v) + 1 if t is str or t is bytes else 1
                continue
            left -= len(v) + 1
            for x in v:  # scalars here, containers later: most values are scalars
                tx = type(x)
                if tx is str:
                    left -= len(x) + 1
                elif tx is list or tx is tuple or tx is dict:
                    todo.append(x)
                else:
                    left -= 1
            if left < 0:
                break
        if left < 0:
            msg = f"its shared lists and strings expand to over {cap} values (a pickle bomb); not read"
            raise TraceError(path, msg)


def _entries(
    raw: object, rank: int, path: str, max_entries: int, skipped: Counter[str], cap: int | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The raw entry fields (`_FIELDS`, `stack_id`) and stacks of a dump loaded as Python objects;
    `cap`: the most values they may expand to (`_expansion_cap`; None for JSON, whose text is every value)."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise TraceError(path, f"entries is a {type(raw).__name__}, not a list")
    dicts = [e for e in raw if type(e) is dict]
    if len(dicts) < len(raw):
        skipped["entry not a dict"] += len(raw) - len(dicts)
    if len(dicts) > max_entries:
        skipped[f"entries past the newest {max_entries:,}"] += len(dicts) - max_entries
        dicts = dicts[-max_entries:]
    if cap is not None:
        _expansion_cap(dicts, cap, path)
    dicts = [dict(e) for e in dicts] if len(set(map(id, dicts))) < len(dicts) else dicts  # shared: pop per copy
    stack_ids, stacks = _frame_table(dicts, rank, skipped)
    return _raw_table(dicts, skipped).with_columns(pl.Series("stack_id", stack_ids, dtype=pl.Int32)), stacks


def _scanned_entries(
    scanned: frscan.Scanned, rank: int, max_entries: int, skipped: Counter[str]
) -> tuple[pa.Table, pl.DataFrame]:
    """`_entries` for a dump the C scanner read: the same tables from its columns (Arrow, made polars
    once per batch)."""
    if scanned.dropped:
        skipped[f"entries past the newest {max_entries:,}"] += scanned.dropped
    stacks = _stack_table(pl.Series("frames", scanned.stacks, dtype=_RAW["frames"]), rank)
    raw = scanned.raw
    return raw.append_column("rank", pa.repeat(pa.scalar(rank, pa.int32()), raw.num_rows)), stacks


_NO_REQUIRED = "entry without record_id, process_group, collective_seq_id or profiling_name"


def _names(frame: pl.DataFrame) -> pl.DataFrame:
    """Backend, op and point-to-point peers of each distinct profiling name (``gloo:all_reduce``,
    ``nccl:send 0->1``): parsed once per name, not per entry."""
    name = pl.col("profiling_name")
    op = name.str.extract(r"^(?:[^:]*:)?([^ ]*)", 1)
    send = name.str.extract_groups(r"send (\d+)->(\d+)")
    recv = name.str.extract_groups(r"recv (\d+)<-(\d+)")
    is_send, is_recv = op == "send", op == "recv"
    return frame.select(name.unique().drop_nulls()).select(
        "profiling_name",
        name.str.extract(r"^([^:]*):", 1).alias("backend"),
        op.alias("op"),
        (is_send | is_recv).alias("_p2p"),
        pl.when(is_send)
        .then(send.struct.field("1"))
        .when(is_recv)
        .then(recv.struct.field("2"))
        .cast(pl.Int64)
        .alias("p2p_src"),
        pl.when(is_send)
        .then(send.struct.field("2"))
        .when(is_recv)
        .then(recv.struct.field("1"))
        .cast(pl.Int64)
        .alias("p2p_dst"),
    )


def _typed(frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`ENTRY_SCHEMA` rows (but `pg_ranks`) from the raw fields of any number of dumps (with `rank`): op,
    backend and peers parsed from the profiling name, zero times null; entries without the fields an
    entry needs dropped, and counted per rank (the second frame: rank, len). One pass per batch of
    dumps, not per dump; rows in the order given."""
    frame = frame.join(_names(frame), on="profiling_name", how="left", maintain_order="left").select(
        "rank",
        "record_id",
        "pg_id",
        pl.col("process_group").list.get(0, null_on_oob=True).alias("pg_name"),
        pl.col("process_group").list.get(1, null_on_oob=True).alias("pg_desc"),
        pl.lit(None, pl.List(pl.Int64)).alias("pg_ranks"),
        "collective_seq_id",
        "p2p_seq_id",
        "op_id",
        "backend",
        "op",
        pl.col("is_p2p").fill_null(pl.col("_p2p")),
        "p2p_src",
        "p2p_dst",
        "input_sizes",
        "input_dtypes",
        "output_sizes",
        "output_dtypes",
        "state",
        "retired",
        pl.col("time_created_ns").replace(0, None),
        pl.col("time_discovered_started_ns").replace(0, None).alias("time_started_ns"),
        pl.col("time_discovered_completed_ns").replace(0, None).alias("time_completed_ns"),
        "timeout_ms",
        "thread_name",
        "stack_id",
    )
    ok = pl.all_horizontal(pl.col(c).is_not_null() for c in _REQUIRED)
    bad = frame.filter(~ok).group_by("rank").len()
    if bad.height:
        frame = frame.filter(ok)
    return frame, bad


_REPEATED = "entry repeating the record_id of an earlier one of its rank (the first kept)"


def _once(entries: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, int]]:
    """`entries` without those repeating the record_id of an earlier entry of their rank, and how many were
    dropped per rank. The recorder numbers each entry once, so a repeat is a dump's entries written twice
    (a pipeline that appended a list to itself): kept, every op of it would count double (a rank "enqueued
    32 all_reduce where the others enqueued 16")."""
    first = pl.struct("rank", "record_id").is_first_distinct()
    repeated = dict(entries.filter(~first).group_by("rank").len().rows())
    return (entries.filter(first) if repeated else entries), repeated


@dataclass(frozen=True, slots=True)
class _Piece:
    """One dump read, its entries not yet typed (`_assemble` types a batch of them at once)."""

    raw: pl.DataFrame | pa.Table
    """The raw fields, `stack_id` and `rank`: polars from the unpickler, Arrow from the C scanner."""
    groups: pl.DataFrame
    status: pl.DataFrame
    stacks: pl.DataFrame
    dump: tuple[int, str, str, str | None]
    """rank, path, format, version."""
    skipped: Counter[str]


def read_dump(
    path: str,
    *,
    rank_from_filename: str | None = None,
    storage_options: dict | None = None,
    max_bytes: int = MAX_DUMP_BYTES,
    max_entries: int = MAX_ENTRIES,
) -> FlightDumps:
    """One rank's Flight Recorder dump (pickle or JSON, gzipped or not) as tables.

    Parameters
    ----------
    path
        A file or object-store URL.
    rank_from_filename
        A regex whose first group is the rank, for dumps without a ``rank`` field (torch 2.13 writes
        none); by default the last number of the file name before its extensions.
    storage_options, max_bytes, max_entries
        Object-store options; the limits of `MAX_DUMP_BYTES` and `MAX_ENTRIES`.

    Raises
    ------
    TraceError
        The file is missing, not a dump, a pickle that names code, truncated, or of the wrong shape.
    RankError
        No rank can be found.
    """
    piece = _read_piece(
        path,
        _rank_pattern(rank_from_filename).first_group([_name(path)])[0],
        storage_options=storage_options,
        max_bytes=max_bytes,
        max_entries=max_entries,
    )
    one = _assemble([piece])
    return replace(one, entries=one.entries.sort("record_id", maintain_order=True))


def _read_piece(
    path: str, name_rank: str | None, *, storage_options: dict | None, max_bytes: int, max_entries: int
) -> _Piece:
    """One dump read; `name_rank`: the rank pattern's group in its file name (None: no match)."""
    data = _read_bytes(path, max_bytes, storage_options)
    doc, fmt, scanned = _parse(data, path, max_entries)
    cap = EXPAND_FACTOR * len(data) + EXPAND_SLACK if fmt == "pickle" else None
    del data
    rank = _rank(doc, path, name_rank)
    skipped: Counter[str] = Counter()
    groups = _groups(doc, rank, skipped)
    if scanned is not None:
        raw, stacks = _scanned_entries(scanned, rank, max_entries, skipped)
    else:
        raw, stacks = _entries(doc.get("entries"), rank, path, max_entries, skipped, cap)
        raw = raw.with_columns(pl.lit(rank, pl.Int32).alias("rank"))
    doc.pop("entries", None)
    version = doc.get("version")
    return _Piece(
        raw=raw,
        groups=groups,
        status=_status(doc, rank, skipped),
        stacks=stacks,
        dump=(rank, path, fmt, str(version) if version is not None else None),
        skipped=skipped,
    )


def _assemble(pieces: list[_Piece]) -> FlightDumps:
    """The tables of several dumps: their entries typed in one pass (in file order, not sorted), each
    tagged with its group's members where the rank's own pg_config lists them."""
    arrow = [p.raw for p in pieces if isinstance(p.raw, pa.Table)]
    frames = [p.raw for p in pieces if not isinstance(p.raw, pa.Table)]
    schema = {**_FIELDS, "stack_id": pl.Int32(), "rank": pl.Int32()}
    entries, bad = _typed(pl.concat(([frscan.to_polars(arrow, schema)] if arrow else []) + frames))
    entries, repeated = _once(entries)
    groups = pl.concat([p.groups for p in pieces])
    named = (
        groups.filter(pl.col("ranks").is_not_null())
        .select("rank", "pg_name", pl.col("ranks").alias("_r"))
        .unique(["rank", "pg_name"], keep="first", maintain_order=True)
    )
    if named.height:
        entries = (
            entries.join(named, on=["rank", "pg_name"], how="left", maintain_order="left")
            .with_columns(pl.col("_r").alias("pg_ranks"))
            .drop("_r")
            .select(ENTRY_SCHEMA.names())
        )
    dropped = dict(bad.rows())
    held = dict(entries.group_by("rank").len().rows())
    skipped: Counter[str] = Counter()
    rows = []
    for p in pieces:
        rank = p.dump[0]
        if dropped.get(rank):
            p.skipped[_NO_REQUIRED] += dropped[rank]
        if repeated.get(rank):
            p.skipped[_REPEATED] += repeated[rank]
        skipped.update(p.skipped)
        rows.append((*p.dump, held.get(rank, 0), sum(p.skipped.values())))
    return FlightDumps(
        entries=entries,
        groups=groups,
        status=pl.concat([p.status for p in pieces]),
        dumps=pl.DataFrame(rows, schema=DUMP_SCHEMA, orient="row"),
        stacks=pl.concat([p.stacks for p in pieces]),
        skipped=dict(skipped),
    )


BATCH = 32
"""Dumps read per worker task (one round trip of tables per batch, not per file)."""
WORKER_FILES = 128
"""Below this many dumps `jobs=0` reads in this process: a worker costs ~0.35 CPU-s to start, about what
reading 15 dumps of 2,000 entries costs."""


def read_batch(task: tuple[list[tuple[str, bool]], dict[str, Any]]) -> tuple[FlightDumps | _Shipped | None, int]:
    """Dumps read one after the other and typed together (a worker task), and how many directory files
    were no dump (None: no dump at all); in a worker process the tables are `_Shipped`."""
    found, options = task
    options = dict(options)
    name_ranks = _rank_pattern(options.pop("rank_from_filename")).first_group([_name(p) for p, _ in found])
    pieces: list[_Piece] = []
    not_dumps = 0
    for (path, in_directory), name_rank in zip(found, name_ranks, strict=True):
        try:
            pieces.append(_read_piece(path, name_rank, **options))
        except _NotADump:
            if not in_directory:
                raise
            not_dumps += 1
    if not pieces:
        return None, not_dumps
    one = _assemble(pieces)
    return (_Shipped.pack(one) if in_worker() else one), not_dumps


@dataclass(frozen=True, slots=True)
class _Shipped:
    """A batch's tables as a worker sends them: the entries one Arrow IPC stream, the rest pickled.
    Pickling the entries costs ~4x as much (32 dumps of 2,000 entries: 94-119 ms against 21-32 ms to
    write, 47 against 23-29 ms to read)."""

    dumps: FlightDumps
    """The tables, `entries` empty."""
    entries: bytes

    @classmethod
    def pack(cls, one: FlightDumps) -> _Shipped:
        buffer = io.BytesIO()
        one.entries.write_ipc(buffer, compression="uncompressed")
        return cls(replace(one, entries=one.entries.clear()), buffer.getvalue())

    def unpack(self) -> FlightDumps:
        return replace(self.dumps, entries=pl.read_ipc(self.entries))


def _crashed(task: tuple[list[tuple[str, bool]], dict[str, Any]], why: str) -> tuple[FlightDumps | None, int]:
    raise TraceError(task[0][0][0], f"the worker reading this batch of dumps died ({why})")


def _natural(path: str) -> tuple[tuple[str, int], ...]:
    """A path's sort key with its numbers as numbers (``rank_2`` before ``rank_10``): dumps named by rank
    are then read in rank order, and `_by_rank` finds their entries sorted already."""
    return tuple((text, int(num) if num else -1) for text, num in re.findall(r"(\D*)(\d*)", path) if text or num)


def _by_rank(entries: pl.DataFrame) -> pl.DataFrame:
    """The entries by rank then record id: sorted only where they are not yet (a check over two integer
    columns costs ~1/50 of a sort that moves every column, nested lists included)."""
    rank = pl.col("rank").diff()
    ordered = ((rank > 0) | ((rank == 0) & (pl.col("record_id").diff() >= 0))).fill_null(True).all()
    if entries.height and not entries.select(ordered).item():
        return entries.sort("rank", "record_id", maintain_order=True)
    return entries


@checked
def read_dumps(
    sources: list[str] | tuple[str, ...] | str,
    *,
    rank_from_filename: str | None = None,
    storage_options: dict | None = None,
    max_bytes: int = MAX_DUMP_BYTES,
    max_entries: int = MAX_ENTRIES,
    jobs: int = 0,
) -> FlightDumps:
    """Every rank's dump the sources name (files, directories, globs, URLs), as one set of tables.

    A file found by a directory scan that is not a dump (a README, a manifest) is skipped and counted;
    one named on its own is an error. Two dumps of one rank are a `RankError`. `jobs`: processes
    reading, this one included (0: one per CPU from `WORKER_FILES` dumps on, else 1).
    """
    srcs = [sources] if isinstance(sources, str) else list(sources)
    if not srcs:
        msg = "tracediag.ingest.flight.read_dumps: `sources` names no dump file"
        raise TracediagError(msg)
    _rank_pattern(rank_from_filename)  # a refused pattern stops before any file is read
    found = sorted(resolve_dump_paths(srcs, storage_options), key=lambda f: _natural(f[0]))
    options = {
        "rank_from_filename": rank_from_filename,
        "storage_options": storage_options,
        "max_bytes": max_bytes,
        "max_entries": max_entries,
    }
    tasks = [(found[i : i + BATCH], options) for i in range(0, len(found), BATCH)]
    if jobs == 0:
        jobs = (os.cpu_count() or 1) if len(found) >= WORKER_FILES else 1
    if jobs > 1 and len(tasks) > 1:
        from tracediag.ingest.workers import map_in_workers

        batches = map_in_workers(read_batch, tasks, jobs, crashed=_crashed, in_caller=True)
    else:
        batches = [read_batch(t) for t in tasks]
    parts = [d.unpack() if isinstance(d, _Shipped) else d for d, _ in batches if d is not None]
    skipped: Counter[str] = Counter()
    not_dumps = sum(n for _, n in batches)
    if not_dumps:
        skipped["file not a Flight Recorder dump"] += not_dumps
    for one in parts:
        skipped.update(one.skipped)
    if not parts:
        msg = f"{', '.join(map(shown, srcs))}: no Flight Recorder dump found"
        raise TracediagError(msg)
    dumps = pl.concat([p.dumps for p in parts])
    dup = dumps.group_by("rank").agg(pl.col("path")).filter(pl.col("path").list.len() > 1).sort("rank")
    if dup.height:
        rank, paths = dup.row(0)
        msg = f"{shown(paths[0])}, {shown(paths[1])}: two dumps of rank {rank}"
        msg += "\n\nHint: pass the dumps of one job (or --rank-from-filename REGEX)"
        raise RankError(msg)
    return FlightDumps(
        entries=_by_rank(pl.concat([p.entries for p in parts])),
        groups=pl.concat([p.groups for p in parts]),
        status=pl.concat([p.status for p in parts]),
        dumps=dumps.sort("rank"),
        stacks=pl.concat([p.stacks for p in parts]),
        skipped=dict(skipped),
    )
