"""input_straggler: the rank everyone waits for is late because it loads data longer than its peers.

Detector: `detect.lateness` (`causes.late`): data loading fills the windows before its late
arrivals. What-if: its lateness removed — its data loading in its late steps scaled to its peers'
median loading (`whatif.causes.input_to_peers`), the loading every rank does kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from tracediag.analysis import Cause, Finding
from tracediag.causes import late
from tracediag.causes.host_straggler import ranks_of
from tracediag.causes.spec import CauseSpec, Context
from tracediag.units import NS_PER_MS
from tracediag.whatif import causes
from tracediag.whatif.price import Pricing

if TYPE_CHECKING:
    from tracediag.detect.facts import Facts
    from tracediag.whatif.graph import Graph


def _detect(ctx: Context) -> list[Finding]:
    return late.of(Cause.INPUT_STRAGGLER, ctx)


def _edit(f: Finding, facts: Facts, graph: Graph) -> causes.Edit:
    return causes.input_to_peers(graph, facts.steps, f.ranks, f.steps)


def _removed(f: Finding, facts: Facts, graph: Graph) -> str:
    s = facts.steps.filter(pl.col("step").is_in(list(f.steps)))
    peers = s.filter(~pl.col("rank").is_in(list(f.ranks))).group_by("step").agg(_p=pl.col("input_ns").median())
    own = s.filter(pl.col("rank").is_in(list(f.ranks))).join(peers, on="step")
    extra = own.select((pl.col("input_ns") - pl.col("_p")).clip(lower_bound=0).median()).item() if own.height else 0
    ms = float(extra or 0) / NS_PER_MS
    return f"without {ranks_of(f.ranks)} extra data loading ({ms:,.1f} ms per step over its peers')"


def _outliers(f: Finding) -> tuple[int, ...]:
    return f.ranks


SPEC = CauseSpec(
    cause=Cause.INPUT_STRAGGLER,
    detect=_detect,
    pricing=Pricing(edit=_edit, removed=_removed),
    quiet="",  # host_straggler's phrase covers both
    outliers=_outliers,
    blames_ranks=True,
)
