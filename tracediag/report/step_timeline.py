"""Per-rank, per-stream timelines of one step for the HTML report, drawn from the run's events.

One timeline for the slowest step and one per finding (its worst step, its ranks beside a typical
peer): a row per (rank, device stream) of kernels, communication and copies, a row per (rank, host
thread, nesting level) of operators, a ``collectives`` row per rank with its waits for the last
arriver (red) and a marker where a rank arrives last, and a ``device idle`` row per GPU rank with its
idle gaps split as the breakdown splits them (waiting on the host, between kernels, other). Clocks are
the analysis' aligned ones (`perfetto_tracks.derive_tracks`, as the Perfetto export draws them). The
page stays bounded: at most `MAX_RANKS` ranks, `MAX_ROWS_PER_RANK` rows per rank, `MAX_LEVELS` nesting
levels, `MAX_BARS` bars and `MAX_IDLE_BARS` idle gaps per timeline (the longest), each figure's
caption saying what was left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause
from tracediag.kernel_names import short_names
from tracediag.report.figures import COLORS, Figure, _layout, esc
from tracediag.units import NS_PER_MS, count

if TYPE_CHECKING:
    from tracediag.analysis import Analysis, Finding
    from tracediag.report.perfetto_tracks import Tracks
    from tracediag.run import Run

MAX_VIEWS = 5
"""Timelines per page: the slowest step and the first findings."""
MAX_RANKS = 6
MAX_ROWS_PER_RANK = 8
"""Rows per rank besides its collectives row (the busiest streams and threads)."""
MAX_LEVELS = 3
"""Nesting levels of host operators drawn (deeper ones are inside those shown)."""
MAX_BARS = 2500
"""Bars per timeline; beyond it the shortest are left out (and counted in the caption)."""

DEVICE_KINDS = ("kernel", "comm", "memcpy", "memset", "sync")
HOST_KINDS = ("cpu_op", "annotation", "comm")
KIND_STYLE = {
    "kernel": ("kernel", COLORS["compute"]),
    "cpu_op": ("operator", "#7f9cc0"),
    "annotation": ("annotation", "#c7c1bb"),
    "comm": ("communication", COLORS["transfer"]),
    "memcpy": ("copy", COLORS["copy"]),
    "memset": ("copy", COLORS["copy"]),
    "sync": ("sync", COLORS["exposed comm"]),
}
"""Legend entry and colour per event kind."""
IDLE_STYLE = {
    "host": ("device idle: waiting on the host", COLORS["idle: waiting on host"]),
    "kernel": ("device idle: between kernels", COLORS["idle: between kernels"]),
    "other": ("device idle: other", COLORS["idle: other"]),
}
"""Legend entry and colour per kind of device idle gap (`perfetto_tracks.IDLE_KINDS`), as the breakdown's."""
MAX_IDLE_BARS = 600
"""Idle gaps per timeline (the longest)."""


@dataclass(frozen=True)
class View:
    """One timeline: a step and the ranks to draw, in order."""

    anchor: str
    """The HTML id of its section (a finding's card links to it)."""
    title: str
    step: int
    ranks: tuple[int, ...]
    why: str
    """Which ranks and why, for the caption."""


def _step_ranks(in_step: pl.DataFrame, first: list[int], limit: int, *, fill: bool) -> tuple[int, ...]:
    """`first` (at most `limit - 1` of them when peers remain), then a typical peer (the median step
    time) and the fastest; `fill`: then the slowest others, up to `limit`."""
    by_dur = in_step.sort("dur_ns", "rank")["rank"].to_list()
    peers = [r for r in by_dur if r not in first]
    keep = first[: limit - 1] if peers else first[:limit]
    chosen = list(dict.fromkeys(keep + ([peers[len(peers) // 2]] if peers else []) + peers[:1]))
    for r in by_dur[::-1] if fill else ():
        if len(chosen) >= min(limit, len(by_dur)):
            break
        if r not in chosen:
            chosen.append(r)
    return tuple(chosen[:limit])


def _finding_view(analysis: Analysis, f: Finding, i: int) -> View | None:
    steps = analysis.steps.filter(pl.col("step").is_in(list(f.steps)))
    if not f.steps or steps.height == 0:
        return None
    mine = steps.filter(pl.col("rank").is_in(list(f.ranks)))
    worst = int(mine.sort("dur_ns", "step", descending=[True, False])["step"][0]) if mine.height else int(f.steps[0])
    in_step = analysis.steps.filter(pl.col("step") == worst)
    own = set(f.ranks)
    named = in_step.filter(pl.col("rank").is_in(list(own))).sort("dur_ns", descending=True)["rank"].to_list()
    ranks = _step_ranks(in_step, named, MAX_RANKS, fill=False)
    peers = [r for r in ranks if r not in own]
    shown = len(ranks) - len(peers)
    mine = (
        f"{count(shown, 'rank')} of the finding"
        if shown == len(f.ranks)
        else f"{shown} of the finding's {len(f.ranks):,} ranks (the slowest in the step)"
    )
    why = mine + (f", with peers {', '.join(map(str, peers))}" if peers else "")
    return View(f"timeline-finding-{i}", f"Finding {i}: {f.cause.value}, step {worst}", worst, ranks, why)


def views(analysis: Analysis) -> list[View]:
    """The slowest step's timeline, then one per finding (not `healthy`), at most `MAX_VIEWS`."""
    steps = analysis.steps
    if steps.height == 0:
        return []
    spans = steps.group_by("step").agg(span=(pl.col("start_ns") + pl.col("dur_ns")).max() - pl.col("start_ns").min())
    slowest = int(spans.sort("span", "step", descending=[True, False])["step"][0])
    in_step = steps.filter(pl.col("step") == slowest)
    late = list(analysis.lateness.waited_for) if analysis.lateness is not None else []
    by_dur = in_step.sort("dur_ns", "rank", descending=[True, False])["rank"].to_list()
    first = [r for r in late if r in set(by_dur)] + by_dur[:2]
    out = [
        View(
            "timeline-slowest",
            f"The slowest step ({slowest})",
            slowest,
            _step_ranks(in_step, list(dict.fromkeys(first)), MAX_RANKS, fill=True),
            ("the ranks everyone waits for, " if late else "") + "the slowest, a typical peer and the fastest",
        )
    ]
    for i, f in enumerate(analysis.findings, 1):
        v = _finding_view(analysis, f, i) if f.cause != Cause.HEALTHY else None
        if v is not None and len(out) < MAX_VIEWS:
            out.append(v)
    return out


def finding_anchor(i: int) -> str:
    """The id of finding `i`'s (1-based) timeline section."""
    return f"timeline-finding-{i}"


# ---- bars from the events ----


def _levels(rows: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """`rows` with ``level``: 0 for an event no earlier event of its row encloses, 1 inside those, ...
    (each level the outermost of what is left); deeper than `MAX_LEVELS` dropped. Events with the same
    span are ordered by name and kind, so the levels (and the page) do not depend on the input's order."""
    by = [*key, "ts", "end", "name", "kind"]
    out, rest = [], rows.sort(by, descending=[False] * len(key) + [False, True, False, False], nulls_last=True)
    for level in range(MAX_LEVELS):
        if rest.height == 0:
            break
        before = pl.col("end").cum_max().shift(1).over(key)
        top = before.is_null() | (pl.col("ts") >= before)
        marked = rest.with_columns(_top=top)
        out.append(marked.filter("_top").drop("_top").with_columns(level=pl.lit(level, pl.Int32)))
        rest = marked.filter(~pl.col("_top")).drop("_top")
    return pl.concat(out) if out else rows.with_columns(level=pl.lit(0, pl.Int32)).head(0)


def _bars(run: Run, offsets: pl.DataFrame, view: View, t0: int, t1: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The bars ``rank, row, kind, name, ts, end`` (aligned, clipped to [t0, t1]) of the view's ranks,
    and their rows (``rank, row``, in display order)."""
    device = pl.col("device") >= 0
    kinds = pl.when(device).then(pl.col("kind").is_in(DEVICE_KINDS)).otherwise(pl.col("kind").is_in(HOST_KINDS))
    ev = (
        run.events.lazy()
        .filter(pl.col("rank").is_in(view.ranks) & kinds)
        .join(offsets.lazy(), on="rank", how="left")
        .with_columns(ts=pl.col("ts") - pl.col("offset_ns").fill_null(0))
        .with_columns(end=pl.col("ts") + pl.col("dur"))
        .filter((pl.col("ts") < t1) & (pl.col("end") > t0) & (pl.col("dur") > 0))
        .select(
            "rank",
            "device",
            thr=pl.when(device).then(pl.col("stream")).otherwise(pl.col("tid")),
            kind=pl.col("kind").cast(pl.String),
            name=pl.col("name").cast(pl.String),
            ts="ts",
            end="end",
        )
        .collect()
    )
    ev = _levels(ev, ["rank", "device", "thr"])
    busy = (
        ev.group_by("rank", "device", "thr", "level")
        .agg(busy=(pl.col("end").clip(upper_bound=t1) - pl.col("ts").clip(lower_bound=t0)).sum())
        .sort("rank", "busy", "device", "thr", "level", descending=[False, True, False, False, False], nulls_last=True)
        .with_columns(n=pl.int_range(pl.len()).over("rank"))
        .filter(pl.col("n") < MAX_ROWS_PER_RANK)
    )
    where = pl.when(pl.col("device") >= 0)
    label = pl.concat_str(
        pl.lit("rank "),
        pl.col("rank").cast(pl.String),
        where.then(pl.lit(" · stream ")).otherwise(pl.lit(" · thread ")),
        pl.col("thr").cast(pl.String).fill_null("?"),
        pl.when(pl.col("level") > 0).then(pl.lit(" ·") + (pl.col("level") + 1).cast(pl.String)).otherwise(pl.lit("")),
    )
    rows = busy.with_columns(row=label, host=pl.col("device") < 0).sort("rank", "host", "thr", "level")
    kept = ev.join(
        rows.select("rank", "device", "thr", "level", "row"),
        on=["rank", "device", "thr", "level"],
        nulls_equal=True,
        maintain_order="left",
    )
    return kept.with_columns(pl.col("ts").clip(lower_bound=t0), pl.col("end").clip(upper_bound=t1)), rows


def _idle(tracks: Tracks, view: View, t0: int, t1: int) -> tuple[pl.DataFrame, int]:
    """The device's idle gaps in the view (``rank, kind, ts, end``, clipped), the longest `MAX_IDLE_BARS`,
    and how many there were."""
    idle = (
        tracks.idle.filter(
            (pl.col("step") == view.step)
            & pl.col("rank").is_in(view.ranks)
            & (pl.col("ts") < t1)
            & (pl.col("end") > t0)
        )
        .with_columns(
            pl.col("ts").clip(lower_bound=t0), pl.col("end").clip(upper_bound=t1), pl.col("kind").cast(pl.String)
        )
        .filter(pl.col("end") > pl.col("ts"))
    )
    kept = idle.filter((pl.col("end") - pl.col("ts")).rank("ordinal", descending=True) <= MAX_IDLE_BARS)
    return kept, idle.height


def _ms(ns: pl.Expr | pl.Series, t0: int = 0) -> list[float]:
    return ((ns - t0) / NS_PER_MS).round(3).to_list()


def draw(run: Run, tracks: Tracks, analysis: Analysis, view: View) -> Figure:
    """The view's timeline: event bars per (rank, row), waits and late arrivals per rank."""
    import plotly.graph_objects as go

    in_step = analysis.steps.filter((pl.col("step") == view.step) & pl.col("rank").is_in(view.ranks))
    t0 = int(in_step["start_ns"].min())
    t1 = int((in_step["start_ns"] + in_step["dur_ns"]).max())
    bars, rows = _bars(run, tracks.offsets, view, t0, t1)
    n_all = bars.height
    if n_all > MAX_BARS:
        bars = bars.filter((pl.col("end") - pl.col("ts")).rank("ordinal", descending=True) <= MAX_BARS)
    arr = tracks.arrivals.filter((pl.col("step") == view.step) & pl.col("rank").is_in(view.ranks))
    gpu = rows.filter(~pl.col("host"))["rank"].unique().to_list()  # a CPU rank's "idle" is not a device's
    idle, n_idle = _idle(tracks, replace(view, ranks=tuple(r for r in view.ranks if r in gpu)), t0, t1)
    idle_ranks = set(idle["rank"].to_list())
    order = [
        lbl
        for r in view.ranks
        for lbl in (
            f"rank {r} · collectives",
            *([f"rank {r} · device idle"] if r in idle_ranks else []),
            *rows.filter(pl.col("rank") == r)["row"],
        )
    ]
    short = short_names(bars["name"].unique().to_list())
    fig = go.Figure()
    for kind, (legend, color) in KIND_STYLE.items():
        part = bars.filter(pl.col("kind") == kind)
        if part.height == 0:
            continue
        fig.add_trace(
            go.Bar(
                y=part["row"].to_list(),
                x=_ms(part["end"] - part["ts"]),
                base=_ms(part["ts"], t0),
                orientation="h",
                name=legend,
                legendgroup=legend,
                showlegend=legend not in {t.name for t in fig.data},
                marker={"color": color, "line": {"width": 0}},
                text=[esc(short[n]) for n in part["name"]],
                textposition="none",
                hovertemplate=f"%{{text}}<br>{legend} · %{{x:,.3f}} ms<extra></extra>",
            )
        )
    for kind, (legend, color) in IDLE_STYLE.items():
        part = idle.filter(pl.col("kind") == kind)
        if part.height:
            fig.add_trace(
                go.Bar(
                    y=[f"rank {r} · device idle" for r in part["rank"]],
                    x=_ms(part["end"] - part["ts"]),
                    base=_ms(part["ts"], t0),
                    orientation="h",
                    name=legend,
                    marker={"color": color, "line": {"width": 0}},
                    hovertemplate=f"{legend}: %{{x:,.3f}} ms<extra></extra>",
                )
            )
    waits = arr.filter(pl.col("wait_ns") > 0)
    if waits.height:
        hover = [
            f"rank {r} waits {w / NS_PER_MS:,.3f} ms at {esc(op)} #{seq} for rank {lr}, the last to arrive"
            for r, w, op, seq, lr in zip(waits["rank"], waits["wait_ns"], waits["op"], waits["seq"], waits["late_rank"])
        ]
        fig.add_trace(
            go.Bar(
                y=[f"rank {r} · collectives" for r in waits["rank"]],
                x=_ms(waits["wait_ns"]),
                base=_ms(waits["arrival"], t0),
                orientation="h",
                name="waiting for the last rank",
                marker={"color": COLORS["wait"], "line": {"width": 0}},
                hovertext=hover,
                hoverinfo="text",
            )
        )
    late = arr.filter(pl.col("rank") == pl.col("late_rank"))
    if late.height:
        fig.add_trace(
            go.Scatter(
                y=[f"rank {r} · collectives" for r in late["rank"]],
                x=_ms(late["arrival"], t0),
                mode="markers",
                name="arrives last",
                marker={"symbol": "triangle-down", "size": 11, "color": "#111", "line": {"width": 1, "color": "#fff"}},
                hovertext=[
                    f"rank {r} arrives last at {esc(op)} #{seq}"
                    for r, op, seq in zip(late["rank"], late["op"], late["seq"])
                ],
                hoverinfo="text",
            )
        )
    _layout(fig, height=min(1400, 150 + 20 * len(order)), barmode="overlay", bargap=0.25)
    fig.update_layout(margin={"l": 190, "r": 20, "t": 40, "b": 100}, dragmode="zoom")
    # an explicit range, top row first: autorange would drop empty rows at the ends (a rank waiting nowhere)
    fig.update_yaxes(categoryorder="array", categoryarray=order, fixedrange=True, range=[len(order) - 0.5, -0.5])
    fig.update_xaxes(title=f"ms since the start of step {view.step} (aligned clocks)", range=[0, (t1 - t0) / NS_PER_MS])
    idle_left = n_idle - idle.height
    caption = _caption(view, n_all, bars, rows)
    if idle_left:
        caption += f"; {idle_left:,} of {n_idle:,} device idle gaps left out, the shortest"
    return Figure(fig, caption)


def _caption(view: View, n_all: int, bars: pl.DataFrame, rows: pl.DataFrame) -> str:
    left = ""
    if n_all > bars.height:
        shortest = (bars["end"] - bars["ts"]).min() or 0
        kept = f"those kept ≥ {shortest / 1e3:,.1f} µs"
        left = f"; {n_all - bars.height:,} of {n_all:,} bars left out, the shortest ({kept})"
    return (
        f"step {view.step}: {view.why}; a row per device stream and per host thread and nesting level "
        f"(·2, ·3: operators inside those above; at most {MAX_ROWS_PER_RANK} rows per rank, the busiest)"
        f"{left}; drag to zoom in time, double-click to reset"
    )


def timelines(run: Run, analysis: Analysis, *, step_regex: str | None = None) -> list[tuple[View, Figure]]:
    """Each `views` timeline drawn from `run`'s events."""
    from tracediag.report.perfetto_tracks import derive_tracks

    chosen = views(analysis)
    if not chosen:
        return []
    tracks = derive_tracks(run, analysis, step_regex=step_regex)
    return [(v, draw(run, tracks, analysis, v)) for v in chosen]
