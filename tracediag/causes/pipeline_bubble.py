"""pipeline_bubble: pipeline stages idle waiting on each other beyond the schedule's own bubble.

Detector: `detect.pipeline`. What-if: stages balanced, idle closed and send/recv free
(`whatif.causes.pipeline`), projected to more micro-batches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import pipeline
from tracediag.detect.pipeline import bubble_formula
from tracediag.units import NS_PER_MS
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph

PROJECTED_MICROBATCHES = (2, 4, 8)
"""A pipeline's step is also projected at these multiples of its micro-batches."""


def _detect(ctx: Context) -> list[Finding]:
    return pipeline.detect(ctx.facts, thresholds=ctx.thresholds)


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit | None:
    """None when the send/recv could not be paired (no peers, no schedule annotations): the replay
    would run the stages as independent."""
    if not causes.has_ops(graph, f.ranks, "p2p"):
        return None
    return causes.pipeline(graph, facts.steps, f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    p, m = f.evidence.get("p"), f.evidence.get("m")
    ideal = f" ({bubble_formula(p, m):.0%} for p={p}, m={m})" if p and m else ""
    return f"with balanced stages and free transfers, only the schedule's own bubble left{ideal},"


def _project(f: Finding, edited_ns: float) -> tuple[dict[str, int], str]:
    """The ideal step at more micro-batches (it scales as (m+p−1)/m), and "; with 4 micro-batches
    (4x) about 310 ms"."""
    p, m = f.evidence.get("p"), f.evidence.get("m")
    if not p or not m:
        return {}, ""
    now = (m + p - 1) / m
    proj = {str(k * m): round(edited_ns * ((k * m + p - 1) / (k * m)) / now) for k in PROJECTED_MICROBATCHES}
    tail = (
        f"; with {4 * m} micro-batches (4x) about {proj[str(4 * m)] / NS_PER_MS:,.0f} ms" if str(4 * m) in proj else ""
    )
    return proj, tail


SPEC = CauseSpec(
    cause=Cause.PIPELINE_BUBBLE,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed, project=_project),
    quiet="pipeline idle",
    explains_idle=True,
)
