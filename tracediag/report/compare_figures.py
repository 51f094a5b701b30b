"""The compare page's charts: breakdown deltas (ms per step, per part) and the kernels that changed most."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.kernel_names import short_names
from tracediag.report.figures import COLORS, Figure, _layout, esc
from tracediag.units import NS_PER_MS

if TYPE_CHECKING:
    from tracediag.compare import Comparison

MAX_KERNELS = 20
"""Kernel bars in the chart (the largest changes; the table lists them all)."""
STATUS_COLORS = {"slower": COLORS["wait"], "added": "#f58518", "faster": "#54a24b", "removed": "#72b7b2"}
_HOVER_CHARS = 200
LABEL_CHARS = 48
"""A kernel's axis label: its short name's last characters (where template arguments tell kernels apart)."""


def _labels(names: list[str]) -> dict[str, str]:
    """Axis labels cut to `LABEL_CHARS` from the end, unless cutting makes two the same."""
    cut = {n: n if len(n) <= LABEL_CHARS else "…" + n[-(LABEL_CHARS - 1) :] for n in names}
    return cut if len(set(cut.values())) == len(set(names)) else {n: n for n in names}


def breakdown_deltas(c: Comparison) -> Figure | None:
    """Per part of the step: new − base, ms per step (the parts add up to the step's delta)."""
    import plotly.graph_objects as go

    rows = [x for x in c.changes if x["kind"] == "breakdown"][::-1]
    if not rows:
        return None
    delta = [round(x["delta_ns"] / NS_PER_MS, 3) for x in rows]
    fig = go.Figure(
        go.Bar(
            y=[esc(x["name"]) for x in rows],
            x=delta,
            orientation="h",
            marker={"color": [COLORS["wait"] if d > 0 else "#54a24b" for d in delta]},
            customdata=[(x["base_ns_per_step"] / NS_PER_MS, x["new_ns_per_step"] / NS_PER_MS) for x in rows],
            hovertemplate="%{y}: %{x:+,.2f} ms per step<br>base %{customdata[0]:,.2f} ms, new "
            "%{customdata[1]:,.2f} ms<extra></extra>",
        )
    )
    _layout(fig, height=120 + 30 * len(rows), showlegend=False)
    fig.update_layout(margin={"l": 200, "b": 50})
    fig.update_xaxes(title="new − base, ms per step", zeroline=True, zerolinecolor="#333")
    return Figure(fig, "the median step, mean over ranks; red: more time in new, green: less")


def kernel_deltas(c: Comparison) -> Figure | None:
    """The kernels and operators that changed most: new − base, wall ms per step and rank, by status."""
    import plotly.graph_objects as go

    kernels = [x for x in c.changes if x["kind"] == "kernel"]
    if not kernels:
        return None
    top = kernels[:MAX_KERNELS][::-1]
    short = short_names(x["name"] for x in kernels)
    label = _labels([short[x["name"]] for x in top])
    fig = go.Figure()
    for status, color in STATUS_COLORS.items():
        part = [x for x in top if x["status"] == status]
        if not part:
            continue
        fig.add_trace(
            go.Bar(
                y=[esc(label[short[x["name"]]]) for x in part],
                x=[round(x["delta_ns"] / NS_PER_MS, 3) for x in part],
                orientation="h",
                name=status,
                marker={"color": color},
                text=[esc(x["name"][:_HOVER_CHARS]) for x in part],
                textposition="none",
                hovertemplate="%{text}<br>%{x:+,.3f} ms per step<extra></extra>",
            )
        )
    order = [esc(label[short[x["name"]]]) for x in top]
    _layout(fig, height=160 + 24 * len(top))
    fig.update_layout(margin={"l": 380})
    fig.update_yaxes(categoryorder="array", categoryarray=order)
    fig.update_xaxes(title="new − base, wall ms per step and rank", zeroline=True, zerolinecolor="#333")
    more = (
        f"; the {MAX_KERNELS} largest of {len(kernels):,} changes (all in the table)"
        if len(kernels) > MAX_KERNELS
        else ""
    )
    return Figure(fig, f"kernels and operators by the change in their time{more}; the full name on hover")
