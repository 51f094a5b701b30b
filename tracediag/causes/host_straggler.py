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
    return causes.idle_over_peers(graph, facts.steps, f.ranks, f.steps)


def ranks_of(ranks: tuple[int, ...]) -> str:
    """The possessive the what-if sentence opens with: "rank 2's" or "ranks 1, 3'"."""
    return f"{rank_list(ranks)}'s" if len(ranks) == 1 else f"{rank_list(ranks)}'"


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    s = facts.steps.filter(pl.col("step").is_in(list(f.steps)))
    peers = s.filter(~pl.col("rank").is_in(list(f.ranks))).group_by("step").agg(_p=pl.col("idle_ns").median())
    own = s.filter(pl.col("rank").is_in(list(f.ranks))).join(peers, on="step")
    extra = own.select((pl.col("idle_ns") - pl.col("_p")).clip(lower_bound=0).median()).item() if own.height else 0
    return (
        f"with {ranks_of(f.ranks)} host on time (its device's idle cut to its peers' median in those steps: "
        f"{float(extra or 0) / NS_PER_MS:,.1f} ms less per step)"
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
