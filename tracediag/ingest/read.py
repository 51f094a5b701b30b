"""Read one trace file of any supported format into a `FileTrace`, the format found from content."""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracediag.errors import NotATraceError, RankError, TracediagError, TraceError
from tracediag.ingest import chrome, kineto, timeline
from tracediag.ingest.remote import expand, is_remote, local_copy
from tracediag.ingest.sniff import GZIP_MAGIC, iter_blocks, map_plain, peek_head, sniff
from tracediag.ingest.twice import doubled_problem

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
    traces = read if isinstance(read, list) else [read]
    for trace in traces:
        if (problem := doubled_problem(trace.events)) is not None:
            raise TraceError(str(path), problem)
    return traces


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
    head, blocks, lead = peek_head(iter_blocks(path, storage_options=storage_options), timeline.HEAD_BYTES)
    table = timeline.table_format(head)
    if table is not None:
        return _read_timeline(path, blocks, table, rank)
    try:
        fmt = sniff(path, head)
    except TraceError:
        blocks.close()
        if path.endswith((".xplane.pb", ".xplane.pb.gz")):  # JAX's protobuf: its events are in the JSON beside it
            problem = "an xplane.pb is read only beside its JSON trace: pass the <host>.trace.json.gz of its folder"
            raise TraceError(path, problem) from None
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
    decoded = chrome.decode(blocks if mapped is None else mapped, path, lead=lead)
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
    if _jax_meta(decoded.top):
        return True
    label = pl.col("label")
    named = (pl.col("name") == "process_name") & (label.str.starts_with("/host:") | label.str.starts_with("/device:"))
    return bool(decoded.metadata.select(named.any()).item())


SMALL_FILE_BYTES = chrome.SMALL_BYTES
"""A local file of at most this many bytes (gunzipped) may be read with others (`read_small`)."""


def read_small(tasks: list[tuple[str, int | None, int | None]]) -> list[list[FileTrace] | None]:
    """`read_traces(path, rank=, default_rank=)` of each of many small local files, read together: their
    events decoded into one set of columns (`chrome.decode_small`) and their Kineto semantics applied to
    all at once (`kineto.to_events_small`), which costs a fraction of reading each alone (the fixed cost
    of a polars call, paid per batch instead of per file). None for a file to be read alone: one that is
    not a small local Kineto JSON file, or that its reader would refuse or read otherwise (`read_traces`
    then says what the file alone says: a damaged file in a batch never changes the others)."""
    out: list[list[FileTrace] | None] = [None] * len(tasks)
    gunzip = _gunzipper(len(tasks))
    # each file's bytes live until the scanner read them: a batch never holds all of its files' at once
    batch, _ = chrome.decode_small(_small_doc(path, gunzip) for path, _, _ in tasks)
    if batch is None:
        return out
    batch = batch.without(_jax_files(batch))
    paths, ranks, defaults = ([task[k] for task in tasks] for k in range(3))
    for f, trace in kineto.to_events_small(batch, paths, ranks, defaults).items():
        out[f] = None if doubled_problem(trace.events) else [trace]  # read alone, it is refused
    return out


_SPACE = re.compile(rb"[ \t\r\n]*")


def _small_doc(path: str, gunzip: Callable[[bytes], bytes | None]) -> bytes | memoryview | None:
    """A local file's content (gunzipped by `gunzip`) when it is small and starts with a JSON document's
    `{` or `[` that is no op-timeline table; else None (it is read alone)."""
    if is_remote(path) or path.endswith(".nsys-rep"):
        return None
    file = Path(path)
    try:
        if not file.is_file() or file.stat().st_size > SMALL_FILE_BYTES:  # a pipe is read once, alone
            return None
        with file.open("rb") as f:
            data = f.read(SMALL_FILE_BYTES + 1)
    except OSError:
        return None
    if data[:2] == GZIP_MAGIC:
        data = gunzip(data)
        if data is None:
            return None
    start = _SPACE.match(data).end()  # as `sniff.peek_head` and `chrome.decode` skip it (a byte-order mark: alone)
    if len(data) > SMALL_FILE_BYTES or data[start : start + 1] not in (b"{", b"["):
        return None
    if timeline.table_format(data[start : start + timeline.HEAD_BYTES]):
        return None
    return memoryview(data)[start:] if start else data  # not a copy


ARROW_GUNZIP_FILES = 32
"""From this many files a batch gunzips with pyarrow's zlib (0.79 against 1.13 ms for a 61 kB Kineto
window; its import costs about 25 ms), unless ISA-L is installed."""


def _gunzipper(files: int) -> Callable[[bytes], bytes | None]:
    """How a batch of `files` gunzips: with ISA-L where the optional `isal` is installed (the `gunzip`
    extra: 0.26 ms a 61 kB Kineto window, against 0.86 by pyarrow and 1.13 by zlib), else pyarrow from
    `ARROW_GUNZIP_FILES` files, else zlib. All give the same bytes or decline the same files."""
    try:
        from isal import isal_zlib
    except ImportError:
        return _arrow_gunzip if files >= ARROW_GUNZIP_FILES else functools.partial(_gunzip, zlib)
    return functools.partial(_gunzip, isal_zlib)


def _gunzip(module: Any, data: bytes) -> bytes | None:
    """The gunzipped bytes (at most `SMALL_FILE_BYTES` + 1) of one complete gzip member, by `module`
    (`zlib` or ISA-L's `isal_zlib`, which mirrors it); None otherwise (cut short, several members, not gzip:
    `sniff.iter_blocks` reads it alone, as it says)."""
    unzip = module.decompressobj(wbits=31)
    try:
        out = unzip.decompress(data, SMALL_FILE_BYTES + 1)
    except module.error:
        return None
    return out if unzip.eof and not unzip.unused_data and not unzip.unconsumed_tail else None


def _arrow_gunzip(data: bytes) -> bytes | None:
    """`_gunzip` by pyarrow: its bytes where it reads the file (it checks each member's CRC and size, and
    reads several members as `gzip` does); None where it does not (cut short, trailing bytes: read alone),
    or where the bytes are more than the gzip trailer says (its last member's size: several members, a
    bomb). Reading just that many costs a quarter less than reading `SMALL_FILE_BYTES`."""
    import pyarrow as pa

    size = int.from_bytes(data[-4:], "little")
    if size > SMALL_FILE_BYTES:
        return None
    try:
        out = pa.input_stream(pa.py_buffer(data), compression="gzip").read(size + 1)
    except (pa.ArrowException, OSError):
        return None
    return out if len(out) <= size else None


def _jax_files(batch: chrome.Batch) -> set[int]:
    """The files of a batch that are JAX traces (`_is_jax`: read alone, by `ingest.jax`)."""
    jax = {f for f, top in zip(batch.files, batch.tops) if _jax_meta(top)}
    label = pl.col("label")
    named = (pl.col("name") == "process_name") & (label.str.starts_with("/host:") | label.str.starts_with("/device:"))
    return jax | set(batch.decoded.metadata.filter(named).get_column("file").unique().to_list())


def _jax_meta(top: dict[str, Any]) -> bool:
    meta = top.get("metadata")
    return isinstance(meta, dict) and "highres-ticks" in meta
