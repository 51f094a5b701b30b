"""input_bound: every rank's device idles at step start while its host loads data.

Detector: `detect.input_bound`. What-if: the data loading removed (`whatif.causes.no_input`); with no
loader in the trace, the idle before each step's first work (`whatif.causes.idle_removed`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import input_bound
from tracediag.units import NS_PER_MS
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return input_bound.detect(ctx.facts, thresholds=ctx.thresholds)


def _near(ctx: Context) -> tuple[float, str]:
    th, s = ctx.thresholds, ctx.facts.steps
    share = pl.col("lead_idle_ns") / input_bound.own_time()
    lead = s.with_columns(_share=share).group_by("rank").agg(pl.col("_share").median())["_share"].min()
    return (
        lead / th.input_share,
        f"device idle before each step's first work {lead:.0%} (input_bound from {th.input_share:.0%})",
    )


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    """The loading the trace shows (``input`` pieces: loading with nothing computing); with no loader
    in the trace, the idle before each step's first work, which the detector read as the loading."""
    if f.evidence.get("loader_annotated", True):
        return causes.no_input(graph, f.ranks, f.steps)
    return causes.idle_removed(graph, facts.steps, "lead_idle_ns", f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    on = pl.col("rank").is_in(list(f.ranks)) & pl.col("step").is_in(list(f.steps))
    if f.evidence.get("loader_annotated", True):
        s = graph.segments.filter(on).group_by("rank", "step").agg(pl.col("input_ns").sum())
        ms = float(s["input_ns"].median() or 0) / NS_PER_MS if s.height else 0.0
        return f"without the data loading the device waits for ({ms:,.1f} ms per step)"
    s = facts.steps.filter(on)
    ms = float(s["lead_idle_ns"].median() or 0) / NS_PER_MS if s.height else 0.0
    return (
        f"without the device's idle before each step's first work, read as the unnamed loader ({ms:,.1f} ms per step)"
    )


SPEC = CauseSpec(
    cause=Cause.INPUT_BOUND,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="data loading",
    near=_near,
    explains_idle=True,
)
