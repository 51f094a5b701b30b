"""The terminal rendering of the observed-vs-predicted check (`Analysis.check`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.units import MS_PER_S, count, format_ms

if TYPE_CHECKING:
    from tracediag.check_result import Check


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "fraction":
        return f"{100 * v:.1f}%" if v <= 1 else "> 100%?"
    return format_ms(MS_PER_S * v, small=True)


def render_check_text(check: Check) -> str:
    """A block printed after the analysis text: the sentence, one line per component, bus bandwidths."""
    plan = check.plan
    split = " ".join(f"{k}={v}" for k, v in plan.split)
    lines = [
        f"observed vs predicted ({plan.model} on {plan.gpus} x {plan.device}, {split})",
        f"   {check.sentence}",
        *(f"   note: {n}" for n in check.notes),
        f"   {'component':<36}{'observed':>12}{'predicted':>12}{'ratio':>9}",
    ]
    for c in check.components:
        ratio = "-" if c.ratio is None else f"{c.ratio:.2f}x"
        lines.append(
            f"   {c.label:<36}{_value(c.observed, c.unit):>12}{_value(c.predicted, c.unit):>12}"
            f"{ratio:>9}  {c.note}".rstrip()
        )
    if check.links:
        lines.append("   bus bandwidth (GB/s): achieved vs the link's figure")
    for li in check.links:
        figure = "-" if li.link_busbw_gbps is None else f"{li.link_busbw_gbps:,.0f} ({li.link})"
        ratio = "" if li.ratio is None else f" = {li.ratio:.2f}x"
        lines.append(
            f"   {li.kind or '?'} {li.op}: {li.busbw_gbps:,.2f} vs {figure}{ratio}; "
            f"{count(li.collectives, 'collective')}; kind from {li.kind_from}"
        )
    return "\n".join(lines)
