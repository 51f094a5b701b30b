"""host_straggler: the rank everyone waits for is late because of its host, not its compute.

Detector: `detect.lateness` (`causes.late`): in the windows before its late arrivals its device sits
idle longer than its peers' (its host busy elsewhere or absent: Python, a sleep, a busy thread, CPU
contention), or named host work fills them (evidence ``reason``: host, gc, sync, checkpoint).
What-if: its lateness removed — its device's idle in its late steps cut to its peers' median idle
(`whatif.causes.idle_over_peers`), not every idle gap closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes import late
from tracediag.causes.spec import CauseSpec, Context
from tracediag.units import NS_PER_MS, rank_list
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return late.of(Cause.HOST_STRAGGLER, ctx)


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    """Its idle cut to its peers' median, and its framework time between operators over its peers' (CPU-only
    ranks: a thread holding the GIL stretches it, `detect.lateness.framework_by_step`, carried in the evidence
    since the kernel table is gone by the pricing) taken out of its compute."""
    idle = causes.idle_over_peers(graph, facts.steps, f.ranks, f.steps)
    framework = _framework(f)
    if not framework.height:
        return idle
    return causes.combine([idle, causes.compute_removed(graph, framework, f.ranks, f.steps)])


def _framework(f: Finding) -> pl.DataFrame:
    """``rank, step, removed_ns``: the finding's framework time per step (evidence ``framework_ms_by_step``, the
    members' mean) and its extra operators' dispatch (``small_ops_ms_by_step``) on each of its ranks."""
    per: dict[str, float] = {}
    for key in ("framework_ms_by_step", "small_ops_ms_by_step"):  # both host time inside its compute
        for k, v in (f.evidence.get(key) or {}).items():
            per[k] = per.get(k, 0.0) + v
    rows = [(r, int(k), v * NS_PER_MS) for k, v in per.items() for r in f.ranks]
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int32, "removed_ns": pl.Float64}, orient="row")


def ranks_of(ranks: tuple[int, ...]) -> str:
    """The possessive the what-if sentence opens with: "rank 2's" or "ranks 1, 3'"."""
    return f"{rank_list(ranks)}'s" if len(ranks) == 1 else f"{rank_list(ranks)}'"


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    s = facts.steps.filter(pl.col("step").is_in(list(f.steps)))
    peers = s.filter(~pl.col("rank").is_in(list(f.ranks))).group_by("step").agg(_p=pl.col("idle_ns").median())
    own = s.filter(pl.col("rank").is_in(list(f.ranks))).join(peers, on="step")
    extra = own.select((pl.col("idle_ns") - pl.col("_p")).clip(lower_bound=0).median()).item() if own.height else 0
    framework = _framework(f)["removed_ns"].median() or 0.0
    also = f", and {framework / NS_PER_MS:,.1f} ms of framework time between its operators" if framework else ""
    return (
        f"with {ranks_of(f.ranks)} host on time (its device's idle cut to its peers' median in those steps: "
        f"{float(extra or 0) / NS_PER_MS:,.1f} ms less per step{also})"
    )


def _outliers(f: Finding) -> tuple[int, ...]:
    return f.ranks


SPEC = CauseSpec(
    cause=Cause.HOST_STRAGGLER,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="lateness at the collectives",
    explains_idle=True,
    outliers=_outliers,
    blames_ranks=True,
)
