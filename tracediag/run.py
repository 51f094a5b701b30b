"""A run: the event tables of all ranks in one frame, plus what the files said about themselves.

`load` turns what a user points at (files, globs, directories, a saved `.parquet`) into a `Run`;
`Run.save` writes the events and the metadata to one Parquet file that `load` reads back exactly.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import stat
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import orjson
import polars as pl

from tracediag.api_types import checked
from tracediag.errors import NotATraceError, OutputError, RankError, TracediagError, TraceError, one_line, shown
from tracediag.ingest import timeline
from tracediag.ingest.commkernel import check_comm_kernel, mark_comm_kernels
from tracediag.ingest.read import SMALL_FILE_BYTES, read_small, read_traces
from tracediag.ingest.remote import expand, filesystem, is_remote, location_key, read_prefix
from tracediag.ingest.sniff import is_stream, sniff
from tracediag.ingest.trace import FileMeta, FileTrace, ProcessGroup
from tracediag.ingest.workers import forked_after_import, in_worker, map_in_workers
from tracediag.output import write_atomic
from tracediag.schema import EVENT_SCHEMA, MAX_RANK, OPTIONAL_COLUMNS, EventTable, conform, empty_events
from tracediag.vocab import UserRegex, user_regex

FORK_WARNING = (
    "tracediag: this process was forked from one that had imported tracediag; if that process ran polars "
    "work before the fork, polars can hang here (its thread pool does not survive fork): import tracediag "
    "after the fork, or start the process with spawn or forkserver"
)

TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".sqlite.gz", ".nsys-rep")
"""What a directory is searched for (recursively). Files named explicitly may have any name."""
PARQUET_META_KEY = b"tracediag.run"


@checked
@dataclass(frozen=True, slots=True)
class RunMeta:
    """What the files of a run said about themselves, and what reading them skipped or failed."""

    files: tuple[FileMeta, ...] = ()
    errors: tuple[str, ...] = ()
    """One line per file that could not be read (the other files were still read)."""
    ignored: tuple[str, ...] = ()
    """Files found in a directory that are not traces (a manifest, a README, other JSON), one line each."""

    @property
    def ranks(self) -> list[int]:
        """The files' ranks, in order."""
        return sorted(f.rank for f in self.files)

    @property
    def world_size(self) -> int:
        """The job's world size as the traces state it, else the ranks read imply (the highest rank + 1: ranks
        0, 1, 3 are of a world of at least 4)."""
        stated = [f.world_size for f in self.files if f.world_size]
        return max([*stated, len(self.files), *(f.rank + 1 for f in self.files)]) if self.files else 0

    @property
    def hosts(self) -> dict[int, str]:
        """Each rank's host, where its trace names one: the ranks that share a clock."""
        return {f.rank: f.host for f in self.files if f.host}

    @property
    def events_in(self) -> int:
        """Events read from all files."""
        return sum(f.events_in for f in self.files)

    @property
    def skipped(self) -> dict[str, int]:
        """Input events that are not rows, by reason, over all files."""
        total: dict[str, int] = {}
        for f in self.files:
            for reason, n in f.skipped.items():
                total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items()))

    @property
    def process_groups(self) -> dict[str, ProcessGroup]:
        """Process groups by name, merged over files (the first file that describes one wins)."""
        groups: dict[str, ProcessGroup] = {}
        for f in self.files:
            for g in f.process_groups:
                groups.setdefault(g.name, g)
        return groups

    def to_dict(self) -> dict:
        """The metadata's JSON form (kept with the per-rank summaries): `dataclasses.asdict`, built
        field by field (asdict's deep copies cost 0.25 ms a file: 1.3 s of a 5,000-file run's save)."""
        return {"files": tuple(map(_file_dict, self.files)), "errors": self.errors, "ignored": self.ignored}

    @classmethod
    def from_dict(cls, d: dict) -> RunMeta:
        """The metadata a `to_dict` form describes."""
        files = []
        for f in d.get("files", []):
            groups = tuple(
                ProcessGroup(**{**g, "ranks": tuple(g["ranks"]) if g.get("ranks") is not None else None})
                for g in f.get("process_groups", [])
            )
            files.append(
                FileMeta(
                    **{
                        **f,
                        "process_groups": groups,
                        "devices": tuple(f.get("devices", ())),
                        "warnings": tuple(f.get("warnings", ())),
                        "windows": tuple(f.get("windows", ())),
                    }
                )
            )
        return cls(files=tuple(files), errors=tuple(d.get("errors", ())), ignored=tuple(d.get("ignored", ())))


_FILE_FIELDS = tuple(f.name for f in dataclasses.fields(FileMeta))


def _file_dict(f: FileMeta) -> dict:
    """`dataclasses.asdict(f)`."""
    d = {name: getattr(f, name) for name in _FILE_FIELDS}
    d.update(
        process_groups=tuple(dataclasses.asdict(g) for g in f.process_groups),
        skipped=dict(f.skipped),
        coords=dict(f.coords),
    )
    return d


@checked
@dataclass(frozen=True)
class Run:
    """All ranks' events (the `schema.EVENT_SCHEMA` table, sorted by rank then ts) and metadata. Built only
    from an event table (`schema.EventTable`): one without its columns, or with one of another dtype, is a
    one-line `TracediagError`, so every later stage may rely on them."""

    events: EventTable
    meta: RunMeta = field(default_factory=RunMeta)

    @checked
    def save(self, path: str | Path) -> None:
        """Write events and metadata to one Parquet file (`load(path)` reads it back exactly).

        Written beside `path` and renamed over it when complete (`output.write_atomic`); raises
        `OutputError` in one line when it cannot be written.
        """
        import pyarrow as pa  # only here and in `_load_parquet`: most processes never touch Parquet
        import pyarrow.parquet as pq

        table = self.events.to_arrow()
        extra = {PARQUET_META_KEY: orjson.dumps(self.meta.to_dict())}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra})
        try:
            write_atomic(path, lambda f: pq.write_table(table, f, compression="zstd"))
        except pa.ArrowException as e:
            msg = f"{shown(path)}: cannot write Parquet ({one_line(str(e))})"
            raise OutputError(msg) from None


RankResolver = Callable[[str], "int | None"]


def rank_resolver(*, rank_from_filename: str | None = None, rank_map: dict[str, int] | None = None) -> _Resolver:
    """A function from a file path to the rank the user assigned it (None: let the file say).

    `rank_map` keys match a full path or a base name; `rank_from_filename` is a regex whose first
    group (or whole match) is the rank, searched in the base name (by the linear-time engine of
    `tracediag.vocab.user_regex`). A refused regex or a rank out of range is a `RankError`.
    """
    try:
        pattern = user_regex(rank_from_filename, "--rank-from-filename") if rank_from_filename else None
    except ValueError as e:
        raise RankError(str(e)) from None
    mapping = dict(rank_map or {})
    for key, value in mapping.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RANK:
            msg = f"--rank {shown(key)}={value!r}: a rank is a whole number in 0..{MAX_RANK:,}"
            raise RankError(msg)

    return _Resolver(pattern, mapping)


class _Resolver:
    """`rank_resolver`'s function; `many` resolves many paths with one regex search over their names."""

    def __init__(self, pattern: UserRegex | None, mapping: dict[str, int]) -> None:
        self.pattern = pattern
        self.mapping = mapping

    def __call__(self, path: str) -> int | None:
        rank = self.many([path])[0]
        if isinstance(rank, RankError):
            raise rank
        return rank

    def many(self, paths: list[str]) -> list[int | RankError | None]:
        """Each path's rank, None (let the file say) or the `RankError` that `__call__` raises for it."""
        out: list[int | RankError | None] = []
        names = [os.path.basename(p) for p in paths]
        searched = [p for p, name in zip(paths, names) if p not in self.mapping and name not in self.mapping]
        pattern = self.pattern
        found = dict(zip(searched, pattern.first_group([os.path.basename(p) for p in searched]))) if pattern else {}
        for path, name in zip(paths, names):
            if path in self.mapping or name in self.mapping:
                out.append(self.mapping[path if path in self.mapping else name])
            elif pattern is None:
                out.append(None)
            elif (text := found[path]) is None:
                msg = f"{shown(path)}: --rank-from-filename {pattern.pattern!r} does not match the file name"
                out.append(RankError(msg))
            elif not (text.isascii() and text.isdigit()) or int(text) > MAX_RANK:
                msg = f"{shown(path)}: --rank-from-filename matched {text!r}, not a rank in 0..{MAX_RANK:,}"
                out.append(RankError(msg))
            else:
                out.append(int(text))
        return out


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: its path or URL, whether a directory (prefix) scan found it, and for a URL its
    size and modification time as the listing gave them (None for a local path: stat it when needed)."""

    path: str
    in_directory: bool = False
    size: int | None = None
    mtime_ns: int | None = None


def resolve_paths(sources: Iterable[str | Path], storage_options: dict | None = None) -> list[str]:
    """Files named, glob matches, and trace files found under directories, in a stable order."""
    return [f.path for f in resolve_inputs(sources, storage_options)]


STDIN = "/dev/stdin"
"""What an input named ``-`` is read from: this process's standard input, as a stream (`ingest.sniff.is_stream`)."""


def resolve_inputs(sources: Iterable[str | Path], storage_options: dict | None = None) -> list[InputFile]:
    """Every input file once (by its resolved path or URL), in a stable order; ``-`` is standard input.

    A URL (``s3://``, ``gs://``, ``az://``, ``file://``, ...) is listed here through
    `ingest.remote.expand` with `storage_options`: its pattern matched, or its prefix searched as a
    directory. Directory scans and `**` never descend into symlinked directories, so a symlink loop
    can neither repeat a file nor run without end.
    """
    out: list[InputFile] = []
    for src in sources:
        src = STDIN if str(src) == "-" else str(src)
        if is_remote(src):
            out.extend(
                InputFile(f.url, f.in_directory, f.size, f.mtime_ns)
                for f in expand(src, storage_options, suffixes=TRACE_SUFFIXES)
            )
        elif os.path.isdir(src):
            # an entry named like a trace that is not a regular file (a symlink loop or one to nowhere, a
            # FIFO) is read too, so that it fails in one line naming it rather than drop a rank unsaid
            found = [str(p) for p in sorted(Path(src).rglob("*")) if p.name.endswith(TRACE_SUFFIXES) and not p.is_dir()]
            if not found:
                msg = f"{shown(src)}: no trace files in this directory (looked for {', '.join(TRACE_SUFFIXES)})"
                raise TracediagError(msg)
            out.extend(InputFile(p, True) for p in found)
        elif any(ch in src for ch in "*?["):
            matches = _glob(src)
            if not matches:
                msg = f"{shown(src)}: the pattern matches no file"
                raise TracediagError(msg)
            out.extend(InputFile(p) for p in matches)
        else:
            out.append(InputFile(src))
    seen: set[str] = set()
    return [f for f in out if not ((key := location_key(f.path)) in seen or seen.add(key))]


def check_rank_map_names(rank_map: dict[str, int] | None, files: list[InputFile]) -> None:
    """A `RankError` for a `--rank FILE=N` whose FILE is no input's path or base name: ignored, its file
    would keep the rank it names itself (or none) without a word (a typo, `./a.json` for `a.json`)."""
    names = {f.path for f in files} | {os.path.basename(f.path) for f in files}
    unknown = [key for key in rank_map or {} if key not in names]
    if unknown:
        msg = f"--rank {shown(unknown[0])}={rank_map[unknown[0]]}: no input file has this path or base name"
        raise RankError(msg)


def _glob(pattern: str) -> list[str]:
    """Files matching a glob pattern, sorted; `**` spans directories but not symlinked ones."""
    parts = Path(pattern).parts
    first = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
    root = Path(*parts[:first]) if first else Path()
    rest = "/".join(parts[first:])
    try:
        found = [p for p in root.glob(rest) if not p.is_dir()]  # a broken link matched fails in one line
    except (OSError, ValueError):
        found = []
    return sorted(str(p) for p in found)


ReadTask = tuple[str, "int | None", "int | None", "dict | None"]
"""(path or URL, rank assigned, default rank, storage options)."""


def _read_one(args: ReadTask) -> list[FileTrace] | tuple[str, bool]:
    """The file's traces (one per rank it holds), or (one-line error, whether the file is simply not a trace)."""
    path, rank, default_rank, storage_options = args
    try:
        return read_traces(path, rank=rank, default_rank=default_rank, storage_options=storage_options)
    except NotATraceError as e:
        return str(e), True
    except TracediagError as e:
        return str(e), False
    except OSError as e:  # a URL's storage failed (named by `remote.storage_error`)
        return one_line(str(e)), False
    except MemoryError:
        return f"{shown(path)}: out of memory while reading", False
    except Exception as e:  # a reader bug on one file must not stop the others (nor lose the file's name)
        if os.environ.get("TRACEDIAG_DEBUG"):
            raise
        why = one_line(f"{type(e).__name__}: {e}")[:300]
        return f"{shown(path)}: internal error while reading ({why}); please report it", False


@checked
def load(
    sources: str | Path | Sequence[str | Path],
    *,
    jobs: int = 0,
    rank_from_filename: str | None = None,
    rank_map: dict[str, int] | None = None,
    on_file_done: Callable[[str], None] | None = None,
    storage_options: dict | None = None,
    comm_kernel: str | None = None,
) -> Run:
    """Read trace files (or a saved `.parquet`) into a `Run`.

    `comm_kernel`: a regular expression; kernels whose name it finds are communication (kind `comm`,
    `coll_op` from the name), over what `vocab.COMM_KERNEL` knows (`--comm-kernel`).

    `sources` may be URLs (``s3://bucket/run/*.json.gz``, ``gs://``, ``az://``, ``file://``): they
    are listed here and each object is streamed by the process that reads it, with
    `storage_options` (polars' names: ``aws_region``, ``aws_endpoint_url``, ...) over the store's
    usual environment variables.

    `jobs`: processes reading files (0 = one per `WORKER_BYTES` of input, at most one per CPU and per
    file), this one included; the workers import only tracediag, so `load` works in a script without a
    main guard, from stdin, a notebook or a thread (where no worker can start, files are read in this
    process after one warning).
    A file that cannot be read is listed in `run.meta.errors` and the others are still read; if none
    can be read, or two files claim the same rank, a `TracediagError` is raised.
    """
    if forked_after_import():
        warnings.warn(FORK_WARNING, RuntimeWarning, stacklevel=2)
    if isinstance(sources, (str, Path)):
        sources = [sources]
    try:
        comm_kernel = check_comm_kernel(comm_kernel)
    except ValueError as e:
        raise TracediagError(str(e)) from None
    resolved = resolve_inputs(sources, storage_options)
    if not resolved:
        msg = "tracediag.load: `sources` names no trace file"
        raise TracediagError(msg)
    one = resolved[0].path
    if (
        len(resolved) == 1
        and _is_parquet(one, storage_options)
        and (is_remote(one) or not timeline.parquet_is_timeline(one))
    ):
        saved = _load_parquet(one, storage_options)
        if saved is not None:  # else an op-timeline table, read as traces are
            return saved if comm_kernel is None else Run(mark_comm_kernels(saved.events, comm_kernel), saved.meta)
    resolve = rank_resolver(rank_from_filename=rank_from_filename, rank_map=rank_map)
    check_rank_map_names(rank_map, resolved)
    default_rank = 0 if len(resolved) == 1 else None
    tasks: list[ReadTask] = []
    results: dict[str, list[FileTrace] | tuple[str, bool]] = {}
    for f, rank in zip(resolved, resolve.many([f.path for f in resolved])):
        if not isinstance(rank, RankError):
            tasks.append((f.path, rank, default_rank, storage_options))
        elif not f.in_directory:
            results[f.path] = (str(rank), False)
        else:  # maybe not a trace at all (a manifest beside the traces): let reading decide
            tasks.append((f.path, None, default_rank, storage_options))
    results.update(zip([t[0] for t in tasks], _map_files(tasks, jobs, on_file_done)))
    traces, errors, ignored = [], [], []
    for f in resolved:
        path, in_directory = f.path, f.in_directory
        result = results[path]
        if isinstance(result, list):
            traces.extend(result)
        elif result[1] and in_directory:
            ignored.append(result[0])
        else:
            errors.append(result[0])
    if not traces:
        raise TracediagError("\n".join(errors or ignored))
    traces = _check_unique_ranks(traces)
    if comm_kernel is not None:
        traces = [dataclasses.replace(t, events=mark_comm_kernels(t.events, comm_kernel)) for t in traces]
    # one rank per file: each file sorted by time (as it was read: `_in_time_order`; again only where
    # windows of a rank were merged), then the files in rank order, is the table sorted by (rank, ts)
    # with ties in file order, for less than a sort of the whole table
    events = pl.concat(
        [_by_time(t.events) for t in sorted(traces, key=lambda t: t.meta.rank)], rechunk=len(traces) > _CHUNKS
    )
    meta = RunMeta(files=tuple(t.meta for t in traces), errors=tuple(errors), ignored=tuple(ignored))
    return Run(events=events, meta=meta)


_CHUNKS = 64
"""A run of more files than this gets its table's columns in one chunk each (a copy of the table): every
later query walks a column's chunks one by one. 5,000 Kineto windows (14.6M rows): the copy costs 0.23 s
and saves 1.0 s of the Parquet write alone (to Arrow 0.95 -> 0.2 s, written 2.35 -> 1.87 s)."""
_PARALLEL_SORT_ROWS = 1_000_000
"""Below this many rows a file's events are sorted on one thread: the pool's parallel merge costs
about a quarter more CPU there (75k rows: 4.2 against 3.4 ms) and finishes no sooner."""


def _by_time(events: pl.DataFrame) -> pl.DataFrame:
    """One file's events sorted by time, ties in file order (as they are when read with others:
    `ingest.read.read_small`; telling costs one pass, a sort's call costs as much on a small file)."""
    if events.get_column("ts").is_sorted():
        return events
    return events.sort("ts", maintain_order=True, multithreaded=events.height >= _PARALLEL_SORT_ROWS)


def _map_files(
    tasks: list[ReadTask], jobs: int, on_file_done: Callable[[str], None] | None
) -> list[list[FileTrace] | tuple[str, bool]]:
    cores = os.cpu_count() or 1
    jobs = min(jobs if jobs > 0 else _paying_jobs(tasks), cores, len(tasks))
    if any(is_stream(t[0]) for t in tasks):
        jobs = 1  # a pipe (`<(zcat ...)`) is this process's own: a worker cannot open it
    groups = _groups(tasks, jobs)
    if jobs <= 1:
        results: list[list[FileTrace] | tuple[str, bool]] = []
        for group in groups:
            results.extend(_read_group(group))
            if on_file_done:
                for task in group:
                    on_file_done(task[0])
        return results
    done = (lambda i: [on_file_done(task[0]) for task in groups[i]]) if on_file_done else None
    read = map_in_workers(_read_shipped, groups, jobs, crashed=_group_crashed, on_done=done, in_caller=True)
    return [result for group in read for result in (group.unpack() if isinstance(group, _Shipped) else group)]


SMALL_GROUP = 256
"""Small local files are read this many at a time (`ingest.read.read_small`): a polars call costs about
0.1 ms whatever its rows, and reading a 3k-event Kineto window alone makes a hundred of them."""


def _groups(tasks: list[ReadTask], jobs: int) -> list[list[ReadTask]]:
    """The tasks in groups, in order: runs of small local files together (at most `SMALL_GROUP`, fewer so
    that each of `jobs` processes gets about four: `-j 2` on four files reads one a process), every other
    file alone."""
    size = min(SMALL_GROUP, -(-len(tasks) // (4 * jobs))) if jobs > 1 else SMALL_GROUP
    groups: list[list[ReadTask]] = []
    run: list[ReadTask] = []
    for task in tasks:
        if _is_small(task[0]):
            run.append(task)
            if len(run) == size:
                groups.append(run)
                run = []
            continue
        if run:
            groups.append(run)
            run = []
        groups.append([task])
    if run:
        groups.append(run)
    return groups


def _is_small(path: str) -> bool:
    """A local regular file that `read_small` may read with others (it checks its content itself)."""
    if is_remote(path):
        return False
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= SMALL_FILE_BYTES


def _read_group(group: list[ReadTask]) -> list[list[FileTrace] | tuple[str, bool]]:
    """`_read_one` of each task; small files read together (`read_small`), those it leaves read alone."""
    if len(group) == 1:
        return [_in_time_order(_read_one(group[0]))]
    try:
        together = read_small([task[:3] for task in group])
    except Exception:  # a bug of the batch must not cost a file: each is read alone, as ever
        if os.environ.get("TRACEDIAG_DEBUG"):
            raise
        together = [None] * len(group)
    return [_in_time_order(_read_one(task) if read is None else read) for task, read in zip(group, together)]


def _in_time_order(result: list[FileTrace] | tuple[str, bool]) -> list[FileTrace] | tuple[str, bool]:
    """A file's traces with their events sorted by time (`_by_time`), as soon as the file is read: `load`
    then finds them sorted, instead of sorting every file at its end while it holds the files' unsorted
    tables too (8 A100 ranks of 75k events: 39 MB held twice)."""
    if isinstance(result, tuple):
        return result
    return [dataclasses.replace(t, events=_by_time(t.events)) for t in result]


WORKER_BYTES = 384 << 20
"""Input a reading process must have before `jobs=0` starts another. A worker costs about 0.35 CPU-s to
start (an interpreter, polars, tracediag) and shipping its tables back costs about half of reading
them, so it shortens a run only when each process gets a second or more of reading (about 350 MB of
JSON). Measured on 2 cores, 33 MB Kineto files: 8 of them (266 MB) took the same wall time with a worker
as without, for 38% more CPU; 24 (800 MB) took 13% less wall time for 30% more CPU."""

_GZIP_RATIO = 8
"""A gzipped trace's bytes count this many times: Kineto JSON shrinks about 8-10x."""


def _paying_jobs(tasks: list[ReadTask]) -> int:
    """How many processes `jobs=0` reads with: one per `WORKER_BYTES` of input (a file of an object
    store counts as that much: fetching it is waiting, which a worker overlaps)."""
    return max(1, sum(input_bytes(path) for path, *_ in tasks) // WORKER_BYTES)


def input_bytes(path: str) -> int:
    """About how many bytes of trace `path` holds: its size, a gzipped file's times `_GZIP_RATIO`, a file
    of an object store `WORKER_BYTES` (fetching it is waiting, which a worker overlaps), 0 when it
    cannot be seen."""
    if is_remote(path):
        return WORKER_BYTES
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError):
        return 0
    return size * (_GZIP_RATIO if path.endswith(".gz") else 1)


def _read_shipped(group: list[ReadTask]) -> list[list[FileTrace] | tuple[str, bool]] | _Shipped:
    """`_read_group`, its results packed as `_Shipped` in a worker process (to be sent to the caller)."""
    results = _read_group(group)
    return _Shipped.pack(results) if in_worker() else results


@dataclass(frozen=True)
class _Shipped:
    """A group's results as a worker sends them: its tables one Arrow IPC stream, and per file its traces'
    metadata and heights (or its error). Pickling each table costs about five times as much (a group of
    256 Kineto windows: 0.23 + 0.13 s against 0.04 + 0.04)."""

    events: bytes
    results: list[list[tuple[FileMeta, int]] | tuple[str, bool]]

    @classmethod
    def pack(cls, results: list[list[FileTrace] | tuple[str, bool]]) -> _Shipped | list:
        frames = [t.events for r in results if isinstance(r, list) for t in r]
        if not frames:
            return results
        buffer = io.BytesIO()
        try:
            pl.concat(frames).write_ipc(buffer, compression="uncompressed")
        except pl.exceptions.PolarsError:  # tables that do not stack (no reader's): each pickled
            return results
        shapes = [[(t.meta, t.events.height) for t in r] if isinstance(r, list) else r for r in results]
        return cls(buffer.getvalue(), shapes)

    def unpack(self) -> list[list[FileTrace] | tuple[str, bool]]:
        events = pl.read_ipc(self.events)
        out: list[list[FileTrace] | tuple[str, bool]] = []
        at = 0
        for r in self.results:
            if not isinstance(r, list):
                out.append(r)
                continue
            traces = []
            for meta, height in r:
                traces.append(FileTrace(events=events.slice(at, height), meta=meta))
                at += height
            out.append(traces)
        return out


def _group_crashed(group: list[ReadTask], why: str) -> list[tuple[str, bool]]:
    return [(f"{shown(task[0])}: {why} while reading it (out of memory?)", False) for task in group]


RANK_HINT = "give ranks explicitly with --rank-from-filename REGEX or --rank FILE=N"
"""What to do when files claim one rank and are no windows of one timeline."""


def _check_unique_ranks(traces: list[FileTrace]) -> list[FileTrace]:
    """One trace per rank: the files of one rank that are profiler windows of its timeline merged
    (`merge_windows`); two files claiming one rank otherwise are a `RankError` naming both."""
    by_rank: dict[int, list[FileTrace]] = {}
    for t in traces:
        by_rank.setdefault(t.meta.rank, []).append(t)
    out = []
    for rank, group in by_rank.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        why = windows_problem(group)
        if why is not None:
            msg = (
                f"{shown(group[0].meta.path)} and {shown(group[1].meta.path)} both claim rank {rank} ({why}); "
                f"{RANK_HINT}"
            )
            raise RankError(msg)
        out.append(merge_windows(group))
    return out


def _window(t: FileTrace) -> tuple[int, int] | None:
    """The recorded time window of a file's events (first start, last end); None without events."""
    ev = t.events
    return (ev["ts"].min(), (ev["ts"] + ev["dur"]).max()) if ev.height else None


def _host_pids(t: FileTrace) -> set[int]:
    return set(t.events.filter(pl.col("device") == -1).get_column("pid").drop_nulls().unique().to_list())


def windows_problem(group: list[FileTrace]) -> str | None:
    """Why the files of one rank are not profiler windows of one process's timeline (None when they are).

    Profiler windows (`schedule(..., repeat=N)` with `tensorboard_trace_handler`: one file per window)
    are files of one format on the Unix-epoch clock whose recorded time windows do not overlap, and
    that agree on the world size, the backend and the host process id where they state them."""
    if len({t.meta.format for t in group}) > 1:
        return "files of different formats"
    if any(t.meta.time_base != "epoch" for t in group):
        return "relative times: profiler windows cannot be told apart"
    for label, values in (
        ("world sizes", [t.meta.world_size for t in group]),
        ("backends", [t.meta.backend for t in group]),
    ):
        if len({v for v in values if v is not None}) > 1:
            return f"{label} differ"
    pids = [p for p in map(_host_pids, group) if p]
    if len(pids) > 1 and not set.intersection(*pids):
        return "different host processes"
    spans = [_window(t) for t in group]
    if any(s is None for s in spans):
        return "a file without events"
    ordered = sorted(s for s in spans if s is not None)
    if any(nxt[0] < prev[1] for prev, nxt in itertools.pairwise(ordered)):
        return "their recorded time windows overlap"
    return None


def merge_windows(group: list[FileTrace]) -> FileTrace:
    """The profiler windows of one rank (`windows_problem` is None) as one trace: events concatenated
    (each keeps its step numbers, as the profiler numbered them), counts summed, the first window's
    file its `path` and the others its `windows`."""
    group = sorted(group, key=lambda t: _window(t) or (0, 0))
    first = group[0].meta
    skipped: dict[str, int] = {}
    for t in group:
        for reason, n in t.meta.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    warnings = list(first.warnings)
    for t in group[1:]:
        warnings += [w for w in t.meta.warnings if w not in warnings]
    meta = dataclasses.replace(
        first,
        world_size=next((t.meta.world_size for t in group if t.meta.world_size), None),
        backend=next((t.meta.backend for t in group if t.meta.backend), None),
        process_groups=next((t.meta.process_groups for t in group if t.meta.process_groups), ()),
        devices=next((t.meta.devices for t in group if t.meta.devices), ()),
        events_in=sum(t.meta.events_in for t in group),
        skipped=dict(sorted(skipped.items())),
        warnings=tuple(warnings),
        windows=tuple(t.meta.path for t in group[1:]),
    )
    return FileTrace(events=pl.concat([t.events for t in group]), meta=meta)


def _is_parquet(path: str, storage_options: dict | None = None) -> bool:
    if is_remote(path):
        try:
            return sniff(path, read_prefix(path, 64, storage_options)) == "parquet"
        except (TraceError, OSError):
            return False  # its reader reports it
    if not os.path.isfile(path):  # a pipe is read once, by the trace reader
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    try:
        return sniff(path, head) == "parquet"
    except TraceError:
        return False


def _load_parquet(path: str, storage_options: dict | None = None) -> Run | None:
    """A run saved by `Run.save` (None: the file is an op-timeline table, `ingest.timeline`); a damaged
    or altered file is a one-line `TraceError`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if is_remote(path):
            fs, inner = filesystem(path, storage_options)
            table = pq.read_table(inner, filesystem=fs)
        else:
            table = pq.read_table(path)
    except TracediagError as e:
        raise TraceError(path, str(e).split(": ", 1)[-1]) from None
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise TraceError(path, f"cannot read Parquet ({one_line(str(e))})") from None
    raw = (table.schema.metadata or {}).get(PARQUET_META_KEY)
    if raw is None:
        if timeline.is_timeline(table.column_names):
            return None
        raise TraceError(path, "a Parquet file not written by `tracediag ingest`")
    try:
        meta = msgspec.convert(orjson.loads(raw), RunMeta)
    except (orjson.JSONDecodeError, msgspec.ValidationError) as e:
        raise TraceError(path, f"the saved run's metadata is damaged ({e})") from None
    missing = [c for c in EVENT_SCHEMA if c not in table.column_names and c not in OPTIONAL_COLUMNS]
    if missing:
        raise TraceError(path, f"the saved event table lacks column(s) {', '.join(missing)}")
    try:
        frame = pl.from_arrow(table)
        events = conform(frame) if frame.height else empty_events()
    except (pl.exceptions.PolarsError, pa.ArrowException) as e:
        raise TraceError(path, f"the saved event table has columns of the wrong type ({e})") from None
    if events.height != frame.height:
        raise TraceError(path, f"the saved event table has {frame.height - events.height:,} impossible rows")
    return Run(events=events, meta=meta)
