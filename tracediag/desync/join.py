"""Profiler traces joined to Flight Recorder dumps: what the late rank's host did before it stopped arriving.

Per rank with both a dump and a Kineto trace, the trace's collective calls (host operators with a
collective op, else its communication events; nested calls are one call) are matched to the dump's
collective entries:

- by **sequence id**: the trace names the process group and ``Seq`` (NCCL's ``record_param_comms``): a call
  is the entry of its group and sequence id, accepted when the ops agree and the trace-minus-dump times of
  the pairs stay within `SPREAD_NS` of their median (one job, one clock offset; another job's ids match by
  number but not in time). The median offset is said: a large one is a trace from another host's clock;
- else by **time** (gloo traces carry no ``Seq``): an entry is the call of its op whose span, on the
  trace's epoch clock, holds the entry's creation time (torch creates the entry inside the call) within
  `SLACK_NS`. A trace whose clock is not the dump's matches nothing and is said not joined, never joined
  by guess.

Then, for each late rank, the window after its last completed collective (the end of its joined call) up
to the trace's next collective call, or the trace's end: the top-level host operators of the thread that
called the collectives that overlap it, longest first (`HostOp`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from tracediag.derive.collectives import MATCHED_OPS
from tracediag.desync.result import HangReport, HostActivity, HostOp, RankJoin
from tracediag.errors import RankError, shown

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tracediag.ingest.flight import FlightDumps
    from tracediag.ingest.trace import FileTrace

SLACK_NS = 1_000_000
"""How far outside a trace call's span an entry's creation time may lie and still be its entry (1 ms):
the call's span and the entry's clock reading are taken microseconds apart."""
SPREAD_NS = 100_000_000
"""Trace-minus-dump times of one job's sequence-matched pairs lie within this of their median (100 ms):
the entry is created inside its call, which lasts µs to ms on the host."""
CLOCK_NOTE_NS = 1_000_000_000
"""A sequence join whose median offset exceeds this (1 s) is said to be on another clock."""
HOST_KINDS = ("cpu_op", "annotation", "python", "runtime", "sync")
"""Event kinds that are host work (step markers and the profiler's own span are not)."""
TOP_OPS = 5

CALL_SCHEMA = pl.Schema(
    {
        "tid": pl.Int64(),
        "group": pl.String(),
        "op": pl.String(),
        "seq": pl.Int64(),
        "ts": pl.Int64(),
        "end": pl.Int64(),
    }
)
"""One row per collective call of a trace, on its own clock."""


def trace_calls(events: pl.DataFrame) -> pl.DataFrame:
    """A rank's collective calls (`CALL_SCHEMA`), by time: host operators with a collective op where the
    trace has them (the call the entry is created in), else its communication events; a call nested in
    another of the same thread (``c10d::allreduce_`` around ``record_param_comms``) is part of it."""
    coll = events.filter(pl.col("coll_op").cast(pl.String).is_in(list(MATCHED_OPS)))
    host = coll.filter((pl.col("kind") == "cpu_op") & (pl.col("device") < 0))
    use = host if host.height else coll.filter(pl.col("kind") == "comm")
    if not use.height:
        return pl.DataFrame(schema=CALL_SCHEMA)
    end = pl.col("ts") + pl.col("dur")
    return (
        use.sort("tid", "ts", pl.col("dur"), descending=[False, False, True])
        .with_columns(end.alias("end"))
        .with_columns(
            (pl.col("ts") >= pl.col("end").cum_max().shift(1).over("tid").fill_null(-(2**62))).alias("_outer")
        )
        .with_columns(pl.col("_outer").cum_sum().over("tid").alias("_call"))
        .group_by("tid", "_call", maintain_order=True)
        .agg(
            pl.col("coll_group").drop_nulls().first().alias("group"),
            pl.col("coll_op").cast(pl.String).first().alias("op"),
            pl.col("coll_seq").drop_nulls().first().alias("seq"),
            pl.col("ts").first(),
            pl.col("end").max(),
        )
        .select(list(CALL_SCHEMA))
        .cast(dict(CALL_SCHEMA))
        .sort("ts")
    )


def _by_seq(calls: pl.DataFrame, mine: pl.DataFrame) -> pl.DataFrame:
    """Pairs of (call, entry) of equal group and sequence id, with ``agree`` (same op) and ``d`` (trace
    minus dump time of the entry's creation)."""
    return (
        calls.filter(pl.col("seq").is_not_null() & pl.col("group").is_not_null())
        .join(
            mine.select(
                pl.col("pg_name").alias("group"),
                pl.col("collective_seq_id").alias("seq"),
                pl.col("op").alias("dump_op"),
                "time_created_ns",
            ),
            on=["group", "seq"],
            how="inner",
        )
        .with_columns(
            (pl.col("op") == pl.col("dump_op")).alias("agree"),
            (pl.col("ts") - pl.col("time_created_ns")).alias("d"),
        )
    )


def _by_time(calls: pl.DataFrame, mine: pl.DataFrame) -> pl.DataFrame:
    """Pairs of (call, entry) where the call of the entry's op holds its creation time (± `SLACK_NS`);
    a call takes one entry (the first created in it)."""
    entries = mine.filter(pl.col("time_created_ns").is_not_null()).sort("time_created_ns")
    if not entries.height or not calls.height:
        return pl.DataFrame()
    pairs = (
        entries.select(
            "pg_name",
            pl.col("collective_seq_id").alias("dump_seq"),
            "op",
            "time_created_ns",
            (pl.col("time_created_ns") + SLACK_NS).alias("_key"),
        )
        .join_asof(
            calls.select("tid", "ts", "end", pl.col("op"), pl.col("ts").alias("_key")).sort("_key"),
            on="_key",
            by="op",
            strategy="backward",
            check_sortedness=False,  # both sides are sorted on the key; polars cannot check it per `by` group
        )
        .filter(pl.col("end").is_not_null() & (pl.col("time_created_ns") <= pl.col("end") + SLACK_NS))
    )
    return pairs.unique(["tid", "ts"], keep="first", maintain_order=True).with_columns(
        (pl.col("ts") - pl.col("time_created_ns")).alias("d")
    )


def join_rank(rank: int, trace: FileTrace, mine: pl.DataFrame) -> tuple[RankJoin, pl.DataFrame]:
    """One rank's trace joined to its dump entries (collectives only): how, how many, and the pairs
    (``pg_name``, ``dump_seq``, ``tid``, ``ts``, ``end``) for `host_activity`."""
    path = trace.meta.path
    calls = trace_calls(trace.events)
    mine = mine.filter(~pl.col("is_p2p"))
    base = {"rank": rank, "trace": path, "dump_entries": mine.height, "trace_calls": calls.height}
    empty = pl.DataFrame(
        schema={"pg_name": pl.String, "dump_seq": pl.Int64, "tid": pl.Int64, "ts": pl.Int64, "end": pl.Int64}
    )
    if not calls.height:
        return RankJoin(**base, method="none", matched=0, why="the trace has no collective call"), empty
    seq = _by_seq(calls, mine)
    if seq.height:
        agree = seq.filter(pl.col("agree"))
        median = int(agree["d"].median()) if agree.height else 0
        spread = int((agree["d"] - median).abs().max()) if agree.height else 0
        if agree.height >= max(1, 0.9 * seq.height) and spread <= SPREAD_NS:
            pairs = agree.select("group", "seq", "tid", "ts", "end").rename({"group": "pg_name", "seq": "dump_seq"})
            why = (
                f"the trace's clock is {median / 1e9:+,.1f} s off the dump's (another host's clock?): joined by "
                "sequence id only"
                if abs(median) > CLOCK_NOTE_NS
                else None
            )
            return RankJoin(**base, method="seq", matched=pairs.height, offset_ns=median, why=why), pairs
        why = (
            f"sequence ids match ({seq.height}) but {seq.height - agree.height} ops differ"
            if agree.height < 0.9 * seq.height
            else f"sequence ids match ({seq.height}) but their times spread over {spread / 1e9:,.1f} s"
        )
        return RankJoin(**base, method="none", matched=0, why=why + " (a trace of another job?)"), empty
    if trace.meta.time_base != "epoch":
        why = "the trace has no sequence ids and no absolute clock to match times on"
        return RankJoin(**base, method="none", matched=0, why=why), empty
    timed = _by_time(calls, mine)
    if timed.height:
        pairs = timed.select("pg_name", "dump_seq", "tid", "ts", "end")
        median = int(timed["d"].median())
        return RankJoin(**base, method="time", matched=pairs.height, offset_ns=median), pairs
    t0, t1 = calls["ts"].min(), calls["end"].max()
    created = mine["time_created_ns"].drop_nulls()
    if created.len():
        gap = (created.min() - t1) if created.min() > t1 else (t0 - created.max()) if created.max() < t0 else 0
        where = (
            f"the dump's entries lie {gap / 1e9:,.1f} s outside the trace's span (another job, or another clock)"
            if gap > 0
            else "no collective call of the trace holds an entry's creation time (another job, or another clock)"
        )
    else:
        where = "the dump's entries have no creation times"
    return RankJoin(**base, method="none", matched=0, why=f"no sequence ids in the trace, and {where}"), empty


def host_activity(
    rank: int, trace: FileTrace, pairs: pl.DataFrame, pg_name: str, after_seq: int | None, method: str
) -> HostActivity | None:
    """What the rank's host did after collective `after_seq` of `pg_name` (joined in `pairs`): the
    top-level host operators of the calling thread (where the calls are communication events, the host
    thread with the most operator time) in the window up to the next collective call (or the trace's
    end), longest first; None when that collective is not joined."""
    if after_seq is None:
        return None
    hit = pairs.filter((pl.col("pg_name") == pg_name) & (pl.col("dump_seq") == after_seq))
    if not hit.height:
        return None
    tid, start = hit["tid"][0], int(hit["end"][0])
    ev = trace.events
    calls = trace_calls(ev)
    later = calls.filter(pl.col("ts") >= start)
    host = ev.filter((pl.col("device") < 0) & pl.col("kind").cast(pl.String).is_in(list(HOST_KINDS)))
    if not host.filter(pl.col("tid") == tid).height and host.height:  # joined on a communication thread
        tid = host.group_by("tid").agg(pl.col("dur").sum()).sort("dur", "tid", descending=[True, False])["tid"][0]
    if later.height:
        stop, until = int(later["ts"][0]), "next_collective"
    else:
        stop, until = int((host["ts"] + host["dur"]).max() or start), "trace_end"
    top = (
        host.filter(pl.col("tid") == tid)
        .sort("ts", pl.col("dur"), descending=[False, True])
        .with_columns((pl.col("ts") + pl.col("dur")).alias("end"))
        .filter(pl.col("ts") >= pl.col("end").cum_max().shift(1).fill_null(-(2**62)))  # top-level on the thread
        .filter((pl.col("end") > start) & (pl.col("ts") < stop))
        .with_columns((pl.min_horizontal("end", pl.lit(stop)) - pl.max_horizontal("ts", pl.lit(start))).alias("inside"))
        .sort("inside", descending=True)
    )
    ops = tuple(
        HostOp(name=str(r["name"]), kind=str(r["kind"]), ts=r["ts"], dur_ns=r["dur"], inside_ns=r["inside"])
        for r in top.head(TOP_OPS).iter_rows(named=True)
    )
    return HostActivity(
        rank=rank,
        trace=trace.meta.path,
        pg_name=pg_name,
        after_seq=after_seq,
        window_start=start,
        window_ns=stop - start,
        until=until,
        method=method,
        busy_ns=int(top["inside"].sum()),
        ops=ops,
    )


def join_traces(report: HangReport, dumps: FlightDumps, traces: list[FileTrace], not_traces: int = 0) -> HangReport:
    """`report` with each trace joined to its rank's dump (`joins`), the culprits' host after their last
    completed collective (`activity`), the sentence saying it, and a note per trace not joined, per
    dumped rank without a trace, and of the join counts."""
    from dataclasses import replace

    from tracediag.desync.sentence import ranks_text, sentence_for

    by_rank: dict[int, FileTrace] = {}
    for t in traces:
        if t.meta.rank in by_rank:
            first = shown(by_rank[t.meta.rank].meta.path)
            msg = f"{first}, {shown(t.meta.path)}: two profiler traces of rank {t.meta.rank}"
            raise RankError(msg)
        by_rank[t.meta.rank] = t
    dumped = set(report.dumped_ranks)
    joins: list[RankJoin] = []
    pairs: dict[int, pl.DataFrame] = {}
    for rank in sorted(by_rank):
        t = by_rank[rank]
        if rank not in dumped:
            joins.append(
                RankJoin(
                    rank=rank,
                    trace=t.meta.path,
                    method="none",
                    matched=0,
                    dump_entries=0,
                    trace_calls=trace_calls(t.events).height,
                    why=f"no dump of rank {rank}",
                )
            )
            continue
        j, p = join_rank(rank, t, dumps.entries.filter(pl.col("rank") == rank))
        joins.append(j)
        pairs[rank] = p
    cause = next((g for g in report.groups if g.pg_name == report.culprit_group), None)
    activity = []
    if cause is not None:
        states = {s.rank: s for s in cause.states}
        for r in report.culprit_ranks:
            if r in pairs and r in states:
                method = next(j.method for j in joins if j.rank == r)
                a = host_activity(r, by_rank[r], pairs[r], cause.pg_name, states[r].last_completed, method)
                if a is not None:
                    activity.append(a)
    notes = list(report.notes)
    for j in joins:
        if j.method == "none":
            notes.append(f"profiler trace of rank {j.rank} ({shown(j.trace)}) not joined: {j.why}")
        elif j.why:
            notes.append(f"profiler trace of rank {j.rank}: {j.why}")
    untraced = sorted(dumped - set(by_rank))
    if untraced:
        notes.append(f"no profiler trace of rank{'s' if len(untraced) > 1 else ''} {ranks_text(untraced)} (dumped)")
    how = {m: sum(1 for j in joins if j.method == m) for m in ("seq", "time", "none")}
    notes.append(
        f"profiler traces: {len(joins)} read, {how['seq'] + how['time']} joined to their dumps "
        f"(by sequence id: {how['seq']}, by time: {how['time']}), {how['none']} not joined"
        + (
            f"; {not_traces} other file{'s' if not_traces > 1 else ''} of the trace directories skipped"
            if not_traces
            else ""
        )
    )
    joined = replace(report, joins=tuple(joins), activity=tuple(activity), notes=tuple(notes))
    return replace(joined, sentence=sentence_for(joined, cause))


TRACE_SUFFIXES = (".json", ".json.gz")
"""The files a trace directory is searched for (Kineto exports: ``*.pt.trace.json[.gz]``)."""


def read_job_traces(
    sources: str | Path | Iterable[str | Path], storage_options: dict | None = None
) -> tuple[list[FileTrace], int]:
    """Every profiler trace the sources name (files; directories searched recursively for `TRACE_SUFFIXES`;
    globs; URLs), and how many other files the directories held (skipped)."""
    from tracediag.ingest.flight import resolve_dump_paths
    from tracediag.ingest.read import read_traces

    srcs = [sources] if isinstance(sources, str | Path) else list(sources)
    out: list[FileTrace] = []
    skipped = 0
    for path, in_directory in resolve_dump_paths([str(s) for s in srcs], storage_options):
        if in_directory and not path.endswith(TRACE_SUFFIXES):
            skipped += 1
            continue
        out.extend(read_traces(path, storage_options=storage_options))
    return out, skipped
