"""host_bound: the device sits idle waiting on its own host.

Detector: `detect.host_bound` (not when a cause found before it explains the idle). What-if: only the
device's waits on its host removed (``idle_host_ns`` per step, `whatif.causes.idle_removed`); on
CPU-only ranks there are none (the host is the device), so the what-if finds nothing measurable there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import host_bound
from tracediag.units import NS_PER_MS
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return host_bound.detect(ctx.facts, thresholds=ctx.thresholds, explained=ctx.explained_idle())


def _near(ctx: Context) -> tuple[float, str]:
    th = ctx.thresholds
    idle = host_bound.idle_share(ctx.facts.steps) or 0.0
    return idle / th.host_idle_share, f"device idle {idle:.0%} of the step (host_bound from {th.host_idle_share:.0%})"


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    """Only the device's waits on its host (``idle_host_ns``: nothing queued until the launch
    returns); idle with work queued but held (events, syncs, another device) stays."""
    return causes.idle_removed(graph, facts.steps, "idle_host_ns", f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    s = facts.steps.filter(pl.col("rank").is_in(list(f.ranks)), pl.col("step").is_in(list(f.steps)))
    host = float(s["idle_host_ns"].median() or 0) / NS_PER_MS if s.height else 0.0
    idle = float(s["idle_ns"].median() or 0) / NS_PER_MS if s.height else 0.0
    return f"without the device's waits on its host ({host:,.1f} of its {idle:,.1f} ms idle per step)"


SPEC = CauseSpec(
    cause=Cause.HOST_BOUND,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="device idle",
    near=_near,
)
