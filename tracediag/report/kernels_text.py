"""The kernel view as text: per rank, compute / communication / memory totals and the top N."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.units import NS_PER_MS, format_ms

if TYPE_CHECKING:
    from tracediag.analysis import Analysis


def render_kernels(analysis: Analysis, top: int) -> str:
    """`--kernels N`: per rank the category split, then the N kernels/operators with the most time."""
    if analysis.kernels is None or not analysis.kernels.height:
        return "kernels: none recorded in the analysed steps"
    rows = analysis.kernels.to_dicts()
    cats = analysis.kernel_categories.to_dicts() if analysis.kernel_categories is not None else []
    lines = [
        f"top {top} kernels/operators per rank by total time over the analysed steps "
        "(ms; share = of the rank's summed step time; CPU operators: self time, threads add up)"
    ]
    for rank in sorted({r["rank"] for r in rows}):
        split = ", ".join(
            f"{c['category']} {format_ms(c['total_ns'] / NS_PER_MS)} ({c['share']:.0%})"
            for c in cats
            if c["rank"] == rank
        )
        lines.append(f"rank {rank}: {split}")
        lines.append(f"{'total ms':>10}{'share':>7}{'count':>7}{'mean ms':>10}  {'category':<14}name")
        for r in [r for r in rows if r["rank"] == rank][:top]:
            name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
            lines.append(
                f"{r['total_ns'] / NS_PER_MS:>10,.2f}{r['share']:>7.1%}{r['count']:>7}"
                f"{r['mean_ns'] / NS_PER_MS:>10.3f}  "
                f"{r['category']:<14}{name}"
            )
    return "\n".join(lines)
