"""host_bound: the device sits idle waiting on its own host.

Detector: `detect.host_bound` (not when a cause found before it explains the idle). What-if: the
device's idle gaps closed (`whatif.causes.no_idle`).
"""

from __future__ import annotations

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import host_bound
from tracediag.detect.facts import Facts
from tracediag.whatif import causes
from tracediag.whatif.graph import Graph
from tracediag.whatif.price import Pricing


def _detect(ctx: Context) -> list[Finding]:
    return host_bound.detect(ctx.facts, thresholds=ctx.thresholds, explained=ctx.explained_idle())


def _near(ctx: Context) -> tuple[float, str]:
    th = ctx.thresholds
    idle = host_bound.idle_share(ctx.facts.steps) or 0.0
    return idle / th.host_idle_share, f"device idle {idle:.0%} of the step (host_bound from {th.host_idle_share:.0%})"


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    return causes.no_idle(graph, f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    return "with the host's launch gaps closed"


SPEC = CauseSpec(
    cause=Cause.HOST_BOUND,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="device idle",
    near=_near,
)
