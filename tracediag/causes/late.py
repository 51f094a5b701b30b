"""The lateness pass shared by the causes that name a rank everyone waits for.

`plan` runs once per detection pass: the compute stragglers (`detect.straggler`), who everyone waits
for at the collectives (`detect.lateness.assess`) and why (`detect.lateness.detect`, which adds a
compute_straggler for a waited-for rank that computes longer and none names yet, or replaces one by
host_straggler / input_straggler when the rank's windows show host work or loading instead). Each
cause's detector takes its own findings from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.detect import lateness, straggler

if TYPE_CHECKING:
    from tracediag.analysis import Cause, Finding
    from tracediag.causes.spec import Context


def plan(ctx: Context) -> list[Finding]:
    """The findings of the lateness causes (compute, host, input stragglers), derived once per pass."""
    key = plan
    if key not in ctx._memo:
        ratios = ctx.memo(straggler.rank_step_ratios) if ctx.facts.steps.height else None
        found = straggler.detect(ctx.facts, thresholds=ctx.thresholds, ratios=ratios)
        late = lateness.assess(ctx.facts, ctx.thresholds)
        ctx._memo[key] = lateness.detect(ctx.facts, late, ctx.thresholds, found)
    return ctx._memo[key]


def of(cause: Cause, ctx: Context) -> list[Finding]:
    """The pass's findings of `cause`."""
    return [f for f in plan(ctx) if f.cause == cause]
