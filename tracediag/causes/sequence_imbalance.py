"""sequence_imbalance: the slowest data-parallel rank changes from step to step, with its batch.

Detector: `detect.sequence_imbalance` (not while a persistent straggler sets the pace). What-if:
balanced batches, every rank's compute in the step set to the step's mean (`whatif.causes.balance`).
Single slow steps of the ranks that drew the big batches (transient compute_straggler findings on its
steps) are its effect and are absorbed. When the slowest rank-steps run more operators than their peers
(extra work moving between ranks, not longer batches) the detector returns a transient compute_straggler
per rank instead (`detect.sequence_imbalance.moving_stragglers`). Its ranks set the pace, so comm_bound
does not hold (the peers' exposed communication is the wait for them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import sequence_imbalance, straggler
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    if not ctx.facts.steps.height or ctx.outlier_ranks():
        return []
    ratios = ctx.memo(straggler.rank_step_ratios)
    return sequence_imbalance.detect(ctx.facts, thresholds=ctx.thresholds, ratios=ratios)


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit | None:
    if not causes.has_ops(graph, f.ranks, "collective"):
        return None
    return causes.balance(graph, facts.steps, f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    return "with balanced batches (every rank computing the step's mean)"


def _absorbs(own: Finding, other: Finding) -> bool:
    """A transient straggler on its steps is its effect; of a moving straggler's finding (a
    compute_straggler), only the same rank's."""
    return (
        other.cause == Cause.COMPUTE_STRAGGLER
        and other.evidence.get("kind") == "transient"
        and set(other.steps) <= set(own.steps)
        and (own.cause == Cause.SEQUENCE_IMBALANCE or other.ranks == own.ranks)
    )


SPEC = CauseSpec(
    cause=Cause.SEQUENCE_IMBALANCE,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="the per-step slowest rank's excess",
    outliers=lambda f: f.ranks,
    absorbs=_absorbs,
)
