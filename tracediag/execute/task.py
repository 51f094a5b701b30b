"""The per-rank task: read rank files, derive their tables, write them as Parquet, return manifest rows.

This is the only code that runs on the workers, whatever the engine. Only the manifest rows (small
dicts) travel back; the tables go to the output location, a local directory or an object-store
URL (``s3://``, ``gs://``, ``az://`` through polars' storage options). Layout under the output::

    ranks/rank=00003/<table>.parquet   the rank's summary (`derive.summary.RankSummary.write`)
    events/rank=00003.parquet          the event table (ingest)
    done/<key>.parquet                 the task's manifest row, last

Every file is written to a temporary name and renamed (one PUT on an object store), and the row in
``done/`` is written last, so a retried task replaces what an earlier attempt wrote and a rank
counts as finished only when all of its files are there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

from tracediag.derive.per_rank import rank_tables
from tracediag.derive.summary import RankSummary
from tracediag.errors import NotATraceError, TracediagError
from tracediag.ingest.commkernel import mark_comm_kernels
from tracediag.ingest.remote import is_remote
from tracediag.ingest.trace import FileTrace
from tracediag.parquet import is_url, join, write_parquet
from tracediag.run import RANK_HINT, _by_time, merge_windows, windows_problem

MANIFEST_SCHEMA: dict[str, pl.DataType] = {
    "key": pl.String(),
    "path": pl.String(),
    "rank": pl.Int32(),
    "ok": pl.Boolean(),
    "not_a_trace": pl.Boolean(),
    "error": pl.String(),
    "events": pl.Int64(),
    "bytes": pl.Int64(),
    "mtime_ns": pl.Int64(),
    "seconds": pl.Float64(),
    "attempt": pl.Int32(),
    "worker": pl.String(),
    "step_regex": pl.String(),
    "kept_events": pl.Boolean(),
    "tables": pl.String(),
    "meta": pl.String(),
}
"""One row per input file: ``rank`` as read (null when unread), ``ok`` or the one-line ``error``,
input ``bytes`` and ``mtime_ns`` (a resumed run reuses the row only when they still match), the task's
``seconds`` and ``attempt`` (1 = first try; null on object stores), ``worker`` (host:pid), whether
the event table was written too (``kept_events``), the per-rank tables a summary holds (``tables``: a
resumed run redoes summaries written by a version with other tables) and the file's metadata (`ingest.trace.FileMeta`)
as JSON."""


@dataclass(frozen=True, slots=True)
class RankTask:
    """What a worker needs to summarise one file (small: it travels to the worker)."""

    path: str
    out: str
    rank: int | None = None
    """The rank the user assigned (None: the file says)."""
    default_rank: int | None = None
    step_regex: str | None = None
    comm_kernel: str | None = None
    """`--comm-kernel`: kernels whose name it finds are communication (`ingest.commkernel`)."""
    keep_events: bool = False
    """Also write the event table (`tracediag ingest`)."""
    storage_options: dict[str, Any] | None = field(default=None, hash=False)
    """polars' object-store options, for the outputs and for an input URL (`ingest.remote`)."""
    size: int | None = None
    """An input URL's size and modification time as the driver's listing gave them (a local file is stat'ed)."""
    mtime_ns: int | None = None

    @property
    def key(self) -> str:
        """Stable name of this input (its path, assigned rank and `comm_kernel`) under ``done/``: a resumed run
        with another `comm_kernel` does the file again."""
        named = f"{self.path}\0{self.rank}" + ("" if self.comm_kernel is None else f"\0{self.comm_kernel}")
        return hashlib.sha1(named.encode()).hexdigest()[:20]


def rank_dir(out: str, rank: int) -> str:
    """Where rank `rank`'s summary tables go under `out`."""
    return join(out, "ranks", f"rank={rank:05d}")


def done_path(out: str, key: str) -> str:
    """The marker of a finished task `key` under `out` (its manifest row)."""
    return join(out, "done", f"{key}.parquet")


def _claim_attempt(out: str, key: str) -> int | None:
    """The attempt number of this run of the task (1, 2, ...): local outputs count attempts with
    exclusively created marker files, so a retry after a worker died knows it is one."""
    if is_url(out):
        return None
    folder = os.path.join(out, "attempts")
    os.makedirs(folder, exist_ok=True)
    n = 1
    while True:
        try:
            os.close(os.open(os.path.join(folder, f"{key}.{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def input_stat(task: RankTask) -> tuple[int | None, int | None]:
    """The input's size and modification time (ns): a URL's from the listing, a local file's from disk."""
    if is_remote(task.path):
        return task.size, task.mtime_ns
    try:
        st = os.stat(task.path)
    except OSError:
        return None, None
    return st.st_size, st.st_mtime_ns


def manifest_row(task: RankTask, **values: Any) -> dict[str, Any]:
    """A manifest row with every `MANIFEST_SCHEMA` column (unset ones null)."""
    size, mtime = input_stat(task)
    row: dict[str, Any] = dict.fromkeys(MANIFEST_SCHEMA)
    row.update(
        key=task.key,
        path=task.path,
        bytes=size,
        mtime_ns=mtime,
        step_regex=task.step_regex,
        kept_events=task.keep_events,
        tables=",".join(sorted(RankSummary.names())),
        ok=False,
        not_a_trace=False,
        worker=f"{socket.gethostname()}:{os.getpid()}",
    )
    row.update(values)
    return row


Read = tuple[RankTask, FileTrace, int | None, float]
CLAIMED = "both claim rank"
"""The words of the error row of files of one rank that are no windows of one timeline."""


def _windows_joined(read: list[Read]) -> tuple[list[Read], list[dict[str, Any]]]:
    """The files read by one task, those of one rank joined as its profiler windows (`run.merge_windows`:
    one timeline, its steps as the profiler numbered them): each of them keeps its task and gets the
    joined trace. Files of one rank that are not windows of one timeline are error rows naming both."""
    by_rank: dict[int, list[Read]] = {}
    for r in read:
        by_rank.setdefault(r[1].meta.rank, []).append(r)
    out: list[Read] = []
    failed: list[dict[str, Any]] = []
    for rank, group in by_rank.items():
        if len(group) == 1:
            out += group
            continue
        traces = [t for _, t, _, _ in group]
        why = windows_problem(traces)
        if why is not None:
            paths = [t.meta.path for t in traces]
            error = f"{paths[0]} and {paths[1]} {CLAIMED} {rank} ({why}); {RANK_HINT}"
            failed += [manifest_row(task, error=error, attempt=attempt) for task, _, attempt, _ in group]
            continue
        joined = merge_windows(traces)
        out += [(task, joined, attempt, seconds) for task, _, attempt, seconds in group]
    return out, failed


def summarize_traces(traces: list[FileTrace], step_regex: str | None) -> RankSummary:
    """The summary of `traces`, one per rank (its profiler windows joined), in memory: their events in
    rank order, each rank's in time order (as `run.load` orders a run's), derived in one pass
    (`derive.per_rank.rank_tables`). `summarize_files` writes it; `execute.streamed` keeps it."""
    ordered = sorted(traces, key=lambda t: t.meta.rank)
    events = pl.concat([_by_time(t.events) for t in ordered]) if len(ordered) > 1 else _by_time(ordered[0].events)
    return rank_tables(events, step_regex=step_regex)


def summarize_files(tasks: list[RankTask]) -> list[dict[str, Any]]:
    """Summarise files where they lie and return their manifest rows (see the module docstring).

    Several small files go in one task: their tables are derived in one pass over their events
    (every per-rank table is computed per rank, so this equals one pass per file) and written per
    rank. A file that is not a readable trace gives a row with ``ok`` false and the one-line reason
    (it would fail again on retry; so does a missing object or a denied access). Anything else
    (storage errors of an input URL or of the output, memory) is raised for the engine to retry.
    """
    from tracediag.ingest.read import read_file, read_small  # the readers load lazily on the worker

    rows: list[dict[str, Any]] = []
    read = []
    attempts = [_claim_attempt(task.out, task.key) for task in tasks]
    started = time.perf_counter()
    # small local files read together (equal to each read alone); the others, and those it leaves, alone
    try:
        together = read_small([(t.path, t.rank, t.default_rank) for t in tasks]) if len(tasks) > 1 else [None]
    except Exception:  # a bug of the batch must not cost a file: each is read alone, as ever
        if os.environ.get("TRACEDIAG_DEBUG"):
            raise
        together = [None] * len(tasks)
    share = (time.perf_counter() - started) / len(tasks)
    for task, attempt, batched in zip(tasks, attempts, together):
        started = time.perf_counter() - share
        try:
            trace = (
                batched[0]
                if batched is not None
                else read_file(
                    task.path, rank=task.rank, default_rank=task.default_rank, storage_options=task.storage_options
                )
            )
        except NotATraceError as e:
            rows.append(manifest_row(task, error=str(e), not_a_trace=True, attempt=attempt))
            continue
        except TracediagError as e:
            rows.append(manifest_row(task, error=str(e), attempt=attempt))
            continue
        if task.comm_kernel is not None:
            trace = dataclasses.replace(trace, events=mark_comm_kernels(trace.events, task.comm_kernel))
        read.append((task, trace, attempt, time.perf_counter() - started))
    if not read:
        return rows
    own_events = {task.key: trace.events.height for task, trace, _, _ in read}
    read, failed = _windows_joined(read)
    rows += failed
    if not read:
        return rows
    started = time.perf_counter()
    traces = list({trace.meta.rank: trace for _, trace, _, _ in read}.values())  # a rank's windows: once
    summary = summarize_traces(traces, read[0][0].step_regex)
    derive_share = (time.perf_counter() - started) / max(sum(t.events.height for t in traces), 1)
    written: set[int] = set()
    for task, trace, attempt, seconds in read:
        started = time.perf_counter()
        rank = trace.meta.rank
        first = rank not in written  # the windows of one rank share its tables and events
        written.add(rank)
        if first:
            (summary.only_rank(rank) if len(read) > 1 else summary).write(
                rank_dir(task.out, rank), task.storage_options
            )
        if task.keep_events and first:
            dest = join(task.out, "events", f"rank={rank:05d}.parquet")
            write_parquet(trace.events.sort("ts", maintain_order=True), dest, task.storage_options)  # as `load`
        row = manifest_row(
            task,
            rank=rank,
            ok=True,
            events=own_events[task.key],
            seconds=round(seconds + derive_share * own_events[task.key] + time.perf_counter() - started, 6),
            attempt=attempt,
            meta=orjson.dumps(dataclasses.asdict(trace.meta)).decode(),
        )
        frame = pl.DataFrame([row], schema=MANIFEST_SCHEMA)
        write_parquet(frame, done_path(task.out, task.key), task.storage_options)
        rows.append(row)
    return rows
