"""The plotly figures of the HTML report, built from an `Analysis` and its typed sections.

Every string from a trace goes through `html.escape` before it reaches a figure: plotly draws labels
as its own small HTML dialect, in which an escaped `&lt;script&gt;` shows as text. Large runs are
aggregated so that no figure grows with ranks × collectives: heat-maps bin ranks beyond `MAX_ROWS`
(and steps beyond `MAX_COLS`), keeping each bin's maximum; bar charts bin ranks beyond `MAX_ROWS`;
the timeline shows at most `MAX_TIMELINE_RANKS` ranks and `MAX_TIMELINE_COLLECTIVES` collectives.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from tracediag.causes import blamed_ranks
from tracediag.units import MS_PER_S, NS_PER_MS, count

if TYPE_CHECKING:
    from collections.abc import Sequence

    import plotly.graph_objects as go

    from tracediag.analysis import Analysis, Pipeline
    from tracediag.check_result import Check

MAX_ROWS = 256
"""Rank rows in a heat-map before ranks are binned: at 900 px a row keeps ≥ 3 px, so one hot rank shows
(plotly samples a row per pixel and drops thinner ones)."""
MAX_COLS = 120
"""Step columns in a heat-map before steps are binned (≥ 4 px each at half the page width)."""
MAX_BARS = 128
"""Rank bars in the breakdown chart before ranks are binned."""
MAX_TIMELINE_RANKS = 32
MAX_TIMELINE_COLLECTIVES = 300
LOG_SPAN = 50
"""The check chart switches to a log axis when its largest value exceeds the smallest by this factor."""
MAX_GROUP_ROWS = 12
"""Collective rows in the timeline, one per group, before groups are merged into one row per op."""
COLORS = {
    "compute": "#4c78a8",
    "exposed comm": "#f58518",
    "idle": "#bab0ac",
    "idle: waiting on host": "#b279a2",
    "idle: between kernels": "#d6a5c9",
    "idle: other": "#bab0ac",
    "copy": "#9ecae9",
    "other": "#e0dcd8",
    "wait": "#e45756",
    "culprit": "#8250df",
    "transfer": "#72b7b2",
    "predicted": "#9d9d9d",
    "observed": "#4c78a8",
}
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13}


def esc(value: Any) -> str:
    """Text from a trace, safe in HTML and in plotly labels."""
    return html.escape(str(value), quote=True)


@dataclass(frozen=True, slots=True)
class Figure:
    """A figure and one line saying what it shows (and what was aggregated)."""

    figure: go.Figure
    caption: str


def _layout(fig: go.Figure, *, height: int, **kw: Any) -> go.Figure:
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 70, "r": 20, "t": 40, "b": 90},
        font=FONT,
        # under the axis, where the toolbar (top right) never covers it, however the legend wraps
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0},
        **kw,
    )
    return fig


def _ms_list(ns: pl.Series, *, digits: int = 2) -> list[float | None]:
    """Nanoseconds as milliseconds, rounded so that the page stays small."""
    return (ns / NS_PER_MS).round(digits).to_list()


def _bin_size(n: int, limit: int) -> int:
    return max(1, math.ceil(n / limit))


def _rank_bins(ranks: list[int], limit: int) -> tuple[int, str]:
    """(ranks per bin, caption fragment) for a rank axis of at most `limit` rows."""
    k = _bin_size(len(ranks), limit)
    return k, "" if k == 1 else f"; ranks in bins of {k} (the bin's maximum shown)"


def _rank_label(first: int, k: int) -> str:
    """A rank axis label: the rank itself, or a bin's range ("8–15"); axes show exactly these labels
    (category axes), never ticks of ranks that are not in the run."""
    return str(first) if k == 1 else f"{first}–{first + k - 1}"


def heatmap(steps: pl.DataFrame, column: str, title: str, *, from_zero: bool = False) -> Figure:
    """Rank × step heat-map of one per-step time, in ms. `from_zero`: colours start at 0 (pale)
    instead of the lowest value drawn."""
    import plotly.graph_objects as go

    ranks = sorted(steps["rank"].unique().to_list())
    step_numbers = sorted(steps["step"].unique().to_list())
    rk, rank_note = _rank_bins(ranks, MAX_ROWS)
    sk = _bin_size(len(step_numbers), MAX_COLS)
    step_pos = pl.DataFrame(
        {"step": step_numbers, "col": range(len(step_numbers))}, schema_overrides={"step": pl.Int32}
    )
    cells = (
        steps.join(step_pos, on="step")
        .group_by(row=pl.col("rank") // rk * rk, col=pl.col("col") // sk)
        .agg(pl.col(column).max())
    )
    ncol = math.ceil(len(step_numbers) / sk)
    least, top = (cells[column].min() or 0) / NS_PER_MS, (cells[column].max() or 0) / NS_PER_MS
    median = (steps[column].median() or 0) / NS_PER_MS
    low = 0.0 if from_zero else least
    grid = (
        cells.with_columns((pl.col(column) / NS_PER_MS).round(2))
        .pivot(on="col", index="row", values=column)
        .sort("row")
    )
    rows = [_rank_label(r, rk) for r in grid["row"].to_list()]
    z = grid.select([str(c) for c in range(ncol)]).rows()
    xlabels = [str(step_numbers[c * sk]) if sk == 1 else f"{step_numbers[c * sk]}+" for c in range(ncol)]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=xlabels,
            y=rows,
            colorscale="YlOrRd",
            zmin=low,
            zmax=max(top, low + 1e-3),
            colorbar={"title": {"text": "ms"}, "thickness": 12},
            hovertemplate=("rank %{y}" if rk == 1 else "ranks %{y}") + "<br>step %{x}<br>%{z:.1f} ms<extra></extra>",
            hoverongaps=False,
        )
    )
    _layout(fig, height=min(900, max(320, 6 * len(rows) + 140)), title={"text": title, "font": {"size": 15}})
    fig.update_layout(margin={"b": 50})  # no legend under it
    fig.update_yaxes(title="rank", type="category", autorange="reversed")
    fig.update_xaxes(title="step", type="category")
    step_note = "" if sk == 1 else f"; steps in bins of {sk}"
    spread = f", {(top - least) / median:.1%} of the median apart" if median else ""
    scale = (
        f"colour from 0 (pale) to the highest, {top:,.1f} ms (dark)"
        if from_zero
        else f"colour from the lowest, {least:,.1f} ms (pale), to the highest, {top:,.1f} ms (dark){spread}"
    )
    shape = f"{count(len(ranks), 'rank')} × {count(len(step_numbers), 'step')}"
    return Figure(fig, f"{shape}{rank_note}{step_note}; {scale}")


def lateness(steps: pl.DataFrame) -> Figure:
    """Rank × step heat-map of each rank's compute excess over the step's median compute (ms, ≥ 0):
    the time the others wait for it at the step's collectives. The pattern names the cause: one hot
    row is one slow worker (compute_straggler), a row hot on every step a heavy pipeline stage
    (stage_imbalance; the median is over all ranks of the step), hot cells scattered over rows and
    steps uneven batches (sequence_imbalance)."""
    excess = (pl.col("compute_ns") - pl.col("compute_ns").median().over("step")).clip(lower_bound=0)
    fig = heatmap(
        steps.with_columns(lateness_ns=excess),
        "lateness_ns",
        "lateness: compute over the step's median (ms)",
        from_zero=True,
    )
    return Figure(
        fig.figure,
        fig.caption + "; one hot row: a slow worker or a heavy stage; scattered cells: uneven batches",
    )


def breakdown(steps: pl.DataFrame) -> Figure:
    """Per-rank stacked bars: mean ms per step in compute, exposed communication, each kind of idle and
    copies alone (the parts add up to the step).

    Beyond `MAX_BARS` ranks, each bar is the rank with the most compute in its bin of neighbours, so a
    straggler still shows.
    """
    import plotly.graph_objects as go

    ranks = sorted(steps["rank"].unique().to_list())
    k = _bin_size(len(ranks), MAX_BARS)
    host, kern = pl.col("idle_host_ns").fill_null(0), pl.col("idle_kernel_ns").fill_null(0)
    parts = {
        "compute": pl.col("compute_ns"),
        "exposed comm": pl.col("exposed_comm_ns"),
        "idle: waiting on host": host,
        "idle: between kernels": kern,
        "idle: other": (pl.col("idle_ns") - host - kern).clip(0),
        "copy": (pl.col("dur_ns") - pl.col("compute_ns") - pl.col("exposed_comm_ns") - pl.col("idle_ns")).clip(0),
    }
    per_rank = steps.group_by("rank").agg(
        *[e.mean().alias(n) for n, e in parts.items()], pl.col("wait_ns").mean().alias("wait")
    )
    bars = (
        per_rank.with_columns(bin=pl.col("rank") // k * k)
        .sort("compute", "rank", descending=[True, False])
        .group_by("bin", maintain_order=True)
        .first()
        .sort("bin")
    )
    fig = go.Figure()
    for name in parts:
        fig.add_trace(
            go.Bar(
                x=[_rank_label(b, k) for b in bars["bin"].to_list()],
                y=_ms_list(bars[name]),
                name=name,
                marker={"color": COLORS[name], "line": {"width": 0}},
                customdata=list(zip(bars["rank"].to_list(), _ms_list(bars["wait"]))),
                hovertemplate=f"rank %{{customdata[0]}}<br>{name}: %{{y:.1f}} ms<br>waiting for peers: "
                "%{customdata[1]:.1f} ms<extra></extra>",
            )
        )
    _layout(fig, height=380, barmode="stack", bargap=0.15 if len(bars) <= 64 else 0.05)
    fig.update_xaxes(title="rank" if k == 1 else f"rank (bins of {k})", type="category")
    fig.update_yaxes(title="ms per step (mean)")
    binned = f"; ranks in bins of {k}, each bar the bin's rank with the most compute" if k > 1 else ""
    return Figure(fig, f"mean over steps per rank{binned}; 'other' = copies and time not otherwise classified")


def _culprits(analysis: Analysis) -> set[int]:
    """Ranks a finding blames (stragglers); job-wide causes name every rank and blame none."""
    return blamed_ranks(analysis.findings)


def _slowest_step(steps: pl.DataFrame) -> int:
    spans = steps.group_by("step").agg(span=(pl.col("start_ns") + pl.col("dur_ns")).max() - pl.col("start_ns").min())
    return int(spans.sort("span", "step", descending=[True, False])["step"][0])


def _timeline_ranks(analysis: Analysis, in_step: pl.DataFrame, colls: pl.DataFrame) -> tuple[list[int], str]:
    """Ranks worth drawing: all of them when few, else culprits, slowest, fastest, last arrivals, rank 0."""
    ranks = sorted(in_step["rank"].to_list())
    if len(ranks) <= MAX_TIMELINE_RANKS:
        return ranks, f"all {count(len(ranks), 'rank')}" if len(ranks) > 1 else f"rank {ranks[0]}"
    by_dur = in_step.sort("dur_ns", "rank")["rank"].to_list()
    culprits = sorted(_culprits(analysis))[:8]
    late = colls.sort("skew_ns", descending=True)["last_rank"].drop_nulls().to_list()
    chosen: dict[int, None] = {}
    for group in (culprits, by_dur[::-1][:10], late[:8], [ranks[0]], by_dur[:6]):
        for r in group:
            if len(chosen) < MAX_TIMELINE_RANKS:
                chosen.setdefault(r, None)
    return sorted(chosen), (
        f"{len(chosen)} of {len(ranks):,} ranks: those named by findings, the slowest and fastest in this step, "
        "the last to arrive at collectives, and rank 0"
    )


def _span_bars(rows: pl.DataFrame, t0: int, name: str, color: str) -> go.Bar:
    import plotly.graph_objects as go

    return go.Bar(
        y=[f"rank {r}" for r in rows["rank"]],
        x=_ms_list(rows["dur_ns"]),
        base=_ms_list(rows["start_ns"] - t0),
        orientation="h",
        name=name,
        marker={"color": color},
        customdata=rows.select(
            (pl.col(c) / NS_PER_MS).round(2) for c in ("compute_ns", "exposed_comm_ns", "wait_ns", "idle_ns")
        ).rows(),
        hovertemplate="%{y}: %{x:.1f} ms<br>compute %{customdata[0]:.1f} ms<br>exposed comm "
        "%{customdata[1]:.1f} ms<br>waiting %{customdata[2]:.1f} ms<br>idle %{customdata[3]:.1f} ms"
        "<extra></extra>",
    )


def _collective_rows(colls: pl.DataFrame) -> list[str]:
    """A row label per collective: its group and op, or only its op when there are many groups."""
    groups = [esc(g) if g else "unnamed group" for g in colls["group"]]
    if len(set(groups)) <= MAX_GROUP_ROWS:
        return [f"{g} · {esc(op)}" for g, op in zip(groups, colls["op"])]
    return [f"{esc(op)}, any group" for op in colls["op"]]


def timeline(analysis: Analysis) -> Figure | None:
    """The slowest step across ranks: each rank's step span, and each collective's wait and transfer."""
    import plotly.graph_objects as go

    steps = analysis.steps
    if steps.height == 0:
        return None
    step = _slowest_step(steps)
    in_step = steps.filter(pl.col("step") == step)
    t0 = in_step["start_ns"].min()
    colls = analysis.collectives.filter(pl.col("step") == step)
    shown, which = _timeline_ranks(analysis, in_step, colls)
    rows = in_step.filter(pl.col("rank").is_in(shown)).sort("rank")
    culprits = _culprits(analysis)
    labels = [f"rank {r}" for r in rows["rank"]]
    fig = go.Figure()
    for name, color, part in (
        ("step span", COLORS["compute"], rows.filter(~pl.col("rank").is_in(list(culprits)))),
        ("step span, rank named by a finding", COLORS["culprit"], rows.filter(pl.col("rank").is_in(list(culprits)))),
    ):
        if part.height:
            fig.add_trace(_span_bars(part, t0, name, color))
    top = colls.sort("skew_ns", descending=True).head(MAX_TIMELINE_COLLECTIVES).sort("first_arrival_ns")
    group_rows = _collective_rows(top)
    if top.height:
        hover = [
            f"{lbl} #{seq}<br>last to arrive: rank {lr}<br>{b / 2**20:,.1f} MiB"
            if b
            else f"{lbl} #{seq}<br>last to arrive: rank {lr}"
            for lbl, seq, lr, b in zip(group_rows, top["seq"], top["last_rank"], top["bytes"])
        ]
        for name, start, end in (
            ("waiting for the last rank", "first_arrival_ns", "last_arrival_ns"),
            ("transfer", "last_arrival_ns", "end_ns"),
        ):
            fig.add_trace(
                go.Bar(
                    y=[f"coll {g}" for g in group_rows],
                    x=_ms_list(top[end] - top[start], digits=3),
                    base=_ms_list(top[start] - t0, digits=3),
                    orientation="h",
                    name=name,
                    marker={"color": COLORS["wait" if name.startswith("wait") else "transfer"]},
                    text=hover,
                    textposition="none",
                    hovertemplate="%{text}<br>" + name + ": %{x:.2f} ms<extra></extra>",
                )
            )
        late = top.filter(pl.col("last_rank").is_in(shown))
        fig.add_trace(
            go.Scatter(
                y=[f"rank {r}" for r in late["last_rank"]],
                x=_ms_list(late["last_arrival_ns"] - t0, digits=3),
                mode="markers",
                name="arrives last at a collective",
                marker={"symbol": "triangle-down", "size": 11, "color": "#111", "line": {"width": 1, "color": "#fff"}},
                hovertemplate="%{y} arrives last at %{x:.1f} ms<extra></extra>",
            )
        )
    order = labels + sorted(set(f"coll {g}" for g in group_rows))
    _layout(fig, height=min(1100, 140 + 22 * len(order)), barmode="overlay")
    fig.update_yaxes(categoryorder="array", categoryarray=order, autorange="reversed")
    fig.update_xaxes(title=f"ms since the start of step {step}")
    dropped = colls.height - top.height
    more = f"; the {MAX_TIMELINE_COLLECTIVES} collectives with the largest skew of {colls.height:,}" if dropped else ""
    return Figure(fig, f"step {step} (the longest); {which}{more}")


def pipeline_idle(pipelines: Sequence[Pipeline]) -> Figure | None:
    """Idle share per pipeline stage against the schedule's ideal bubble (`Analysis.pipelines`).

    Several pipelines (one per data-parallel replica) are summarised per stage: the median share,
    with the lowest and highest as the error bar.
    """
    import plotly.graph_objects as go

    rows = [{"stage": st.stage, "share": st.idle_share} for pipe in pipelines for st in pipe.stages]
    if not rows:
        return None
    per_stage = (
        pl.DataFrame(rows)
        .group_by("stage")
        .agg(mid=pl.col("share").median(), lo=pl.col("share").min(), hi=pl.col("share").max())
        .sort("stage")
    )
    fig = go.Figure(
        go.Bar(
            x=[f"stage {s}" for s in per_stage["stage"]],
            y=per_stage["mid"].to_list(),
            error_y={
                "type": "data",
                "array": (per_stage["hi"] - per_stage["mid"]).to_list(),
                "arrayminus": (per_stage["mid"] - per_stage["lo"]).to_list(),
                "visible": len(pipelines) > 1,
            },
            name="observed idle share",
            marker={"color": COLORS["exposed comm"]},
            hovertemplate="%{x}: %{y:.0%} of the step idle or waiting on send/recv<extra></extra>",
        )
    )
    ideal = float(pl.Series([p.expected_bubble_share for p in pipelines]).median())
    fig.add_hline(y=ideal, line={"dash": "dash", "color": "#333"})
    _layout(fig, height=320, showlegend=False)
    fig.update_yaxes(title="share of the step", tickformat=".0%", rangemode="tozero")
    first = pipelines[0]
    shape = f"p={first.p}, m={first.m}, v={first.v}"
    many = f"median of {len(pipelines):,} pipelines per stage (bar: lowest to highest); " if len(pipelines) > 1 else ""
    return Figure(
        fig,
        f"{many}{shape}; dashed: the schedule's ideal bubble (p−1)/(m+p−1) = {ideal:.0%}; "
        "idle = send/recv waits + idle time",
    )


def check_chart(check: Check) -> Figure:
    """Observed against predicted ms per step, per time component (MFU is in the table)."""
    import plotly.graph_objects as go

    rows = [c for c in check.components if c.unit == "s" and (c.observed or c.predicted)]
    rows = rows[::-1]
    labels = [esc(c.label) for c in rows]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            y=labels,
            x=[MS_PER_S * c.predicted for c in rows],
            orientation="h",
            name="predicted",
            marker={"color": COLORS["predicted"]},
            hovertemplate="%{y}: predicted %{x:.1f} ms<extra></extra>",
        )
    )
    fig.add_trace(
        go.Bar(
            y=labels,
            x=[0.0 if c.observed is None else MS_PER_S * c.observed for c in rows],
            orientation="h",
            name="observed",
            marker={"color": COLORS["observed"]},
            text=["not visible" if c.observed is None else "" for c in rows],
            textposition="outside",
            hovertemplate="%{y}: observed %{x:.1f} ms<extra></extra>",
        )
    )
    _layout(fig, height=120 + 48 * len(rows), barmode="group")
    values = [MS_PER_S * v for c in rows for v in (c.observed, c.predicted) if v]
    log = bool(values) and max(values) > LOG_SPAN * min(values)
    fig.update_xaxes(
        title="ms per step (median)" + (", log scale" if log else ""),
        type="log" if log else "linear",
        dtick=1 if log else None,
    )
    scale = f"; log scale, as the values span more than {LOG_SPAN}×" if log else ""
    return Figure(
        fig, f"median over ranks and steps; a missing observed bar is a component the trace cannot tell{scale}"
    )
