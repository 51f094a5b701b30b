"""Renderings of a `compare.Comparison`: text for a terminal or CI log, one self-contained HTML page."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.kernel_names import short_names
from tracediag.report.figures import esc
from tracediag.units import NS_PER_MS, count, format_ms

if TYPE_CHECKING:
    from tracediag.compare import Comparison


KERNEL_UNIT = (
    "wall ms per step and rank (the union of its spans over the rank's streams and threads, CPU operators "
    "with their children; the unit of the breakdown)"
)


def _causes(side: dict) -> str:
    return ", ".join(f"{c['cause']} ({format_ms(c['time_lost_ns'] / NS_PER_MS)} lost)" for c in side["causes"]) or "-"


def render_compare_text(c: Comparison, *, top: int = 10) -> str:
    """Headline, breakdown deltas (ms per step), kernel deltas, causes on each side."""
    b, n = c.base, c.new
    lines = [
        f"tracediag compare: base {count(len(b['ranks']), 'rank')}, {count(len(b['steps']), 'step')}; "
        f"new {count(len(n['ranks']), 'rank')}, {count(len(n['steps']), 'step')}",
        f"what changed most: {c.headline}",
        "",
        "breakdown (ms per step: the median step, mean over ranks; the parts add up to the step)",
        f"{'part':<28}{'base ms':>10}{'new ms':>10}{'delta ms':>10}{'delta':>8}",
    ]
    for ch in [x for x in c.changes if x["kind"] == "breakdown"]:
        pct = f"{ch['delta_pct']:+.0%}" if ch["delta_pct"] is not None else "-"
        lines.append(
            f"{ch['name']:<28}{ch['base_ns_per_step'] / NS_PER_MS:>10.2f}{ch['new_ns_per_step'] / NS_PER_MS:>10.2f}"
            f"{ch['delta_ns'] / NS_PER_MS:>+10.2f}{pct:>8}"
        )
    kernels = [x for x in c.changes if x["kind"] == "kernel"]
    lines += ["", f"kernels/operators that changed ({len(kernels)} in all, top {top}): {KERNEL_UNIT}"]
    if kernels:
        lines.append(f"{'status':<9}{'base ms':>10}{'new ms':>10}{'delta ms':>10}  {'category':<14}name")
    short = short_names(k["name"] for k in kernels[:top])
    for k in kernels[:top]:
        name = short[k["name"]]
        lines.append(
            f"{k['status']:<9}{k['base_ns_per_step'] / NS_PER_MS:>10.3f}{k['new_ns_per_step'] / NS_PER_MS:>10.3f}"
            f"{k['delta_ns'] / NS_PER_MS:>+10.3f}  {k['category']:<14}{name}"
        )
    lines += ["", f"causes in base: {_causes(b)}", f"causes in new:  {_causes(n)}"]
    return "\n".join(lines)


def compare_tables(c: Comparison) -> str:
    """The comparison's headline, breakdown and kernel tables and causes, as HTML to put in a page
    (no script); every name from a trace is escaped."""
    rows = "".join(
        f"<tr><td>{esc(x['name'])}</td><td class='num'>{x['base_ns_per_step'] / NS_PER_MS:,.2f}</td>"
        f"<td class='num'>{x['new_ns_per_step'] / NS_PER_MS:,.2f}</td>"
        f"<td class='num'>{x['delta_ns'] / NS_PER_MS:+,.2f}</td></tr>"
        for x in c.changes
        if x["kind"] == "breakdown"
    )
    kernels = [x for x in c.changes if x["kind"] == "kernel"]
    short = short_names(x["name"] for x in kernels)
    krows = "".join(
        f"<tr><td>{esc(x['status'])}</td><td class='num'>{x['base_ns_per_step'] / NS_PER_MS:,.3f}</td>"
        f"<td class='num'>{x['new_ns_per_step'] / NS_PER_MS:,.3f}</td>"
        f"<td class='num'>{x['delta_ns'] / NS_PER_MS:+,.3f}</td>"
        f'<td>{esc(x["category"])}</td><td title="{esc(x["name"])}">{esc(short[x["name"]])}</td></tr>'
        for x in kernels
    )
    return (
        f"<p>{esc(c.headline)}</p><h2>Breakdown, ms per step</h2>"
        "<table><tr><th>part</th><th>base</th><th>new</th><th>delta</th></tr>"
        f"{rows}</table><h2>Kernels and operators that changed</h2><p>{esc(KERNEL_UNIT)}; the full name on hover."
        "</p><table><tr><th>status</th>"
        f"<th>base</th><th>new</th><th>delta</th><th>category</th><th>name</th></tr>{krows}</table>"
        f"<h2>Causes</h2><p>base: {esc(_causes(c.base))}</p><p>new: {esc(_causes(c.new))}</p>"
    )


def render_compare_html(c: Comparison, *, title: str = "tracediag compare") -> str:
    """The comparison as one self-contained HTML page: the charts of breakdown and kernel deltas (plotly.js
    packed inline, no network) and the tables; every name from a trace is escaped."""
    from tracediag.report.bundle import loader
    from tracediag.report.compare_figures import breakdown_deltas, kernel_deltas
    from tracediag.report.html import _CSS, _figure

    charts = ((breakdown_deltas(c), "breakdown-deltas"), (kernel_deltas(c), "kernel-deltas"))
    plots = "".join(_figure(f, name) for f, name in charts if f is not None)
    plots = f"<h2>What changed, new against base</h2>{plots}" if plots else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main><h1>{esc(title)}</h1>"
        f'<section id="charts">{plots}</section><section id="tables">{compare_tables(c)}</section></main>'
        f"{loader() if plots else ''}</body></html>"
    )
