"""comm_bound: communication that no compute hides takes a large share of every rank's step.

Detector: `detect.comm_bound` (the waiting the outliers found before cause taken out). What-if: every
collective's transfer at the link's bus bandwidth (`whatif.causes.comm`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes.spec import CauseSpec, Context
from tracediag.detect import comm_bound
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return comm_bound.detect(ctx.facts, thresholds=ctx.thresholds, straggler_ranks=ctx.outlier_ranks())


def _near(ctx: Context) -> tuple[float, str]:
    th, s = ctx.thresholds, ctx.facts.steps
    share = (pl.col("exposed_comm_ns") - pl.col("exposed_p2p_ns")) / pl.col("dur_ns").clip(1)
    comm = s.group_by("rank").agg(share.median())["exposed_comm_ns"].median()
    return comm / th.comm_share, f"exposed communication {comm:.0%} of the step (comm_bound from {th.comm_share:.0%})"


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit | None:
    if not causes.has_ops(graph, f.ranks, "collective"):
        return None
    return causes.comm(graph, facts.collectives, facts.link_gbps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    sized = graph.ops.filter(pl.col("kind") == "collective", pl.col("bytes").fill_null(0) > 0).height > 0
    if not sized:
        return "with every collective as fast as in its fastest step (the trace has no message sizes)"
    bw = facts.link_gbps
    link = f"the link's {bw:g} GB/s" if bw else "the best bus bandwidth the run reached"
    return f"with communication at {link}"


SPEC = CauseSpec(
    cause=Cause.COMM_BOUND,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="exposed communication",
    near=_near,
)
