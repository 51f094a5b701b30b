"""The in-process summary path: a run's files read a group at a time, each group's ranks summarised and
their events dropped, so this process holds the run's `RankSummary` and one group's events, never
every event.

`stream_summaries` reads as `run.load` does (the same readers, small files several at once, the same
error lines, `jobs` processes) and gives what `reduce.reduce_files` reads: the summary of every rank,
in rank order, and the `RunMeta` `load` would have built. A rank's profiler windows are summarised
together (`run.merge_windows`): when they fall in different groups, that rank's files are read
again together. Nothing is written to disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import polars as pl

from tracediag.derive.summary import RankSummary, concat
from tracediag.errors import RankError, TracediagError, shown
from tracediag.execute.task import summarize_traces
from tracediag.ingest.commkernel import mark_comm_kernels
from tracediag.ingest.sniff import is_stream
from tracediag.ingest.workers import map_in_workers
from tracediag.run import (
    RunMeta,
    _check_unique_ranks,
    _groups,
    _paying_jobs,
    _read_group,
    check_rank_map_names,
    input_bytes,
    rank_resolver,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tracediag.ingest.trace import FileMeta
    from tracediag.run import InputFile, ReadTask

STREAM_GROUP = 32
"""Files read and summarised together at most: the events this process holds at once. Small files
are read several at once (`ingest.read.read_small`); 32 keeps most of that gain (a polars call's
fixed cost is paid once for the group) while the driver holds 32 ranks' events, not the run's."""

STREAM_BYTES = 96 << 20
"""Input that files read in this process are summarised together up to (`run.input_bytes`), beyond the
runs of small files: about `derive.per_rank.GROUP_EVENTS` rows of Kineto JSON (a 34.8 MB A100 rank holds
75k), which `rank_tables` derives in one go. A group costs about 45 ms of polars calls whatever its
size: 8 A100 ranks of 34.8 MB summarised two at a time instead of one at a time took 1.85-2.05 against
2.24-2.52 CPU-s for the whole `analyze` (peak 168-173 against 149-155 MB; alternated, load 10)."""


@dataclass(frozen=True, eq=False)
class Group:
    """What summarising one group of files gave: per file its outcome, the joined traces' metadata
    (a rank's windows one entry, in the order of their first file) and the ranks' summary."""

    outcomes: list[list[int] | tuple[str, bool]]
    """Per file: the ranks it holds, or (one-line error, whether it is simply not a trace)."""
    files: tuple[FileMeta, ...] = ()
    summary: RankSummary | None = None
    clash: str | None = None
    """The `RankError` of two files of one rank that are no windows of one timeline."""


def summarize_group(args: tuple[list[ReadTask], str | None, str | None]) -> Group:
    """Read a group of files (`run` reads them so: same errors), join each rank's windows and summarise
    its ranks (`task.summarize_traces`); the events are dropped on return. Module-level: workers run it."""
    group, step_regex, comm_kernel = args
    read = _read_group(group)
    outcomes = [[t.meta.rank for t in r] if isinstance(r, list) else r for r in read]
    traces = [t for r in read if isinstance(r, list) for t in r]
    if not traces:
        return Group(outcomes)
    try:
        joined = _check_unique_ranks(traces)
    except RankError as e:
        return Group(outcomes, clash=str(e))
    if comm_kernel is not None:
        joined = [replace(t, events=mark_comm_kernels(t.events, comm_kernel)) for t in joined]
    return Group(outcomes, tuple(t.meta for t in joined), summarize_traces(joined, step_regex))


def _crashed(args: tuple[list[ReadTask], str | None, str | None], why: str) -> Group:
    return Group([(f"{shown(task[0])}: {why} while reading it (out of memory?)", False) for task in args[0]])


def _in_groups(tasks: list[ReadTask], jobs: int) -> list[list[ReadTask]]:
    """`run`'s groups (runs of small files, other files alone), cut to `STREAM_GROUP` files; in this
    process alone (`jobs` 1: with workers, the groups are what they share) consecutive groups are joined
    while they hold at most `STREAM_BYTES` of input and `STREAM_GROUP` files."""
    cut = [g[i : i + STREAM_GROUP] for g in _groups(tasks, jobs) for i in range(0, len(g), STREAM_GROUP)]
    if jobs > 1:
        return cut
    joined: list[list[ReadTask]] = []
    held = 0
    for group in cut:
        size = sum(input_bytes(task[0]) for task in group)
        if joined and held + size <= STREAM_BYTES and len(joined[-1]) + len(group) <= STREAM_GROUP:
            joined[-1] = joined[-1] + group
            held += size
        else:
            joined.append(group)
            held = size
    return joined


def _summarize_all(
    groups: list[list[ReadTask]],
    jobs: int,
    step_regex: str | None,
    comm_kernel: str | None,
    on_file_done: Callable[[str], None] | None,
) -> list[Group]:
    args = [(g, step_regex, comm_kernel) for g in groups]
    if jobs <= 1:
        out = []
        for a in args:
            out.append(summarize_group(a))
            for task in a[0] if on_file_done else ():
                on_file_done(task[0])
        return out
    done = (lambda i: [on_file_done(task[0]) for task in groups[i]]) if on_file_done else None
    return map_in_workers(summarize_group, args, jobs, crashed=_crashed, on_done=done, in_caller=True)


def _without(summary: RankSummary, ranks: set[int]) -> RankSummary:
    keep = pl.col("rank").is_in(sorted(ranks)).not_()
    return RankSummary(**{n: t.filter(keep) for n, t in summary.tables().items()})


def _in_rank_order(summaries: list[RankSummary]) -> RankSummary:
    """The summaries (each sorted by rank) as one, sorted by rank (each rank's rows in their order)."""
    whole = concat(summaries)
    return RankSummary(
        **{n: t if t["rank"].is_sorted() else t.sort("rank", maintain_order=True) for n, t in whole.tables().items()}
    )


def stream_summaries(
    resolved: list[InputFile],
    *,
    jobs: int = 0,
    rank_from_filename: str | None = None,
    rank_map: dict[str, int] | None = None,
    storage_options: dict | None = None,
    comm_kernel: str | None = None,
    step_regex: str | None = None,
    on_file_done: Callable[[str], None] | None = None,
) -> tuple[RankSummary, RunMeta]:
    """The summary of every rank of the trace files `resolved` (`run.resolve_inputs`; no saved run) and
    the run's metadata, as `run.load` then `derive.per_rank.rank_tables` would give them, holding one
    group's events at a time. Raises as `load` does: no file read, or two files claiming one rank."""
    resolve = rank_resolver(rank_from_filename=rank_from_filename, rank_map=rank_map)
    check_rank_map_names(rank_map, resolved)
    default_rank = 0 if len(resolved) == 1 else None
    tasks: list[ReadTask] = []
    refused: dict[str, tuple[str, bool]] = {}
    for f, rank in zip(resolved, resolve.many([f.path for f in resolved])):
        if not isinstance(rank, RankError):
            tasks.append((f.path, rank, default_rank, storage_options))
        elif not f.in_directory:
            refused[f.path] = (str(rank), False)
        else:  # maybe not a trace at all: let reading decide
            tasks.append((f.path, None, default_rank, storage_options))
    cores = os.cpu_count() or 1
    jobs = min(jobs if jobs > 0 else _paying_jobs(tasks), cores, len(tasks)) if tasks else 1
    if any(is_stream(t[0]) for t in tasks):
        jobs = 1  # a pipe is this process's own
    groups = _in_groups(tasks, jobs)
    done = _summarize_all(groups, jobs, step_regex, comm_kernel, on_file_done)
    outcome: dict[str, list[int] | tuple[str, bool]] = dict(refused)
    rank_groups: dict[int, set[int]] = {}
    for gi, (group, got) in enumerate(zip(groups, done)):
        for task, result in zip(group, got.outcomes):
            outcome[task[0]] = result
            for rank in result if isinstance(result, list) else ():
                rank_groups.setdefault(rank, set()).add(gi)
    split = _closure({r for r, gs in rank_groups.items() if len(gs) > 1}, tasks, outcome)
    errors, ignored = [], []
    for f in resolved:
        result = outcome[f.path]
        if isinstance(result, tuple):
            (ignored if result[1] and f.in_directory else errors).append(result[0])
    if not rank_groups:
        raise TracediagError("\n".join(errors or ignored))
    clash = next((g.clash for g in done if g.clash), None)
    if clash is not None:
        raise RankError(clash)
    first = {}  # rank -> index of its first file: `load` lists the files' metadata in that order
    for i, task in enumerate(tasks):
        for rank in outcome[task[0]] if isinstance(outcome[task[0]], list) else ():
            first.setdefault(rank, i)
    files = [m for g in done for m in g.files if m.rank not in split]
    summaries = [g.summary if not split else _without(g.summary, split) for g in done if g.summary is not None]
    if split:  # a rank's windows read by different groups: its files read again, together
        again = [t for t in tasks if isinstance(r := outcome[t[0]], list) and split.intersection(r)]
        joined = summarize_group((again, step_regex, comm_kernel))
        if joined.clash is not None:
            raise RankError(joined.clash)
        files += joined.files
        summaries += [joined.summary] if joined.summary is not None else []
    files.sort(key=lambda m: first[m.rank])
    meta = RunMeta(files=tuple(files), errors=tuple(errors), ignored=tuple(ignored))
    return _in_rank_order(summaries), meta


def _closure(ranks: set[int], tasks: list[ReadTask], outcome: dict) -> set[int]:
    """`ranks` and every rank a file holding one of them holds too (a file is read whole)."""
    while True:
        more = set(ranks)
        for t in tasks:
            r = outcome[t[0]]
            if isinstance(r, list) and ranks.intersection(r):
                more.update(r)
        if more == ranks:
            return ranks
        ranks = more
