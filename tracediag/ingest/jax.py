"""JAX / XLA profiler semantics on top of the decoded Chrome container.

A JAX trace (`<host>.trace.json.gz` or `perfetto_trace.json.gz`) is one process's view: its host
plane (`/host:CPU`, pid 701) and, on GPU/TPU, one plane per device (`/device:GPU:<n>`). Events
carry no `cat`; what an event is follows from its plane, its line (thread name) and its XStats
args (`hlo_op`, `device_ordinal`, `run_id`, `step_num`). Times are relative to the profile start;
the absolute start is read from the `xplane.pb` beside the file when there is one. See
docs/formats/jax.md and trace-formats.md §4.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracediag.ingest.trace import FileMeta, FileTrace
from tracediag.schema import MAX_NS, check_rank, conform, drop_strays, shifted, unnamed_warning
from tracediag.vocab import (
    COMM_KERNEL,
    DEVICE_PLANE,
    HLO_COLLECTIVES,
    JAX_DONE_OP,
    JAX_MEMCPY,
    JAX_MEMSET,
    RENDEZVOUS_HELPERS,
    RUNTIME_CALL,
    STREAM_LINE,
    coll_op,
    hlo_coll_op,
    hlo_stem,
    resolve_rank,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tracediag.ingest.chrome import Decoded

XPLANE_GUNZIP_RATIO = 100
"""A gzipped xplane.pb may grow at most this many times its size (at least 64 MB): no decompression bomb."""
_STOP_SLACK_NS = 1_000_000
"""How far the JSON may run past the xplane's profile stop before the two are taken as unrelated."""


def to_events(
    dec: Decoded, path: str, *, rank: int | None, default_rank: int | None = None, xplane: Path | str | None = "beside"
) -> FileTrace:
    """The event table of one JAX trace file.

    A JAX trace never names its rank: `rank` (from the user) wins, else `default_rank` (a
    single-file run) with a warning, else a `RankError` naming the file and the options to fix it.
    `xplane`: the profile's `xplane.pb` (a local copy of a URL's), None for none, or ``"beside"`` to
    look beside `path` (`xplane_beside`).
    """
    warnings = list(dec.warnings)
    missing = "a JAX trace holds one process and never names its rank"
    rank = resolve_rank(path, given=rank, named=(), source="", default=default_rank, missing=missing, warnings=warnings)
    check_rank(rank, path)
    slices = _with_planes(dec)
    has_device_planes = bool(slices["plane_device"].is_not_null().any()) if slices.height else False
    events = _fill_collectives(_classify(slices, has_device_planes))
    events, time_base = _place_in_time(events, xplane_beside(path) if xplane == "beside" else xplane, warnings)
    events = conform(events.with_columns(rank=pl.lit(rank, dtype=pl.Int32)), skipped=dec.skipped, warnings=warnings)
    events = drop_strays(events, skipped=dec.skipped, warnings=warnings)
    if n := events.get_column("name").null_count():
        warnings.append(unnamed_warning(n))
    meta = FileMeta(
        path=path,
        format="jax",
        rank=rank,
        time_base=time_base,
        devices=_device_names(dec, events),
        events_in=dec.events_in,
        skipped=dict(sorted(dec.skipped.items())),
        warnings=tuple(warnings),
    )
    return FileTrace(events=events, meta=meta)


def _with_planes(dec: Decoded) -> pl.DataFrame:
    """Slices with their plane's device index, their line's name and stream, and its plane's streams."""
    meta = dec.metadata
    planes = (
        meta.filter(pl.col("name") == "process_name")
        .select("pid", plane_device=pl.col("label").str.extract(DEVICE_PLANE, 1).cast(pl.Int64, strict=False))
        .unique("pid", keep="first")
    )
    lines = (
        meta.filter(pl.col("name") == "thread_name")
        .select("pid", "tid", line=pl.col("label"))
        .unique(["pid", "tid"], keep="first")
    )
    streamed = (
        lines.filter(pl.col("line").str.contains(STREAM_LINE))
        .select("pid")
        .unique()
        .with_columns(plane_has_streams=pl.lit(True))
    )
    # the mapping matches names by pattern row by row (a JAX file is small): String names, not Categorical
    slices = dec.slices.with_columns(pl.col("name").cast(pl.String))
    return (
        dec.with_args(slices, *_RARE_ARGS)
        .join(planes, on="pid", how="left")
        .join(lines, on=["pid", "tid"], how="left")
        .join(streamed, on="pid", how="left")
        .with_columns(
            line_stream=pl.col("line").str.extract(STREAM_LINE, 1).cast(pl.Int64, strict=False),
            plane_has_streams=pl.col("plane_has_streams").fill_null(False),
        )
    )


_RARE_ARGS = ("a_step_num", "a_device_ordinal", "a_hlo_op", "a_run_id", "a_label")
"""The less common `args` columns the JAX mapping reads (chrome.py reads them on rows without a `cat`)."""


def _classify(s: pl.DataFrame, has_device_planes: bool) -> pl.DataFrame:
    """Kind, device and stream of each slice (see docs/formats/jax.md, "Kinds")."""
    name = pl.col("name")
    hlo = pl.col("a_hlo_op")
    op_text = pl.coalesce(hlo, name)
    is_done = op_text.str.to_lowercase().str.contains(JAX_DONE_OP)
    nccl = hlo.is_null() & name.str.contains(COMM_KERNEL)
    is_coll = hlo_stem(op_text).is_in(list(HLO_COLLECTIVES)) | nccl
    on_device = pl.col("plane_device").is_not_null()
    # Where the device's executed ops are: stream lines (GPU); the `XLA Ops` line on a plane without
    # streams (TPU); host-thread events with `hlo_op` when the file has no device plane (CPU backend).
    device_work = (
        (on_device & pl.col("line_stream").is_not_null())
        | (on_device & ~pl.col("plane_has_streams") & (pl.col("line") == "XLA Ops"))
        | (~on_device & hlo.is_not_null() & (not has_device_planes))
    )
    work_kind = (
        pl.when(is_done)
        .then(pl.lit("sync"))
        .when(is_coll)
        .then(pl.lit("comm"))
        .when(name.str.contains(JAX_MEMCPY))
        .then(pl.lit("memcpy"))
        .when(name.str.contains(JAX_MEMSET))
        .then(pl.lit("memset"))
        .otherwise(pl.lit("kernel"))
    )
    kind = (
        pl.when(device_work)
        .then(work_kind)
        .when(on_device)
        .then(pl.lit("annotation"))
        .when(pl.col("a_step_num").is_not_null())
        .then(pl.lit("step"))
        .when(name.str.starts_with("end: ") | name.str.contains(RENDEZVOUS_HELPERS))
        .then(pl.lit("other"))
        .when(name.str.starts_with("$"))
        .then(pl.lit("python"))
        .when(name.str.contains(RUNTIME_CALL))
        .then(pl.lit("runtime"))
        .otherwise(pl.lit("cpu_op"))
    )
    return s.with_columns(
        kind=kind,
        name=pl.when(pl.col("a_step_num").is_not_null() & ~on_device)
        .then(pl.format("{}#{}", name, pl.col("a_step_num")))
        .otherwise(name),
        device=pl.when(on_device)
        .then(pl.col("plane_device"))
        .when(device_work)
        .then(pl.col("a_device_ordinal"))
        .otherwise(-1),
        stream=pl.when(on_device).then(pl.col("line_stream")).when(device_work).then(pl.col("tid")),
        correlation=pl.col("a_correlation"),
    )


def _fill_collectives(ev: pl.DataFrame) -> pl.DataFrame:
    """coll_op from the HLO op (or NCCL kernel) name, coll_seq from `run_id`, group from Rendezvous.

    `run_id` names one execution of a compiled program; every device and every process running
    that execution shares it, so (name, coll_seq) pairs up one collective's rows across ranks.
    On the CPU backend, the `Rendezvous` event inside each collective names its devices
    (`global_devices=[0, 1]`), which become `coll_group` ("0,1") and `coll_group_size`.
    """
    comm = pl.col("kind") == "comm"
    op_text = pl.coalesce("a_hlo_op", "name")
    ev = ev.with_columns(
        coll_op=pl.when(comm).then(pl.coalesce(hlo_coll_op(op_text), coll_op(pl.col("name")))),
        coll_seq=pl.when(comm).then(pl.col("a_run_id").cast(pl.Int64, strict=False)),
    )
    return _group_from_rendezvous(ev)


def _group_from_rendezvous(ev: pl.DataFrame) -> pl.DataFrame:
    """Give each CPU collective the device list of the `Rendezvous` nested in it (same thread, same run)."""
    key = r"run_id=RunId: (-?\d+), global_devices=\[([\d, ]*)\]"
    rdv = (
        ev.filter((pl.col("name") == "Rendezvous") & pl.col("a_label").is_not_null())
        .select(
            "pid",
            "tid",
            "ts",
            r_run=pl.col("a_label").str.extract(key, 1).cast(pl.Int64, strict=False),
            r_group=pl.col("a_label").str.extract(key, 2).str.replace_all(" ", ""),
        )
        .drop_nulls("r_group")
        .sort("ts")
    )
    if rdv.height == 0:
        return ev
    ev = ev.with_row_index("_row")
    colls = (
        ev.filter(pl.col("kind") == "comm")
        .select("_row", "pid", "tid", "coll_seq", r_ts="ts", r_end=pl.col("ts") + pl.col("dur"))
        .sort("r_ts")
    )
    found = (
        rdv.join_asof(
            colls, left_on="ts", right_on="r_ts", by=["pid", "tid"], strategy="backward", check_sortedness=False
        )
        .filter((pl.col("ts") <= pl.col("r_end")) & (pl.col("r_run") == pl.col("coll_seq")))
        .unique("_row", keep="first")
        .select("_row", "r_group")
    )
    return (
        ev.join(found, on="_row", how="left")
        .with_columns(
            coll_group=pl.col("r_group"),
            coll_group_size=pl.col("r_group").str.count_matches(r"\d+").cast(pl.Int32),
        )
        .drop("_row", "r_group")
    )


def _place_in_time(ev: pl.DataFrame, xplane: Path | None, warnings: list[str]) -> tuple[pl.DataFrame, str]:
    """Epoch ns when the profile's `xplane.pb` gives the profile start, else relative (one warning saying why:
    no xplane.pb, or the one there unreadable, without a start, impossible or of another profile)."""
    why = "no xplane.pb beside the file"
    if xplane is not None:
        try:
            span = profile_span_ns(xplane)
            why = f"{xplane.name} gives no profile start (empty, or without its Task Environment plane)"
        except (OSError, ValueError, IndexError, EOFError, zlib.error) as e:
            span, why = None, ""
            warnings.append(f"{xplane.name} could not be read ({e}); times are relative")
        if span is not None:
            start, stop = span
            end = ev.select((pl.col("ts") + pl.col("dur")).max()).item() or 0
            if not 0 <= start <= stop <= MAX_NS:
                warnings.append(f"{xplane.name} gives an impossible profile span ({start}..{stop}); times are relative")
            elif end <= stop - start + _STOP_SLACK_NS:
                return ev.with_columns(ts=shifted("ts", start)), "epoch"
            else:
                warnings.append(f"{xplane.name} is from another profile (this trace runs past its stop time)")
            why = ""
    if ev.height and why:
        warnings.append(f"times are relative to the profile start ({why}): not comparable across hosts")
    return ev, "relative"


def xplane_beside(path: str | Path) -> Path | None:
    """The `xplane.pb` written with this JSON: `<stem>.xplane.pb[.gz]`, or the only one in the folder.

    JAX writes `<host>.xplane.pb`, `<host>.trace.json.gz` and `perfetto_trace.json.gz` into one
    folder per process.
    """
    p = Path(path)
    for name in xplane_names(p.name):
        candidate = p.with_name(name)
        if candidate.is_file():
            return candidate
    if p.name.startswith("perfetto_trace."):
        found = sorted(p.parent.glob("*.xplane.pb")) or sorted(p.parent.glob("*.xplane.pb.gz"))
        if len(found) == 1:
            return found[0]
    return None


def xplane_names(trace_name: str) -> list[str]:
    """The names the `xplane.pb` written with the JSON `trace_name` may have (`<stem>.xplane.pb[.gz]`)."""
    m = re.match(r"^(.*?)\.?(?:perfetto_trace|trace)\.json(?:\.gz)?$", trace_name)
    return [m.group(1) + suffix for suffix in (".xplane.pb", ".xplane.pb.gz")] if m and m.group(1) else []


def profile_span_ns(xplane: Path) -> tuple[int, int] | None:
    """(`profile_start_time`, `profile_stop_time`) in Unix-epoch ns from the `Task Environment` plane.

    A minimal proto3 reader of `XSpace.planes` (trace-formats.md §4.3): planes other than
    `Task Environment` are skipped by length, so a large xplane costs its read and one pass over
    its plane headers.
    """
    data = Path(xplane).read_bytes()
    if data[:2] == b"\x1f\x8b":
        limit = max(XPLANE_GUNZIP_RATIO * len(data), 64 << 20)
        data = gzip.GzipFile(fileobj=io.BytesIO(data)).read(limit + 1)
        if len(data) > limit:
            msg = f"gzip data expands past {limit:,} bytes ({XPLANE_GUNZIP_RATIO}x the file)"
            raise ValueError(msg)
    for field, plane in _fields(memoryview(data)):
        if field != 1:
            continue
        stats = _task_environment_stats(_message(plane, "a plane"))
        if stats is not None:
            start, stop = stats.get("profile_start_time"), stats.get("profile_stop_time")
            return (start, stop) if start and stop else None
    return None


def _task_environment_stats(plane: memoryview) -> dict[str, int] | None:
    """Integer stats of an XPlane named `Task Environment` (None for any other plane)."""
    names: dict[int, str] = {}
    values: dict[int, int] = {}
    for field, value in _fields(plane):
        if field == 2 and bytes(_message(value, "a plane's name")) != b"Task Environment":
            return None
        if field == 5:  # map<int64, XStatMetadata>: entry {1: key, 2: {1: id, 2: name}}
            entry = dict(_fields(_message(value, "a stat's metadata")))
            meta = dict(_fields(_message(entry.get(2, memoryview(b"")), "a stat's metadata")))
            if 2 in meta:
                key = _number(entry.get(1, meta.get(1, 0)), "a stat's id")
                names[key] = bytes(_message(meta[2], "a stat's name")).decode("utf-8", "replace")
        elif field == 6:  # XStat {1: metadata_id, 3: uint64, 4: int64}
            stat = dict(_fields(_message(value, "a stat")))
            number = stat.get(4, stat.get(3))
            if isinstance(number, int):
                values[_number(stat.get(1, 0), "a stat's id")] = number - (1 << 64) if number >= 1 << 63 else number
    return {names[k]: v for k, v in values.items() if k in names}


def _fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of a protobuf message: varints as int, length-delimited as a view."""
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield key >> 3, value
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > n:
                msg = "a field runs past the end of the message"
                raise ValueError(msg)
            yield key >> 3, buf[i : i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            msg = f"unsupported protobuf wire type {wire}"
            raise ValueError(msg)


def _message(value: int | memoryview, what: str) -> memoryview:
    """A length-delimited field's bytes; a varint where the schema has a message is a damaged file (taken as
    its length, `bytes(value)` would allocate that many bytes)."""
    if isinstance(value, int):
        msg = f"{what} is a number where a message goes"
        raise ValueError(msg)
    return value


def _number(value: int | memoryview, what: str) -> int:
    """A varint field's value; bytes where the schema has a number are a damaged file."""
    if not isinstance(value, int):
        msg = f"{what} is bytes where a number goes"
        raise ValueError(msg)
    return value


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    """A protobuf varint at `i` (at most 10 bytes, so garbage costs linear time) and the next offset."""
    result = 0
    for shift in range(0, 70, 7):
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
    msg = "a varint longer than 10 bytes (not a protobuf)"
    raise ValueError(msg)


def _device_names(dec: Decoded, events: pl.DataFrame) -> tuple[str, ...]:
    """Device plane names (`/device:GPU:0`), else `cpu:<ordinal>` for each CPU-backend device."""
    labels = dec.metadata.filter(pl.col("name") == "process_name")["label"].drop_nulls()
    planes = sorted(set(labels.filter(labels.str.contains(DEVICE_PLANE)).to_list()))
    if planes:
        return tuple(planes)
    ordinals = events.filter(pl.col("device") >= 0)["device"].unique().sort().to_list()
    return tuple(f"cpu:{d}" for d in ordinals)
