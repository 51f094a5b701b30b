"""The driver: per-rank tasks on an executor, then the run's summaries, never its events.

`summarize` submits `task.summarize_files` for the input files (small ones several to a task),
skips the ones a previous run finished (``resume``), turns a file that fails every retry into an
error row, shows progress and writes ``manifest.parquet``. `Summaries.summary` reads the ranks'
`RankSummary` back, in rank order, for `reduce.reduce_files`; `analyze_ranks` chains the two. Driver
memory grows with the summaries (steps, collective instances, per-step kernel totals and the what-if
replay's timeline pieces and sync ends per rank), not with the traces. `analyze_sources` is the one
entry of `tracediag analyze`: summaries in this process by default (`streamed`), every event with
`events`, or an executor.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson
import polars as pl

from tracediag.analysis import Analysis
from tracediag.api_types import checked
from tracediag.derive.summary import RankSummary
from tracediag.errors import RankError, TracediagError
from tracediag.execute import open_executor
from tracediag.execute.base import first_line
from tracediag.execute.task import (
    CLAIMED,
    MANIFEST_SCHEMA,
    RankTask,
    done_path,
    input_stat,
    manifest_row,
    rank_dir,
    summarize_files,
)
from tracediag.ingest.commkernel import check_comm_kernel
from tracediag.ingest.timeline import parquet_is_timeline
from tracediag.parquet import is_url, join, read_parquet, write_parquet
from tracediag.run import RANK_HINT, Run, RunMeta, _is_parquet, check_rank_map_names, rank_resolver, resolve_inputs

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True, eq=False)
class Summaries:
    """What the tasks of a run left at `out`: the manifest (one row per input file) and the files' metadata."""

    out: str
    manifest: pl.DataFrame
    """`task.MANIFEST_SCHEMA`, one row per input file, in input order."""
    meta: RunMeta
    storage_options: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def ranks(self) -> list[int]:
        """The ranks summarised (a rank of several profiler windows once)."""
        return sorted(self.manifest.filter("ok")["rank"].unique().to_list())  # a rank's windows: one summary

    def summary(self) -> RankSummary:
        """The summaries of every summarised rank, concatenated in rank order."""
        return RankSummary.read([rank_dir(self.out, r) for r in self.ranks], self.storage_options)


class Progress:
    """One line on the driver: files done of all, ranks summarised, failed, throughput (files/s, input MB/s).

    On a terminal it is rewritten in place; otherwise printed every `every` seconds and at the end.
    """

    def __init__(self, total: int, stream: IO[str] | None = None, every: float = 5.0) -> None:
        self.total, self.stream, self.every = total, stream or sys.stderr, every
        self.done = self.ranks = self.failed = self.bytes = 0
        self.start = self.last = time.monotonic()
        self.tty = self.stream.isatty()

    def line(self) -> str:
        """The progress line: files, ranks, failures and rates so far."""
        secs = max(time.monotonic() - self.start, 1e-9)
        return (
            f"files {self.done}/{self.total} · ranks {self.ranks} · failed {self.failed} · "
            f"{self.done / secs:.1f} files/s · {self.bytes / secs / 1e6:.1f} MB/s"
        )

    def __call__(self, row: dict[str, Any]) -> None:
        """Count one finished file's manifest row, and redraw the line."""
        self.done += 1
        self.ranks += row["ok"]
        self.failed += not row["ok"] and not row["not_a_trace"]
        self.bytes += row["bytes"] or 0
        now = time.monotonic()
        final = self.done == self.total
        if self.tty:
            self.stream.write("\r" + self.line() + ("\n" if final else ""))
        elif final or now - self.last >= self.every:
            self.stream.write(self.line() + "\n")
            self.last = now
        self.stream.flush()


def _tasks(
    sources: Sequence[str | Path],
    out: str,
    *,
    step_regex: str | None,
    comm_kernel: str | None,
    keep_events: bool,
    rank_from_filename: str | None,
    rank_map: dict[str, int] | None,
    storage_options: dict[str, Any] | None,
) -> tuple[list[tuple[RankTask, bool]], list[dict[str, Any]]]:
    """(task, found in a directory) per input file, and the error rows of files whose rank is wrong."""
    resolved = resolve_inputs(sources, storage_options)
    if not resolved:
        msg = "`sources` names no trace file"
        raise TracediagError(msg)
    if len(resolved) == 1 and _is_parquet(resolved[0].path, storage_options):
        what = "an op-timeline table" if parquet_is_timeline(resolved[0].path) else "a saved run"
        msg = f"{resolved[0].path}: {what} is analysed without --executor"
        raise TracediagError(msg)
    resolve = rank_resolver(rank_from_filename=rank_from_filename, rank_map=rank_map)
    check_rank_map_names(rank_map, resolved)
    default_rank = 0 if len(resolved) == 1 else None
    tasks, errors = [], []
    for f in resolved:
        kw = dict(out=out, default_rank=default_rank, step_regex=step_regex, comm_kernel=comm_kernel)
        kw.update(keep_events=keep_events)
        kw.update(storage_options=storage_options, size=f.size, mtime_ns=f.mtime_ns)
        try:
            tasks.append((RankTask(f.path, rank=resolve(f.path), **kw), f.in_directory))
        except RankError as e:
            if f.in_directory:  # maybe not a trace at all: let reading decide
                tasks.append((RankTask(f.path, **kw), f.in_directory))
            else:
                errors.append(manifest_row(RankTask(f.path, **kw), error=str(e)))
    return tasks, errors


BATCH_BYTES = 160 << 20
"""The JSON bytes a task's files hold together at most (a file larger alone is a task of its own):
a worker holds its files' event tables at once while it derives their tables. A compressed file
counts as `GZ_RATIO` times its size on disk."""
GZ_RATIO = 8
MAX_BATCH = 32


def _json_bytes(task: RankTask) -> int:
    size = input_stat(task)[0] or 0
    return size * GZ_RATIO if task.path.endswith(".gz") else size


def batches(tasks: list[RankTask], workers: int, files_per_task: int = 0) -> list[list[RankTask]]:
    """Group files into tasks: a task's fixed costs (scheduling, a pass of the per-rank derivation,
    a Parquet file per table) are paid once for the group. Automatic size: at most `MAX_BATCH` files
    and `BATCH_BYTES`, and at least four tasks per worker."""
    size = files_per_task or max(1, min(MAX_BATCH, len(tasks) // (4 * max(workers, 1))))
    out: list[list[RankTask]] = []
    group: list[RankTask] = []
    held = 0
    for task in tasks:
        weight = _json_bytes(task)
        if group and not files_per_task and held + weight > BATCH_BYTES:
            out.append(group)
            group, held = [], 0
        group.append(task)
        held += weight
        if len(group) == size:
            out.append(group)
            group, held = [], 0
    return out + ([group] if group else [])


@functools.cache
def _summary_schemas() -> dict[str, pl.Schema]:
    """The schema of each summary table: the same for every rank (their summaries concatenate), so that of
    the summary of no events."""
    from tracediag.derive.per_rank import rank_tables
    from tracediag.schema import empty_events

    return {name: table.schema for name, table in rank_tables(empty_events()).tables().items()}


def _finished(task: RankTask) -> dict[str, Any] | None:
    """The manifest row a previous run left for `task`, when it is still valid (same file, same options)."""
    try:
        row = read_parquet(done_path(task.out, task.key), task.storage_options).row(0, named=True)
    except Exception:  # absent or unreadable: do it again
        return None
    now = manifest_row(task)
    same = all(row.get(k) == now[k] for k in ("path", "bytes", "mtime_ns", "step_regex", "tables"))
    if not (same and row["ok"]) or (task.keep_events and not row["kept_events"]):
        return None
    folder = rank_dir(task.out, row["rank"])
    try:  # the tables it stands for must read whole: a damaged or truncated one would fail the analysis later
        tables = RankSummary.read(folder, task.storage_options).tables()
        wrong = next((n for n, t in tables.items() if t.schema != _summary_schemas()[n]), None)
        if wrong is not None:  # damage that still decodes, or an older version's tables: the ranks would not concat
            msg = f"{wrong}.parquet has other columns or types than this version's summaries"
            raise ValueError(msg)
        if task.keep_events:
            read_parquet(join(task.out, "events", f"rank={row['rank']:05d}.parquet"), task.storage_options)
    except Exception as e:  # any failure to read it back means: summarise the file again
        why = first_line(e)[:200]
        warnings.warn(f"tracediag: {folder}: a previous run's summary does not read back ({why}); redone", stacklevel=3)
        return None
    return row


def summarize(
    sources: str | Path | Sequence[str | Path],
    *,
    out: str,
    executor: str = "local",
    workers: int = 0,
    retries: int = 2,
    address: str | None = None,
    scheduler_file: str | None = None,
    resume: bool = False,
    keep_events: bool = False,
    step_regex: str | None = None,
    comm_kernel: str | None = None,
    rank_from_filename: str | None = None,
    rank_map: dict[str, int] | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[dict[str, Any]], None] | bool = False,
    files_per_task: int = 0,
    task_fn: Callable[[list[RankTask]], list[dict[str, Any]]] = summarize_files,
) -> Summaries:
    """Summarise every rank file of `sources` on `executor` into `out` (a directory or object-store URL).

    Each task writes the rank's tables (and its events with `keep_events`) and returns its manifest
    row; a file that fails every retry becomes an error row naming it and the reason. Small files
    are summarised several to a task (`files_per_task`; 0 = `batches` decides); a task of several
    files that fails every retry is split and each file tried alone. `resume`
    skips files a previous run into `out` finished. `progress`: True for the progress line on
    stderr, or a callable given each row. Raises `TracediagError` when no file could be read or two
    files claim one rank.
    """
    if step_regex is not None:
        try:
            re.compile(step_regex)
        except re.error as e:
            msg = f"--step-regex {step_regex!r} is not a valid regular expression ({e})"
            raise ValueError(msg) from None
    comm_kernel = check_comm_kernel(comm_kernel)
    if isinstance(sources, (str, Path)):
        sources = [sources]
    out = out.removeprefix("file://")
    tasks, rows = _tasks(
        sources,
        out,
        step_regex=step_regex,
        comm_kernel=comm_kernel,
        keep_events=keep_events,
        rank_from_filename=rank_from_filename,
        rank_map=rank_map,
        storage_options=storage_options,
    )
    in_directory = {t.path: d for t, d in tasks}
    todo = []
    for task, _ in tasks:
        row = _finished(task) if resume else None
        (rows.append(row) if row else todo.append(task))
    report = Progress(len(rows) + len(todo)) if progress is True else progress or None
    for row in rows if report else ():
        report(row)
    if todo:
        workers = min(workers or os.cpu_count() or 1, len(todo))
        with open_executor(
            executor, workers=workers, retries=retries, address=address, scheduler_file=scheduler_file
        ) as ex:
            rows += _run(ex, task_fn, batches(todo, workers, files_per_task), retries, report)
            # the files of one rank read by different tasks: its profiler windows, summarised again together
            split = _split_ranks(rows)
            if split:
                by_path = {t.path: t for t, _ in tasks}
                again = [[by_path[p] for p in paths] for paths in split]
                redone = {p for paths in split for p in paths}
                rows = [r for r in rows if r["path"] not in redone]
                rejoined = _run(ex, task_fn, again, retries, None)
                clash = [r["error"] for r in rejoined if not r["ok"] and CLAIMED in (r["error"] or "")]
                if clash:
                    raise RankError(clash[0])
                rows += rejoined
    order = {t.path: i for i, (t, _) in enumerate(tasks)}
    manifest = pl.DataFrame(sorted(rows, key=lambda r: order.get(r["path"], -1)), schema=MANIFEST_SCHEMA)
    write_parquet(manifest, join(out, "manifest.parquet"), storage_options)
    _sweep_temp(out)
    return Summaries(out=out, manifest=manifest, meta=_meta(manifest, in_directory), storage_options=storage_options)


def _run(
    ex: Any,
    task_fn: Callable[[list[RankTask]], list[dict[str, Any]]],
    pending: list[list[RankTask]],
    retries: int,
    report: Callable[[dict[str, Any]], None] | None,
) -> list[dict[str, Any]]:
    """The manifest rows of `pending`'s batches run on `ex`; a failed batch of several files is split
    and each file tried alone, a file that fails every retry an error row naming it."""
    rows: list[dict[str, Any]] = []
    while pending:
        handles = {ex.submit(task_fn, batch): batch for batch in pending}
        pending = []
        for handle, result in ex.as_completed(list(handles)):
            batch = handles[handle]
            if isinstance(result, BaseException) and len(batch) > 1:
                pending.extend([t] for t in batch)  # find the file that fails: each alone
                continue
            if isinstance(result, BaseException):
                reason = f"failed after {retries + 1} attempt(s): {first_line(result)}"
                result = [manifest_row(batch[0], error=f"{batch[0].path}: {reason}")]
            for row in result:
                rows.append(row)
                if report:
                    report(row)
    return rows


def _split_ranks(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The paths of each rank that several files claim and no task has read together (rows whose
    metadata differ: a task that read them all gives each the joined trace's)."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["ok"]:
            by_rank.setdefault(r["rank"], []).append(r)
    return [[r["path"] for r in group] for group in by_rank.values() if len({r["meta"] for r in group}) > 1]


_TEMP = re.compile(r"\.tmp-[0-9a-f]{32}$")


def _sweep_temp(out: str) -> None:
    """Remove the temporary files of attempts whose worker died mid-write (`parquet.write_parquet` names them)."""
    if is_url(out):
        return
    for sub in ("ranks", "events", "done"):
        for folder, _, names in os.walk(os.path.join(out, sub)):
            for name in names:
                if _TEMP.search(name):
                    os.remove(os.path.join(folder, name))


def _meta(manifest: pl.DataFrame, in_directory: dict[str, bool]) -> RunMeta:
    """The run's metadata from the manifest; raises when no file was read or two claim one rank."""
    ok = manifest.filter("ok")
    failed = manifest.filter(~pl.col("ok"))
    ignored = [r["error"] for r in failed.iter_rows(named=True) if r["not_a_trace"] and in_directory.get(r["path"])]
    errors = [r["error"] for r in failed.iter_rows(named=True) if r["error"] not in ignored]
    if not ok.height:
        raise TracediagError("\n".join(errors or ignored))
    by_rank: dict[int, tuple[str, str]] = {}
    for rank, path, meta in ok.select("rank", "path", "meta").iter_rows():
        other, joined = by_rank.setdefault(rank, (path, meta))
        if meta != joined:  # the windows of one rank read together share one joined trace's metadata
            msg = f"{other} and {path} both claim rank {rank}; {RANK_HINT}"
            raise RankError(msg)
    files = [orjson.loads(meta) for _, (_, meta) in sorted(by_rank.items())]
    return RunMeta.from_dict({"files": files, "errors": errors, "ignored": ignored})


def analyze_summaries(
    summaries: Summaries,
    *,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    allow_mixed: bool = False,
    per_file: bool = False,
) -> list[tuple[str, Analysis]]:
    """The cross-rank half on the driver: ``[("", analysis)]`` of the summarised run, or with
    `per_file`, when the files are not ranks of one run (`same_run.run_problems` on the files'
    metadata and per-rank extents), one ``(path, analysis)`` per file analysed alone, in rank order
    (``--allow-mixed``): `reduce.reduce_files`, as in memory. Raises `MixedRunError` for mixed
    files unless `allow_mixed` or `per_file`."""
    from tracediag.reduce import reduce_files

    return reduce_files(
        summaries.summary(),
        summaries.meta,
        step_regex=step_regex,
        link_gbps=link_gbps,
        allow_mixed=allow_mixed,
        per_file=per_file,
    )


@checked
def analyze_ranks_per_file(
    sources: str | Path | Sequence[str | Path],
    *,
    out: str | None = None,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    allow_mixed: bool = False,
    per_file: bool = False,
    **summarize_kw: Any,
) -> tuple[list[tuple[str, Analysis]], Summaries]:
    """`summarize`, then `analyze_summaries` on the driver. Without `out`, the summaries go to a
    temporary directory removed afterwards (a cluster's workers must then share this machine's file
    system)."""
    scratch = None if out else tempfile.mkdtemp(prefix="tracediag-")
    try:
        summaries = summarize(sources, out=out or scratch, step_regex=step_regex, **summarize_kw)
        results = analyze_summaries(
            summaries, step_regex=step_regex, link_gbps=link_gbps, allow_mixed=allow_mixed, per_file=per_file
        )
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return results, summaries


@checked
def analyze_ranks(
    sources: str | Path | Sequence[str | Path],
    *,
    out: str | None = None,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    allow_mixed: bool = False,
    **summarize_kw: Any,
) -> tuple[Analysis, Summaries]:
    """`tracediag.analyze` with the per-rank work on an executor (`summarize`) and the cross-rank
    work here. Without `out`, the summaries go to a temporary directory removed afterwards (a
    cluster's workers must then share this machine's file system). `allow_mixed` skips the check
    that the files are ranks of one run (as `tracediag.analyze`); raises `MixedRunError` otherwise."""
    results, summaries = analyze_ranks_per_file(
        sources, out=out, step_regex=step_regex, link_gbps=link_gbps, allow_mixed=allow_mixed, **summarize_kw
    )
    return results[0][1], summaries


@dataclass(frozen=True, eq=False)
class Analysed:
    """What `analyze_sources` found: the analyses, the run when its events were read here, the files that failed."""

    results: list[tuple[str, Analysis]]
    """``[("", analysis)]``, or with `per_file` one ``(path, analysis)`` per file (`reduce.reduce_files`)."""
    run: Run | None
    """The run read into this process (with `events`; else None: only the ranks' summaries were kept)."""
    failed: tuple[str, ...] = ()
    """One line per file that could not be read or summarised (in this process the ``errors`` of the
    `RunMeta` given to `on_read`); the results cover the other files."""


def analyze_sources(
    sources: str | Path | Sequence[str | Path],
    *,
    executor: str | None = None,
    jobs: int = 0,
    out: str | None = None,
    events: bool = False,
    step_regex: str | None = None,
    link_gbps: float | None = None,
    per_file: bool = False,
    rank_from_filename: str | None = None,
    rank_map: dict[str, int] | None = None,
    storage_options: dict[str, Any] | None = None,
    comm_kernel: str | None = None,
    on_file_done: Callable[[str], None] | None = None,
    on_read: Callable[[RunMeta], None] | None = None,
    **summarize_kw: Any,
) -> Analysed:
    """The analysis of trace `sources`, wherever the per-rank work runs; every way reduces the ranks'
    summaries alike (`reduce.reduce_files`), so the results are equal.

    - By default, in this process, a group of files at a time (`streamed.stream_summaries`, `jobs`
      processes): each rank summarised and its events dropped, so memory grows with the summaries.
    - With `events` (outputs that draw the events: ``--perfetto``, ``--html``'s timelines, a model
      check), or for a saved run (``.parquet``), every event read here (`run.load`) and kept in
      `Analysed.run`.
    - With `executor`, each rank summarised on `executor` with `jobs` workers into `out`
      (`summarize`, with `summarize_kw`).

    In this process `on_file_done` is called after each file and `on_read` with the run's metadata
    (the files that could not be read in its ``errors``) before it is analysed.
    """
    from tracediag.reduce import Handed, analyze_files, check_link_gbps, reduce_files
    from tracediag.run import load

    kw = {"step_regex": step_regex, "link_gbps": link_gbps, "per_file": per_file}
    where = {"rank_from_filename": rank_from_filename, "rank_map": rank_map, "storage_options": storage_options}
    if executor:
        results, summaries = analyze_ranks_per_file(
            sources, out=out, executor=executor, workers=jobs, comm_kernel=comm_kernel, **where, **kw, **summarize_kw
        )
        return Analysed(results, None, summaries.meta.errors)
    resolved = None if events else _trace_files(sources, storage_options)
    if resolved is None:
        run = load(sources, jobs=jobs, on_file_done=on_file_done, comm_kernel=comm_kernel, **where)
        if on_read is not None:
            on_read(run.meta)
        return Analysed(analyze_files(run, **kw), run, run.meta.errors)
    from tracediag.execute.streamed import stream_summaries

    check_link_gbps(link_gbps)
    try:
        comm_kernel = check_comm_kernel(comm_kernel)
    except ValueError as e:
        raise TracediagError(str(e)) from None
    summary, meta = stream_summaries(
        resolved, jobs=jobs, comm_kernel=comm_kernel, step_regex=step_regex, on_file_done=on_file_done, **where
    )
    if on_read is not None:
        on_read(meta)
    handed = Handed(summary)
    del summary  # the reduce frees each table once read
    return Analysed(reduce_files(handed, meta, **kw), None, meta.errors)


def _trace_files(sources: str | Path | Sequence[str | Path], storage_options: dict[str, Any] | None) -> list | None:
    """The input files of `sources` (`run.resolve_inputs`), or None for a saved run (``load`` reads it whole)."""
    from tracediag.ingest.remote import is_remote
    from tracediag.ingest.workers import forked_after_import
    from tracediag.run import FORK_WARNING

    if forked_after_import():
        warnings.warn(FORK_WARNING, RuntimeWarning, stacklevel=3)
    resolved = resolve_inputs([sources] if isinstance(sources, (str, Path)) else sources, storage_options)
    if not resolved:
        msg = "tracediag.load: `sources` names no trace file"
        raise TracediagError(msg)
    one = resolved[0].path
    if len(resolved) == 1 and _is_parquet(one, storage_options) and (is_remote(one) or not parquet_is_timeline(one)):
        return None
    return resolved
