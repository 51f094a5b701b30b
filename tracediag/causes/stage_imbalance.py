"""stage_imbalance: one pipeline stage computes more per micro-batch than the others, which wait for it.

Detector: `detect.stage_imbalance`. What-if: every stage's compute set to the step's mean stage
compute (`whatif.causes.balance`). Its pipeline's bubble is its effect: a pipeline_bubble finding of
the same pipeline, and a compute_straggler finding of its stages, are absorbed (not reported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import stage_imbalance
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return stage_imbalance.detect(ctx.facts, thresholds=ctx.thresholds)


def _stages(f: Finding) -> tuple[int, ...]:
    return tuple(f.evidence["stage_ranks"])


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit | None:
    """None when the send/recv could not be paired: the replay would run the stages as independent."""
    if not causes.has_ops(graph, _stages(f), "p2p"):
        return None
    return causes.balance(graph, facts.steps, _stages(f), f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    mean = f.evidence.get("mean_stage_compute_ms_per_microbatch")
    at = f" ({mean:,.1f} ms per micro-batch)" if mean else ""
    return f"with every stage at the mean stage compute{at}"


def _absorbs(own: Finding, other: Finding) -> bool:
    """The bubble of its pipeline, and a stage of it computing longer than the rest, are its effect."""
    stages = set(_stages(own))
    if other.cause == Cause.PIPELINE_BUBBLE:
        return bool(stages & set(other.ranks))
    return other.cause == Cause.COMPUTE_STRAGGLER and set(other.ranks) <= stages


SPEC = CauseSpec(
    cause=Cause.STAGE_IMBALANCE,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="pipeline stage compute",
    explains_idle=True,
    absorbs=_absorbs,
    blames_ranks=True,
)
