"""The kernel view as an HTML section: per rank, the category split and the top kernels/operators."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.kernel_names import short_names
from tracediag.report.figures import esc
from tracediag.report.kernels_text import CAPTION
from tracediag.units import NS_PER_MS, format_ms

if TYPE_CHECKING:
    from tracediag.analysis import Analysis

TOP_HTML = 15
"""Rows per rank in the report (the JSON keeps more)."""


def kernels_section(analysis: Analysis, top: int = TOP_HTML) -> str:
    """A ``<section id="kernels">`` or "" when the analysis has no kernel view. Names are escaped,
    shortened (`kernel_names.short_names`), the full name on hover."""
    if analysis.kernels is None or not analysis.kernels.height:
        return ""
    rows = analysis.kernels.to_dicts()
    cats = analysis.kernel_categories.to_dicts() if analysis.kernel_categories is not None else []
    parts = [
        '<section id="kernels"><h2>Top kernels and operators per rank</h2><p class="caption">By summed time over '
        f"the analysed steps; {esc(CAPTION)}; the full name on hover.</p>"
    ]
    for rank in sorted({int(r["rank"]) for r in rows}):
        split = " · ".join(
            f"{esc(c['category'])} {format_ms((c['wall_ns'] or 0) / NS_PER_MS)} wall ({c['share']:.0%}), "
            f"{format_ms(c['total_ns'] / NS_PER_MS)} summed"
            for c in cats
            if c["rank"] == rank
        )
        mine = [r for r in rows if int(r["rank"]) == rank][:top]
        short = short_names(r["name"] for r in mine)
        body = "".join(
            f"<tr><td class='num'>{r['total_ns'] / NS_PER_MS:,.2f}</td>"
            f"<td class='num'>{(r['wall_ns'] or 0) / NS_PER_MS:,.2f}</td><td class='num'>{r['share']:.1%}</td>"
            f"<td class='num'>{int(r['count']):,}</td><td class='num'>{r['mean_ns'] / NS_PER_MS:,.3f}</td>"
            f'<td>{esc(r["category"])}</td><td title="{esc(r["name"])}">{esc(short[r["name"]])}</td></tr>'
            for r in mine
        )
        parts.append(
            f"<h3>rank {rank}</h3><p class='meta'>{split}</p><table><tr><th>summed ms</th><th>wall ms</th>"
            f"<th>share</th><th>count</th><th>mean ms</th><th>category</th><th>name</th></tr>{body}</table>"
        )
    return "".join(parts) + "</section>"
