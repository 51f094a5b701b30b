"""The kernel view as an HTML section: per rank, the category split and the top kernels/operators."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.report.figures import esc
from tracediag.units import NS_PER_MS, format_ms

if TYPE_CHECKING:
    from tracediag.analysis import Analysis

TOP_HTML = 15
"""Rows per rank in the report (the JSON keeps more)."""


def kernels_section(analysis: Analysis, top: int = TOP_HTML) -> str:
    """A ``<section id="kernels">`` or "" when the analysis has no kernel view. Names are escaped."""
    if analysis.kernels is None or not analysis.kernels.height:
        return ""
    rows = analysis.kernels.to_dicts()
    cats = analysis.kernel_categories.to_dicts() if analysis.kernel_categories is not None else []
    parts = [
        '<section id="kernels"><h2>Top kernels and operators per rank</h2><p class="caption">Total time over '
        "the analysed steps; share of the rank's summed step time; CPU operators: self time.</p>"
    ]
    for rank in sorted({int(r["rank"]) for r in rows}):
        split = " · ".join(
            f"{esc(c['category'])} {format_ms(c['total_ns'] / NS_PER_MS)} ({c['share']:.0%})"
            for c in cats
            if c["rank"] == rank
        )
        body = "".join(
            f"<tr><td class='num'>{r['total_ns'] / NS_PER_MS:,.2f}</td><td class='num'>{r['share']:.1%}</td>"
            f"<td class='num'>{int(r['count']):,}</td><td class='num'>{r['mean_ns'] / NS_PER_MS:,.3f}</td>"
            f"<td>{esc(r['category'])}</td><td>{esc(r['name'])}</td></tr>"
            for r in [r for r in rows if int(r["rank"]) == rank][:top]
        )
        parts.append(
            f"<h3>rank {rank}</h3><p class='meta'>{split}</p><table><tr><th>total ms</th><th>share</th>"
            f"<th>count</th><th>mean ms</th><th>category</th><th>name</th></tr>{body}</table>"
        )
    return "".join(parts) + "</section>"
