"""Hung and desynchronised jobs: PyTorch Flight Recorder dumps read, aligned across ranks, and the rank
that broke the collective order named (`tracediag hang`, docs/hang.md)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tracediag.api_types import checked
from tracediag.desync.analyze import analyze_dumps
from tracediag.desync.result import HangReport
from tracediag.errors import TracediagError
from tracediag.ingest.flight import MAX_DUMP_BYTES, MAX_ENTRIES, read_dumps

__all__ = ["HangReport", "analyze_dumps", "hang"]


@checked
def hang(
    sources: str | Path | Iterable[str | Path],
    *,
    world_size: int | None = None,
    rank_from_filename: str | None = None,
    storage_options: dict | None = None,
    max_bytes: int = MAX_DUMP_BYTES,
    max_entries: int = MAX_ENTRIES,
    jobs: int = 0,
    traces: str | Path | Iterable[str | Path] | None = None,
) -> HangReport:
    """Read a job's Flight Recorder dumps and say who broke the collective order.

    Parameters
    ----------
    sources
        Dump files (pickle or JSON, gzipped or not), directories, globs or object-store URLs.
    world_size
        The job's number of ranks when the dumps cannot tell (a highest rank with no dump).
    rank_from_filename
        A regex whose first group is a file's rank (torch 2.13 dumps carry none; by default the last
        number of the name before its extensions: ``nccl_trace_rank_3``).
    storage_options, max_bytes, max_entries
        Object-store options; the reader's limits (`ingest.flight.MAX_DUMP_BYTES`, `MAX_ENTRIES`).
    jobs
        Processes reading dumps, this one included (0: one per CPU from 128 dumps on).
    traces
        Profiler (Kineto JSON) traces of the same job: files, directories, globs or URLs, one per rank.
        Each is joined to its rank's dump (by sequence id, else by time: `desync.join`) and the culprit's
        host operators after its last completed collective are reported (`activity`, the sentence).

    Returns
    -------
    HangReport
        ``verdict`` (``consistent``, ``desync``, ``hang``, ``undecided``), the sentence, the culprit ranks
        and a table per process group.

    Raises
    ------
    TypeError
        An argument of the wrong type, in one line naming it (`api_types.checked`).
    TracediagError
        A file is not a readable dump or trace (one line naming it), or two dumps (traces) claim one rank.
    """
    srcs = [sources] if isinstance(sources, str | Path) else list(sources)
    if not srcs:
        msg = "tracediag.hang: `sources` names no dump file"
        raise TracediagError(msg)
    dumps = read_dumps(
        [str(s) for s in srcs],
        rank_from_filename=rank_from_filename,
        storage_options=storage_options,
        max_bytes=max_bytes,
        max_entries=max_entries,
        jobs=jobs,
    )
    report = analyze_dumps(dumps, world_size=world_size)
    if traces is None:
        return report
    from tracediag.desync.join import join_traces, read_job_traces

    found, not_traces = read_job_traces(traces, storage_options)
    return join_traces(report, dumps, found, not_traces)
