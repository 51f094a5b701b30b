"""Which trace files of a watched location are ready, and each one read into a small `Part`.

A profiler writes its trace files in place, so a file is read only once its size and modification
time are the same on two polls in a row (`Settling`), and it counts only when it parses completely:
a gzip stream cut short fails to decompress, and a plain JSON file cut short (which `tracediag load`
reads leniently, with a warning) is taken as still being written. A file read is summarised per
rank at once (`derive.per_rank.rank_tables`) and its events dropped: a window holds its ranks'
summaries, never their events.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from tracediag.derive.per_rank import rank_tables
from tracediag.errors import NotATraceError, TracediagError, one_line, shown
from tracediag.ingest.chrome import ENDS_EARLY
from tracediag.ingest.read import read_traces
from tracediag.ingest.remote import is_remote
from tracediag.run import RankResolver, resolve_inputs

if TYPE_CHECKING:
    from tracediag.derive.summary import RankSummary
    from tracediag.ingest.trace import FileMeta, FileTrace

GLOB_CHARS = "*?["


@dataclass(frozen=True, slots=True)
class Listed:
    """One file of the location as one poll saw it."""

    path: str
    size: int
    mtime_ns: int


@dataclass(frozen=True, eq=False)
class Part:
    """One rank's file of one profiler window, summarised (its events dropped)."""

    path: str
    rank: int
    steps: tuple[int, int] | None
    """First and last step number (``ProfilerStep#N``) in the file; None without step markers."""
    lo_ns: int
    hi_ns: int
    """The recorded time span of the file's events (Unix-epoch ns on the rank's clock)."""
    meta: FileMeta
    summary: RankSummary


@dataclass(frozen=True, slots=True)
class Unready:
    """A file that could not be read (yet): still being written, or not a trace at all."""

    path: str
    why: str
    """One line naming the file and the problem."""
    not_a_trace: bool = False
    cut_short: bool = False
    """The file ends early (truncated JSON or gzip): perhaps still being written."""


def gone(location: str) -> bool:
    """A local directory that no longer exists (deleted under the watcher)."""
    if is_remote(location) or any(ch in location for ch in GLOB_CHARS):
        return False
    return not os.path.exists(location)


def list_files(location: str, storage_options: dict[str, Any] | None = None) -> list[Listed]:
    """The trace files of `location` (a directory, a glob or an object-store URL) now, in a stable
    order; empty while it holds none. Raises `TracediagError` (one line) when the listing fails."""
    if gone(location):
        return []
    try:
        inputs = resolve_inputs([location], storage_options)
    except TracediagError as e:
        text = str(e)
        if "no trace files" in text or "matches no" in text:  # nothing written yet
            return []
        raise
    out = []
    for f in inputs:
        if f.size is not None and f.mtime_ns is not None:
            out.append(Listed(f.path, f.size, f.mtime_ns))
            continue
        try:
            st = os.stat(f.path)
        except OSError:
            try:  # a link that leads nowhere (a loop, a missing target): listed, so reading it names it
                st = os.lstat(f.path)
            except OSError:  # removed between the listing and the stat
                continue
        out.append(Listed(f.path, st.st_size, st.st_mtime_ns))
    return out


class Settling:
    """Files whose size and modification time held across two polls. An empty one too: it is read, and waits
    like a file cut short (`--window-timeout`, or the end of `--once`), so that it never holds a watch
    open for ever."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}

    def settled(self, listed: list[Listed]) -> list[Listed]:
        """The files of this poll that are unchanged since the previous poll; forgets files gone."""
        now = {f.path: (f.size, f.mtime_ns) for f in listed}
        out = [f for f in listed if self._last.get(f.path) == (f.size, f.mtime_ns)]
        self._last = now
        return out

    def unsettled(self, listed: list[Listed]) -> int:
        """How many files of this poll changed since the previous one (call it before `settled`)."""
        return sum(1 for f in listed if self._last.get(f.path) != (f.size, f.mtime_ns))


BATCH_FILES = 64
"""Files summarised in one pass (`parts`): `rank_tables` costs about 75 ms a call on a small file
whatever its size (many small frames), so the files of one poll are summarised together, their
events concatenated (one rank each per pass), then split by rank. Measured on 2 cores, 16 files of
the fixtures/watch run: 25 ms to read each, 75 ms each to summarise alone."""


def read_trace(
    path: str, *, resolve: RankResolver, storage_options: dict[str, Any] | None = None
) -> FileTrace | Unready:
    """One settled file read whole, or why it is not a profiler window (`Unready`); never raises
    for a bad file."""
    try:
        traces = read_traces(path, rank=resolve(path), storage_options=storage_options)
    except NotATraceError as e:
        return Unready(path, str(e), not_a_trace=True)
    except TracediagError as e:
        text = str(e)
        cut_short = "gzip" in text or "ended before" in text or "truncated" in text or text.endswith(": empty file")
        return Unready(path, text, cut_short=cut_short)
    except (OSError, MemoryError, ValueError) as e:
        return Unready(path, f"{shown(path)}: {one_line(str(e))}")
    if len(traces) != 1:
        return Unready(path, f"{shown(path)}: an op-timeline table of several ranks is not a profiler window")
    trace = traces[0]
    if trace.meta.skipped.get("truncated") or any(w.startswith(ENDS_EARLY) for w in trace.meta.warnings):
        return Unready(path, f"{shown(path)}: the file ends early (still being written?)", cut_short=True)
    if trace.meta.time_base != "epoch":
        return Unready(path, f"{shown(path)}: relative times: its profiler window cannot be placed in time")
    if not trace.events.height:
        return Unready(path, f"{shown(path)}: no events")
    return trace


def parts(traces: list[FileTrace], *, step_regex: str | None = None) -> list[Part | Unready]:
    """Each trace summarised (`rank_tables`) into a `Part`, in order; several per pass (`BATCH_FILES`,
    one file per rank in a pass), since every table is computed per rank."""
    out: dict[int, Part | Unready] = {}
    todo = list(enumerate(traces))
    while todo:
        batch, later, ranks = [], [], set()
        for i, t in todo:
            if t.meta.rank in ranks or len(batch) >= BATCH_FILES:
                later.append((i, t))
            else:
                batch.append((i, t))
                ranks.add(t.meta.rank)
        todo = later
        batch.sort(key=lambda it: it[1].meta.rank)
        # as `run.load` orders a run's events: each file by time, the files in rank order
        events = pl.concat([t.events.sort("ts", maintain_order=True) for _, t in batch])
        try:
            summary = rank_tables(events, step_regex=step_regex)
        except ValueError as e:
            for i, t in batch:
                out[i] = Unready(t.meta.path, f"{shown(t.meta.path)}: {one_line(str(e))}")
            continue
        for i, t in batch:
            mine = summary.only_rank(t.meta.rank) if len(batch) > 1 else summary
            ext = mine.extents
            steps = mine.spans["step"]
            span = (int(steps.min()), int(steps.max())) if steps.len() else None
            out[i] = Part(t.meta.path, t.meta.rank, span, int(ext["lo"][0]), int(ext["hi"][0]), t.meta, mine)
    return [out[i] for i in range(len(traces))]
