"""The kernel view as text: per rank, compute / communication / memory totals and the top N."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.kernel_names import short_names
from tracediag.units import NS_PER_MS, format_ms

if TYPE_CHECKING:
    from tracediag.analysis import Analysis

CAPTION = (
    "wall = the union of its spans over the rank's streams and threads (CPU operators with their children), "
    "share = wall / the rank's summed step time; summed = durations added up, concurrent ones each counted "
    "(CPU operators: self time)"
)
"""What the columns mean, in the text and the HTML kernel view."""


def render_kernels(analysis: Analysis, top: int) -> str:
    """`--kernels N`: per rank the category split, then the N kernels/operators with the most time.

    Names are shortened (`kernel_names.short_names`); the JSON keeps them whole."""
    if analysis.kernels is None or not analysis.kernels.height:
        return "kernels: none recorded in the analysed steps"
    rows = analysis.kernels.to_dicts()
    cats = analysis.kernel_categories.to_dicts() if analysis.kernel_categories is not None else []
    lines = [f"top {top} kernels/operators per rank by summed time over the analysed steps (ms; {CAPTION})"]
    for rank in sorted({r["rank"] for r in rows}):
        split = ", ".join(
            f"{c['category']} {format_ms((c['wall_ns'] or 0) / NS_PER_MS)} wall ({c['share']:.0%}), "
            f"{format_ms(c['total_ns'] / NS_PER_MS)} summed"
            for c in cats
            if c["rank"] == rank
        )
        lines.append(f"rank {rank}: {split}")
        lines.append(f"{'summed ms':>10}{'wall ms':>10}{'share':>7}{'count':>7}{'mean ms':>10}  {'category':<14}name")
        mine = [r for r in rows if r["rank"] == rank][:top]
        short = short_names(r["name"] for r in mine)
        for r in mine:
            lines.append(
                f"{r['total_ns'] / NS_PER_MS:>10,.2f}{(r['wall_ns'] or 0) / NS_PER_MS:>10,.2f}{r['share']:>7.1%}"
                f"{r['count']:>7}{r['mean_ns'] / NS_PER_MS:>10.3f}  {r['category']:<14}{short[r['name']]}"
            )
    return "\n".join(lines)
