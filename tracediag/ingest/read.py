"""Read one trace file of any supported format into a `FileTrace`, the format found from content."""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack, contextmanager, suppress
from typing import TYPE_CHECKING, Any

import polars as pl

from tracediag.errors import NotATraceError, RankError, TracediagError, TraceError
from tracediag.ingest import chrome, kineto, timeline
from tracediag.ingest.remote import expand, is_remote, local_copy
from tracediag.ingest.sniff import iter_blocks, map_plain, peek_head, sniff

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tracediag.ingest.trace import FileTrace


def read_file(
    path: str | Path,
    *,
    rank: int | None = None,
    default_rank: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> FileTrace:
    """The event table of one trace file of one rank (`read_traces`); an op-timeline table of several
    ranks is a `TraceError` (read it with `read_traces` or `tracediag.load`)."""
    traces = read_traces(path, rank=rank, default_rank=default_rank, storage_options=storage_options)
    if len(traces) != 1:
        raise TraceError(
            str(path),
            f"an op-timeline table of {len(traces):,} ranks is read whole: "
            "analyse it without --executor (or load it with tracediag.load)",
        )
    return traces[0]


def read_traces(
    path: str | Path,
    *,
    rank: int | None = None,
    default_rank: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[FileTrace]:
    """The event tables of one file: one rank's trace, or each rank's rows of an op-timeline table."""
    read = _read(path, rank=rank, default_rank=default_rank, storage_options=storage_options)
    return read if isinstance(read, list) else [read]


def _read(
    path: str | Path,
    *,
    rank: int | None = None,
    default_rank: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> FileTrace | list[FileTrace]:
    """The event table of one trace file (Kineto/Chrome JSON, JAX JSON or Nsight Systems SQLite), or
    those of the ranks of an op-timeline table (Parquet, CSV, JSON Lines: `ingest.timeline`).

    `path` may be a URL (``s3://``, ``gs://``, ``az://``, ``file://``: `ingest.remote`), read as a
    stream with `storage_options` (an SQLite export or ``.nsys-rep`` is first copied to a temporary
    file). `rank` overrides the rank the file names; `default_rank` applies only when it names none.
    Raises `TraceError` (one line: file and problem) or `RankError`.
    """
    path = str(path)
    if is_remote(path) and path.endswith(".nsys-rep"):
        return _read_copy(path, rank, default_rank, storage_options)
    if path.endswith(".nsys-rep"):
        from tracediag.ingest.nsys import export_nsys_rep

        path = str(export_nsys_rep(path))
    # one open: a pipe can be read only once
    head, blocks = peek_head(iter_blocks(path, storage_options=storage_options), timeline.HEAD_BYTES)
    table = timeline.table_format(head)
    if table is not None:
        return _read_timeline(path, blocks, table, rank)
    try:
        fmt = sniff(path, head)
    except TraceError:
        blocks.close()
        raise
    if fmt == "parquet":
        mapped = map_plain(path)
        if mapped is not None:
            mapped.close()
        source = path if mapped is not None else b"".join(blocks)  # a local file is read in place
        if timeline.parquet_is_timeline(source):
            blocks.close()
            return timeline.read_timeline(path, source, "parquet", rank=rank)
    if fmt != "json":
        blocks.close()
    if fmt == "sqlite" and is_remote(path):
        return _read_copy(path, rank, default_rank, storage_options)
    if fmt == "sqlite":
        from tracediag.ingest.nsys import read_nsys

        return read_nsys(path, rank=rank, default_rank=default_rank)
    if fmt != "json":
        raise NotATraceError(path, f"a {fmt} file is not a trace; pass it on its own to load a saved run")
    mapped = map_plain(path)
    if mapped is not None:
        blocks.close()
    decoded = chrome.decode(blocks if mapped is None else mapped, path)
    if _is_jax(decoded):
        from tracediag.ingest import jax

        if is_remote(path):
            with _xplane_copy(path, storage_options) as xplane:
                return jax.to_events(decoded, path, rank=rank, default_rank=default_rank, xplane=xplane)
        return jax.to_events(decoded, path, rank=rank, default_rank=default_rank)
    return kineto.to_events(decoded, path, rank=rank, default_rank=default_rank)


def _read_timeline(path: str, blocks: Iterator[bytes], fmt: str, rank: int | None) -> list[FileTrace]:
    """An op-timeline table read from the file itself when it is local and uncompressed, else from its content."""
    mapped = map_plain(path)
    if mapped is None:
        return timeline.read_timeline(path, blocks, fmt, rank=rank)
    mapped.close()
    blocks.close()
    return timeline.read_timeline(path, path, fmt, rank=rank)


def _read_copy(
    url: str, rank: int | None, default_rank: int | None, storage_options: dict[str, Any] | None
) -> FileTrace:
    """An Nsight Systems export at `url`, read from a temporary local copy (SQLite needs a file);
    the trace and any error name the URL, not the copy."""
    from tracediag.ingest.nsys import read_nsys

    with local_copy(url, storage_options) as copy:
        try:
            trace = read_nsys(copy, rank=rank, default_rank=default_rank)
        except TraceError as e:
            raise type(e)(url, e.problem.replace(str(copy), url)) from None
        except RankError as e:
            raise RankError(str(e).replace(str(copy), url)) from None
    return dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, path=url))


@contextmanager
def _xplane_copy(url: str, storage_options: dict[str, Any] | None) -> Iterator[Path | None]:
    """A local copy of the `xplane.pb` beside a JAX trace at `url` (as `jax.xplane_beside` finds one
    beside a file), or None."""
    from tracediag.ingest.jax import xplane_names

    folder, _, name = url.rpartition("/")
    found = []
    for pattern in [
        *xplane_names(name),
        *(["*.xplane.pb", "*.xplane.pb.gz"] if name.startswith("perfetto_trace.") else []),
    ]:
        try:
            found = [f.url for f in expand(f"{folder}/{pattern}", storage_options) if f.size is not None]
        except TracediagError:
            continue
        if found:
            break
    with ExitStack() as stack:
        copy = None
        if len(found) == 1:
            with suppress(TraceError):  # unreadable: the times stay relative, as with no xplane
                copy = stack.enter_context(local_copy(found[0], storage_options))
        yield copy


def _is_jax(decoded: chrome.Decoded) -> bool:
    """JAX writes `metadata.highres-ticks` and names its processes `/host:CPU`, `/device:...`."""
    meta = decoded.top.get("metadata")
    if isinstance(meta, dict) and "highres-ticks" in meta:
        return True
    label = pl.col("label")
    named = (pl.col("name") == "process_name") & (label.str.starts_with("/host:") | label.str.starts_with("/device:"))
    return bool(decoded.metadata.select(named.any()).item())
