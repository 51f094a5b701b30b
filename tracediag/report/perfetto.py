"""Every rank's timeline in one Trace Event Format file (ui.perfetto.dev, chrome://tracing), with the
analysis drawn on it (docs/perfetto.md).

Ranks are processes (named ``rank N``, the ranks everyone waits for sorted first), each rank's host
threads and device streams its threads, on the clocks the analysis aligned (`perfetto_tracks`). Beside
them, per rank: the collectives it waited at and those it arrived last at, with a flow from each
waiter to the late rank; each finding as a slice over its steps; the device's idle gaps by kind; and
an ``analysis`` process with the what-if step time as a counter.

The file is written in batches: each event is one line built from polars columns (names and every
other string from a file JSON-encoded by orjson, once per distinct value), so no Python object is
made per trace event.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import IO, TYPE_CHECKING, Any

import orjson
import polars as pl

from tracediag.output import write_atomic
from tracediag.report.perfetto_limits import DEFAULT_MAX_EVENTS
from tracediag.report.perfetto_tracks import IDLE_KINDS, Tracks, derive_tracks
from tracediag.units import count

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from tracediag.analysis import Analysis
    from tracediag.run import Run

WAIT_TID, LATE_TID, IDLE_TID, FINDING_TID = 2**30, 2**30 + 1, 2**30 + 2, 2**30 + 16
"""Thread ids of the analysis' tracks inside each rank's process (the timeline's are 1, 2, ...)."""

IDLE_NAMES = {
    "host": "idle: waiting on the host",
    "kernel": "idle: launch latency",
    "other": "idle: other (queued work held, or CPU rank)",
}
"""Slice name per idle kind (`perfetto_tracks.IDLE_KINDS`)."""

_BATCH = 200_000
"""Events serialised per batch."""


@dataclass(frozen=True)
class Exported:
    """What `write_perfetto` wrote and what it left out."""

    path: str
    events: int
    """Events in the file (timeline, analysis, metadata)."""
    timeline_events: int
    """Timeline events of the exported ranks, before the cap."""
    left_out: int = 0
    """Timeline events left out by the cap (the shortest)."""
    shortest_kept_ns: int | None = None
    """The shortest timeline event kept when the cap left some out."""
    ranks: tuple[int, ...] = ()
    """The ranks exported."""
    ranks_left_out: tuple[int, ...] = ()
    """Ranks of the run not exported (``--ranks``)."""
    flows_left_out: int = 0
    """Flows to a late rank that was not exported."""

    def warning(self) -> str:
        """One line saying what was left out, or "" when nothing was."""
        parts = []
        if self.left_out:
            shortest = (self.shortest_kept_ns or 0) / 1000
            parts.append(
                f"{self.left_out:,} of {self.timeline_events:,} timeline events left out (the shortest, under "
                f"{shortest:,.1f} µs; --max-events raises the cap)"
            )
        if self.ranks_left_out:
            parts.append(f"{count(len(self.ranks_left_out), 'rank')} not exported (--ranks)")
        if self.flows_left_out:
            parts.append(f"{count(self.flows_left_out, 'flow')} to late ranks not exported left out")
        return "; ".join(parts)


def write_perfetto(
    path: str,
    run: Run,
    analysis: Analysis,
    *,
    ranks: Iterable[int] | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
    step_regex: str | None = None,
) -> Exported:
    """Write `run`'s timeline with `analysis` drawn on it to `path` (atomically). `ranks`: only these
    (None: all); `max_events`: at most this many timeline events, the longest kept. ValueError when
    `ranks` names none of the run's ranks."""
    tracks = derive_tracks(run, analysis, step_regex=step_regex)
    run_ranks = tuple(sorted(run.events["rank"].unique().to_list()))
    chosen = run_ranks if ranks is None else tuple(r for r in run_ranks if r in set(ranks))
    if not chosen:
        msg = f"--ranks names none of the run's ranks ({_span(run_ranks)})"
        raise ValueError(msg)
    timeline, kept_threads, n_timeline, shortest = _timeline(run.events, tracks.offsets, chosen, max_events)
    origin = _origin(timeline, analysis, chosen)
    lateness, flows_left_out = _lateness(tracks, chosen)
    parts = [
        _metadata(kept_threads, analysis, chosen),
        lateness,
        _findings(analysis, chosen),
        _idle(tracks, chosen),
        _whatif(analysis, chosen),
    ]
    exported = Exported(
        path=path,
        events=0,
        timeline_events=n_timeline,
        left_out=max(n_timeline - timeline.height, 0),
        shortest_kept_ns=shortest,
        ranks=chosen,
        ranks_left_out=tuple(r for r in run_ranks if r not in set(chosen)),
        flows_left_out=flows_left_out,
    )
    counted = [0]

    def chunks() -> Iterator[bytes]:
        for frame in [*parts, timeline]:
            for i in range(0, frame.height, _BATCH):
                batch = frame.slice(i, _BATCH)
                counted[0] += batch.height
                yield _lines(batch, origin)["line"].str.join(",\n").item().encode()

    other = _other_data(exported, tracks, origin, analysis)
    write_atomic(path, lambda f: _write(f, chunks(), other))
    return replace(exported, events=counted[0])


def _span(ranks: tuple[int, ...]) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if ranks else "none"


def _write(f: IO[bytes], chunks: Iterator[bytes], other: dict[str, Any]) -> None:
    f.write(b'{"traceEvents":[\n')
    first = True
    for chunk in chunks:
        if chunk:
            f.write(chunk if first else b",\n" + chunk)
            first = False
    f.write(b'\n],"displayTimeUnit":"ns","otherData":' + orjson.dumps(other) + b"}\n")


def _other_data(exported: Exported, tracks: Tracks, origin: int, analysis: Analysis) -> dict[str, Any]:
    """The file's ``otherData``: where its clock starts, how ranks were aligned, what was left out."""
    late = analysis.lateness.waited_for if analysis.lateness is not None else ()
    return {
        "tracediag": {
            "origin_ns": origin,
            "clock": "each rank's ts - offset_ns (aligned at the collectives, one offset per host), minus origin_ns",
            "offset_ns": {str(r): o for r, o in tracks.offsets.select("rank", "offset_ns").iter_rows()},
            "host_offset_ns": tracks.host_offsets(),
            "ranks": list(exported.ranks),
            "waited_for": list(late),
            "left_out": {
                "timeline_events": exported.left_out,
                "of_timeline_events": exported.timeline_events,
                "shortest_kept_ns": exported.shortest_kept_ns,
                "ranks": list(exported.ranks_left_out),
                "flows": exported.flows_left_out,
            },
        }
    }


# ---- one line per event, from columns ----


def quoted(values: pl.Series) -> pl.Series:
    """Each value as a JSON string literal, by orjson (once per distinct value); null as ``null``."""
    text = values.cast(pl.String)
    mapping = {v: orjson.dumps(v).decode() for v in text.drop_nulls().unique().to_list()}
    return text.replace_strict(mapping, default="null", return_dtype=pl.String)


def _us(ns: pl.Expr) -> pl.Expr:
    """Non-negative ns as exact decimal µs (``1234567`` → ``1234.567``): no float rounding at epoch times."""
    return pl.concat_str((ns // 1000).cast(pl.String), pl.lit("."), (ns % 1000).cast(pl.String).str.zfill(3))


_LINE_COLUMNS = ("ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "bp", "args")
"""An event frame's columns: ph, name (JSON), cat (JSON), pid, tid, ts (aligned ns), dur (ns or null),
id (flows), bp (flow binding), args (JSON object text or null)."""


def _frame(df: pl.DataFrame | pl.LazyFrame, **cols: pl.Expr) -> pl.DataFrame:
    """`df` as an event frame (`_LINE_COLUMNS`), missing columns null."""
    typed = {
        "ph": pl.String,
        "name": pl.String,
        "cat": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "ts": pl.Int64,
        "dur": pl.Int64,
        "id": pl.Int64,
        "bp": pl.String,
        "args": pl.String,
    }
    exprs = [cols.get(c, pl.lit(None)).cast(t).alias(c) for c, t in typed.items()]
    out = df.lazy().select(exprs)
    return out.collect() if isinstance(out, pl.LazyFrame) else out


def _lines(events: pl.DataFrame, origin: int) -> pl.DataFrame:
    """One JSON object per event frame row."""

    def opt(key: str, value: pl.Expr) -> pl.Expr:
        return pl.when(value.is_null()).then(pl.lit("")).otherwise(pl.concat_str(pl.lit(f',"{key}":'), value))

    return events.select(
        pl.concat_str(
            pl.lit('{"ph":"'),
            pl.col("ph"),
            pl.lit('","pid":'),
            pl.col("pid").cast(pl.String),
            opt("tid", pl.col("tid").cast(pl.String)),
            opt("ts", _us(pl.col("ts") - origin)),
            opt("dur", _us(pl.col("dur"))),
            opt("name", pl.col("name")),
            opt("cat", pl.col("cat")),
            opt("id", pl.col("id").cast(pl.String)),
            opt("bp", pl.concat_str(pl.lit('"'), pl.col("bp"), pl.lit('"'))),
            opt("args", pl.col("args")),
            pl.lit("}"),
        ).alias("line")
    )


def _origin(timeline: pl.DataFrame, analysis: Analysis, ranks: tuple[int, ...]) -> int:
    """The earliest aligned time drawn: the file's zero (timestamps stay small and non-negative)."""
    starts = analysis.steps.filter(pl.col("rank").is_in(ranks))["start_ns"]
    candidates = [v for v in (timeline["ts"].min(), starts.min()) if v is not None]
    return int(min(candidates)) if candidates else 0


# ---- the timeline ----


def _timeline(
    events: pl.DataFrame, offsets: pl.DataFrame, ranks: tuple[int, ...], max_events: int
) -> tuple[pl.DataFrame, pl.DataFrame, int, int | None]:
    """The exported ranks' events as X events on aligned clocks (the longest `max_events` when more),
    their threads (``rank, device, thr, tid``), how many there were, and the shortest kept when capped."""
    thr = pl.when(pl.col("device") >= 0).then(pl.col("stream")).otherwise(pl.col("tid"))
    lf = (
        events.lazy()
        .filter(pl.col("rank").is_in(ranks))
        .join(offsets.lazy(), on="rank", how="left", maintain_order="left")
        .select(
            "rank",
            "device",
            "kind",
            "name",
            "dur",
            thr=thr,
            ts=pl.col("ts") - pl.col("offset_ns").fill_null(0),
        )
    )
    rows = lf.collect()
    n = rows.height
    shortest = None
    if n > max_events:
        rows = rows.filter(pl.col("dur").rank("ordinal", descending=True) <= max_events)
        shortest = int(rows["dur"].min()) if rows.height else None
    threads = (
        rows.select("rank", "device", "thr")
        .unique()
        .sort("rank", "device", "thr", nulls_last=True)
        .with_columns(tid=(pl.int_range(pl.len()).over("rank") + 1).cast(pl.Int64))
    )
    joined = rows.join(threads, on=["rank", "device", "thr"], how="left", nulls_equal=True, maintain_order="left")
    frame = _frame(
        joined.with_columns(name=quoted(joined["name"]), cat=quoted(joined["kind"])),
        ph=pl.lit("X"),
        name=pl.col("name"),
        cat=pl.col("cat"),
        pid=pl.col("rank"),
        tid=pl.col("tid"),
        ts=pl.col("ts"),
        dur=pl.col("dur"),
    )
    return frame, threads, n, shortest


# ---- metadata: names and order ----


def _order(analysis: Analysis, ranks: tuple[int, ...]) -> list[int]:
    """Ranks in display order: those everyone waits for first, then rank order."""
    late = [r for r in (analysis.lateness.waited_for if analysis.lateness else ()) if r in ranks]
    return late + [r for r in ranks if r not in late]


def analysis_pid(ranks: tuple[int, ...]) -> int:
    """The pid of the ``analysis`` process: one past the highest rank."""
    return max(ranks) + 1


def _meta(pid: int, name: str, args: dict[str, Any], tid: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": args}
    if tid is not None:
        out["tid"] = tid
    return out


def _metadata(threads: pl.DataFrame, analysis: Analysis, ranks: tuple[int, ...]) -> pl.DataFrame:
    """process_name / process_sort_index per rank and for the analysis; thread_name / thread_sort_index."""
    late = set(analysis.lateness.waited_for) if analysis.lateness else set()
    apid = analysis_pid(ranks)
    rows = [_meta(apid, "process_name", {"name": "analysis"}), _meta(apid, "process_sort_index", {"sort_index": 0})]
    rows.append(_meta(apid, "thread_name", {"name": "what-if"}, 0))
    for i, r in enumerate(_order(analysis, ranks)):
        label = f"rank {r} (everyone waits for it)" if r in late else f"rank {r}"
        rows += [_meta(r, "process_name", {"name": label}), _meta(r, "process_sort_index", {"sort_index": i + 1})]
        named = [(WAIT_TID, "collectives: waited"), (LATE_TID, "collectives: arrived last"), (IDLE_TID, "device idle")]
        named += [(FINDING_TID + j, f"finding {j + 1}: {f.cause.value}") for j, f in enumerate(analysis.findings)]
        for k, (tid, name) in enumerate(named):
            rows += [
                _meta(r, "thread_name", {"name": name}, tid),
                _meta(r, "thread_sort_index", {"sort_index": k}, tid),
            ]
    meta = _dict_frame(rows)
    thread_names = threads.with_columns(
        label=pl.when(pl.col("device") >= 0)
        .then(pl.format("GPU {} stream {}", pl.col("device"), pl.col("thr").cast(pl.String).fill_null("?")))
        .otherwise(pl.format("thread {}", pl.col("thr").cast(pl.String).fill_null("?")))
    )
    names = _frame(
        thread_names.with_columns(name=quoted(thread_names["label"])),
        ph=pl.lit("M"),
        name=pl.lit('"thread_name"'),
        pid=pl.col("rank"),
        tid=pl.col("tid"),
        args=pl.concat_str(pl.lit('{"name":'), pl.col("name"), pl.lit("}")),
    )
    sorts = _frame(
        threads,
        ph=pl.lit("M"),
        name=pl.lit('"thread_sort_index"'),
        pid=pl.col("rank"),
        tid=pl.col("tid"),
        args=pl.format('{{"sort_index":{}}}', pl.col("tid") + 100),
    )
    return pl.concat([meta, names, sorts])


def _dict_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Few events given as dicts (metadata, findings, counters) as an event frame, strings by orjson."""
    if not rows:
        return _frame(pl.DataFrame({"_": []}))
    df = pl.DataFrame(
        {
            "ph": [r["ph"] for r in rows],
            "name": [orjson.dumps(r["name"]).decode() for r in rows],
            "cat": [orjson.dumps(r["cat"]).decode() if "cat" in r else None for r in rows],
            "pid": [r["pid"] for r in rows],
            "tid": [r.get("tid") for r in rows],
            "ts": [r.get("ts") for r in rows],
            "dur": [r.get("dur") for r in rows],
            "args": [orjson.dumps(r["args"]).decode() if "args" in r else None for r in rows],
        },
        schema_overrides={"tid": pl.Int64, "ts": pl.Int64, "dur": pl.Int64, "pid": pl.Int64},
    )
    return _frame(df, **{c: pl.col(c) for c in df.columns})


# ---- the analysis drawn ----


def _disjoint(df: pl.DataFrame, by: str = "rank") -> pl.DataFrame:
    """Slices of one thread per `by` made disjoint (a thread's slices must nest): of slices starting
    together the longest; each ending at the latest where the next begins."""
    return (
        df.sort(by, "ts", "end", maintain_order=True)
        .group_by(by, "ts", maintain_order=True)
        .agg(pl.all().last())
        .sort(by, "ts")
        .with_columns(end=pl.min_horizontal("end", pl.col("ts").shift(-1).over(by).fill_null(pl.col("end"))))
    )


def _lateness(tracks: Tracks, ranks: tuple[int, ...]) -> tuple[pl.DataFrame, int]:
    """Per rank the collectives it waited at (slice: arrival → last arrival) and those it arrived last
    at (slice: arrival → end), and a flow from each waiter's slice to the late rank's; how many flows
    went to ranks not exported."""
    arr = tracks.arrivals
    waited = arr.filter(pl.col("wait_ns") > 0, pl.col("rank") != pl.col("late_rank"))
    first = arr.group_by("iid").agg(first=pl.col("arrival").min(), waiters=(pl.col("wait_ns") > 0).sum())
    late = (
        arr.filter(pl.col("rank") == pl.col("late_rank"))
        .join(first, on="iid", maintain_order="left")
        .filter(pl.col("waiters") > 0)
    )
    mine = pl.col("rank").is_in(ranks)
    waits = _disjoint(waited.filter(mine).with_columns(ts="arrival", end=pl.col("arrival") + pl.col("wait_ns")))
    lasts = _disjoint(
        late.filter(mine).with_columns(ts="arrival", end=pl.max_horizontal("aligned_end", pl.col("arrival") + 1))
    )

    def args(df: pl.DataFrame, extra: list[pl.Expr]) -> pl.Expr:
        return pl.concat_str(
            pl.lit('{"op":'),
            quoted(df["op"]),
            pl.lit(',"group":'),
            quoted(df["group"]),
            pl.lit(',"seq":'),
            pl.col("seq").cast(pl.String).fill_null("null"),
            pl.lit(',"step":'),
            pl.col("step").cast(pl.String).fill_null("null"),
            *extra,
            pl.lit("}"),
        )

    wait_frame = _frame(
        waits,
        ph=pl.lit("X"),
        name=pl.format('"waits for rank {}"', pl.col("late_rank")),
        cat=pl.lit('"lateness"'),
        pid=pl.col("rank"),
        tid=pl.lit(WAIT_TID),
        ts=pl.col("ts"),
        dur=pl.col("end") - pl.col("ts"),
        args=args(waits, [pl.format(',"late_rank":{},"wait_ns":{}', pl.col("late_rank"), pl.col("wait_ns"))]),
    )
    late_frame = _frame(
        lasts,
        ph=pl.lit("X"),
        name=pl.lit('"arrived last"'),
        cat=pl.lit('"lateness"'),
        pid=pl.col("rank"),
        tid=pl.lit(LATE_TID),
        ts=pl.col("ts"),
        dur=pl.col("end") - pl.col("ts"),
        args=args(
            lasts,
            [pl.format(',"waiters":{},"skew_ns":{}', pl.col("waiters"), pl.col("arrival") - pl.col("first"))],
        ),
    )
    # flows: from each waiter's arrival to the late rank's arrival at the same instance
    to = late.select("iid", late_ts="arrival")
    flows = waited.filter(mine).join(to, on="iid", how="left").sort("rank", "arrival", "iid")
    shown = flows.filter(pl.col("late_rank").is_in(ranks)).with_columns(id=pl.int_range(pl.len()).cast(pl.Int64) + 1)
    common = {"name": pl.lit('"waits for"'), "cat": pl.lit('"lateness"'), "id": pl.col("id")}
    starts = _frame(shown, ph=pl.lit("s"), pid=pl.col("rank"), tid=pl.lit(WAIT_TID), ts=pl.col("arrival"), **common)
    ends = _frame(
        shown, ph=pl.lit("f"), bp=pl.lit("e"), pid=pl.col("late_rank"), tid=pl.lit(LATE_TID), ts=pl.col("late_ts"),
        **common,
    )  # fmt: skip
    return pl.concat([wait_frame, late_frame, starts, ends]), flows.height - shown.height


def _findings(analysis: Analysis, ranks: tuple[int, ...]) -> pl.DataFrame:
    """Each finding as one slice per (rank, step) of its ranks and steps, over that rank's step, on
    its own thread; its sentence, what-if and evidence in args."""
    frames = []
    for j, f in enumerate(analysis.findings):
        args = {
            "summary": f.summary,
            "whatif": f.whatif,
            "time_lost_ns": f.time_lost_ns,
            "step_time_without_ns": f.step_time_without_ns,
            "confidence": round(float(f.confidence), 3),
            "measurable": f.measurable,
            "ranks": list(f.ranks),
            "steps": list(f.steps),
            "evidence": f.to_dict()["evidence"],
        }
        cells = analysis.steps.filter(
            pl.col("rank").is_in(f.ranks), pl.col("rank").is_in(ranks), pl.col("step").is_in(f.steps)
        )
        frames.append(
            _frame(
                cells,
                ph=pl.lit("X"),
                name=pl.lit(orjson.dumps(f.cause.value).decode()),
                cat=pl.lit('"finding"'),
                pid=pl.col("rank"),
                tid=pl.lit(FINDING_TID + j),
                ts=pl.col("start_ns"),
                dur=pl.col("dur_ns"),
                args=pl.lit(orjson.dumps(args, default=str).decode()),
            )
        )
    return pl.concat(frames) if frames else _frame(pl.DataFrame({"_": []}))


def _idle(tracks: Tracks, ranks: tuple[int, ...]) -> pl.DataFrame:
    """The device's idle gaps, one slice per kind."""
    idle = tracks.idle.filter(pl.col("rank").is_in(ranks))
    names = {k: orjson.dumps(IDLE_NAMES[k]).decode() for k in IDLE_KINDS}
    return _frame(
        idle,
        ph=pl.lit("X"),
        name=pl.col("kind").cast(pl.String).replace_strict(names, return_dtype=pl.String),
        cat=pl.lit('"idle"'),
        pid=pl.col("rank"),
        tid=pl.lit(IDLE_TID),
        ts=pl.col("ts"),
        dur=pl.col("end") - pl.col("ts"),
        args=pl.format('{{"kind":"{}","step":{}}}', pl.col("kind").cast(pl.String), pl.col("step")),
    )


def _whatif(analysis: Analysis, ranks: tuple[int, ...]) -> pl.DataFrame:
    """The what-if step time (ms) as a counter on the analysis process: one sample per step, at its
    earliest start over the exported ranks."""
    w = analysis.whatif
    if w is None or not w.steps:
        return _frame(pl.DataFrame({"_": []}))
    starts = dict(
        analysis.steps.filter(pl.col("rank").is_in(ranks)).group_by("step").agg(pl.col("start_ns").min()).iter_rows()
    )
    apid = analysis_pid(ranks)
    rows = [
        {
            "ph": "C",
            "name": "step time (ms)",
            "pid": apid,
            "tid": 0,
            "ts": starts[s.step],
            "args": {
                "observed": s.observed_ns / 1e6,
                "replayed": s.replayed_ns / 1e6,
                "without every cause": s.without_all_ns / 1e6,
            },
        }
        for s in w.steps
        if s.step in starts
    ]
    return _dict_frame(rows)
